#!/usr/bin/env bash
# Trains the same model twice on an emulated cluster (2 hosts x 2 ranks,
# scripts/emulate-cluster.sh), once with dense allreduce and once with
# hierarchical top-k (HiTopKComm), and prints a markdown table: final test
# accuracy, time to a target accuracy, total wall time, communication share.
# docs/training.md ("Sparse gradients on an emulated cluster") has results.
set -uo pipefail

me=train-emulated
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  cat <<'EOF'
usage: scripts/train-emulated.sh --build DIR [options] [-- TIDE_TRAIN_ARGS...]

Runs tide-train on 2 emulated hosts x 2 ranks (scripts/emulate-cluster.sh):
first --grad dense, then --grad hitopk:RHO, with the same model, epochs,
batch, learning rate and seed, and prints a markdown table of the two runs.
Needs root (network namespaces); exits 77 with the reason when the hosts
cannot be made.

  --build DIR               tide build directory (required; e.g. build)
  --bandwidth RATE          each host's uplink (default 1gbit)
  --latency TIME            one-way delay between the hosts (default 0.5ms)
  --model NAME              mlp or cnn (default mlp)
  --epochs N                (default 5)
  --batch B                 batch per worker (default 64)
  --optim NAME              tide-train's optimizer (default nesterov)
  --lr X                    (default 0.1)
  --seed N                  (default 1)
  --density RHO             hitopk density (default 0.01)
  --sparse-warmup-epochs N  hitopk's density warm-up (default 1, tide-train's:
                            epoch 1 sends RHO^(1/2), 10% for RHO = 1%; 0 sends
                            RHO from the first step)
  --eval-every N            test evaluation every N steps (default 20)
  --target X                target test accuracy, a fraction (default 0.85)
  --repeat R                run the pair R times, alternating (default 1);
                            the table then adds each mode's median
  --runs DIR                where the run folders go (default runs); each run
                            is DIR/emu-MODE[-rI]/, its output DIR/emu-MODE[-rI].log
  --table-only              train nothing: print the table of the runs already
                            in --runs (same --repeat)
  -h, --help                this help

Arguments after -- go to both tide-train runs (e.g. -- --selector exact).
Every rank runs with --threads 1: the emulated hosts share this machine's cores.
EOF
}

die_usage() { echo "$me: $*" >&2; echo "run '$0 --help' for the options" >&2; exit 2; }
log() { echo "$me: $*" >&2; }

build="" bandwidth=1gbit latency=0.5ms model=mlp epochs=5 batch=64 optim=nesterov lr=0.1 seed=1 density=0.01
sparse_warmup=1 eval_every=20 target=0.85 repeat=1 runs=runs table_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --build|--bandwidth|--latency|--model|--epochs|--batch|--optim|--lr|--seed|--density|--sparse-warmup-epochs|\
    --eval-every|--target|--repeat|--runs)
      [ $# -ge 2 ] || die_usage "$1 needs a value"
      case $1 in
        --build) build=$2 ;; --bandwidth) bandwidth=$2 ;; --latency) latency=$2 ;; --model) model=$2 ;;
        --epochs) epochs=$2 ;; --batch) batch=$2 ;; --optim) optim=$2 ;; --lr) lr=$2 ;; --seed) seed=$2 ;;
        --density) density=$2 ;; --sparse-warmup-epochs) sparse_warmup=$2 ;; --eval-every) eval_every=$2 ;;
        --target) target=$2 ;; --repeat) repeat=$2 ;; --runs) runs=$2 ;;
      esac
      shift 2 ;;
    --table-only) table_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die_usage "unknown option $1" ;;
  esac
done
extra=("$@")

[ -n "$build" ] || die_usage "--build DIR is required: the tide build directory (e.g. --build build)"
[ -x "$build/tools/tide-train" ] && [ -x "$build/tools/tiderun" ] ||
  die_usage "--build $build: no $build/tools/tide-train or tiderun (build tide first: cmake --build $build)"
build=$(cd "$build" && pwd)
[[ $repeat =~ ^[1-9][0-9]*$ ]] || die_usage "--repeat $repeat: give a whole number >= 1"
[[ $eval_every =~ ^[0-9]+$ ]] || die_usage "--eval-every $eval_every: give a whole number >= 0"
awk -v t="$target" 'BEGIN { exit !(t ~ /^[0-9.]+$/ && t > 0 && t <= 1) }' ||
  die_usage "--target $target: give a fraction in (0, 1], e.g. 0.85"
# tide-train checks the rest (and names the option) before any training.

# Network namespaces need root: say so before anything else.
if [ "$table_only" = 0 ] && [ "$(id -u)" != 0 ]; then
  log "cannot emulate hosts: making network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN);" \
    "this is uid $(id -u). Run as root."
  exit 77
fi
mkdir -p "$runs" || { log "cannot create $runs"; exit 1; }
runs=$(cd "$runs" && pwd)

# summary_field FILE KEY: the value of "KEY" in a one-line JSON file.
summary_field() { sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" "$1"; }

# On SIGINT or SIGTERM, the running emulate-cluster.sh gets SIGTERM: it stops
# the job and removes its namespaces before this script exits.
child=""
stop() {
  log "$1: stopping the run"
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; fi
  exit "$2"
}
trap 'stop "interrupted (SIGINT)" 130' INT
trap 'stop "terminated (SIGTERM)" 143' TERM

# train MODE GRAD NAME ARGS...: one emulated run; its output goes to NAME.log.
train() {
  local mode=$1 grad=$2 name=$3 rc
  shift 3
  log "$mode: $name (log: $runs/$name.log)"
  rm -rf "${runs:?}/$name"
  "$here/emulate-cluster.sh" --hosts 2 --ranks-per-host 2 --bandwidth "$bandwidth" --latency "$latency" \
    --build "$build" -- "$build/tools/tide-train" --model "$model" --epochs "$epochs" --batch "$batch" \
    --optim "$optim" --lr "$lr" --seed "$seed" --threads 1 --grad "$grad" --eval-every "$eval_every" \
    --target-accuracy "$target" --name "$name" --runs "$runs" "$@" "${extra[@]}" >"$runs/$name.log" 2>&1 &
  child=$!
  wait "$child"
  rc=$?
  child=""
  if [ "$rc" = 77 ]; then
    grep "emulate-cluster:" "$runs/$name.log" >&2
    log "cannot emulate the cluster here (reason above)"
    exit 77
  fi
  if [ "$rc" != 0 ] || [ ! -s "$runs/$name/summary.json" ]; then
    tail -n 20 "$runs/$name.log" >&2
    log "$mode run $name failed (status $rc); its output: $runs/$name.log"
    exit 1
  fi
  grep -m1 "one-way latency" "$runs/$name.log" | sed 's/^/  /' >&2
  grep "final test accuracy" "$runs/$name.log" | sed 's/^/  /' >&2
}

names=()
for ((i = 1; i <= repeat; i++)); do
  suffix=""
  [ "$repeat" -gt 1 ] && suffix=-r$i
  if [ "$table_only" = 0 ]; then
    train dense dense "emu-dense$suffix"
    train hitopk "hitopk:$density" "emu-hitopk$suffix" --sparse-warmup-epochs "$sparse_warmup"
  fi
  for name in "emu-dense$suffix" "emu-hitopk$suffix"; do
    [ -s "$runs/$name/summary.json" ] || { log "no $runs/$name/summary.json"; exit 1; }
    names+=("$name")
  done
done

# --- the table ------------------------------------------------------------------

pct=$(awk -v t="$target" 'BEGIN { printf "%g", 100 * t }')
rows=$(for name in "${names[@]}"; do
  s=$runs/$name/summary.json
  printf '%s %s %s %s %s %s %s %s\n' "$name" "$(summary_field "$s" grad)" \
    "$(summary_field "$s" final_test_accuracy)" "$(summary_field "$s" time_to_target_s)" \
    "$(summary_field "$s" epoch_to_target)" "$(summary_field "$s" wall_s)" "$(summary_field "$s" comm_s)" \
    "$(summary_field "$s" compute_s)"
done)

# The settings as the runs recorded them (--table-only may be given others).
d=$runs/${names[0]}/summary.json h=$runs/${names[1]}/summary.json
link=$(sed -n 's/.*uplink \([^ ]*\) (tbf); one-way latency \(.*\)/\1, one-way latency \2/p' \
  "$runs/${names[0]}.log" 2>/dev/null | head -1)
echo
echo "tide-train --model $(summary_field "$d" model) --epochs $(summary_field "$d" epochs)" \
  "--batch $(summary_field "$d" batch_per_worker) (x $(summary_field "$d" workers) workers)" \
  "--optim $(summary_field "$d" optimizer) --lr $(summary_field "$d" lr) --seed $(summary_field "$d" seed)" \
  "--eval-every $(summary_field "$d" eval_every);" \
  "hitopk: --sparse-warmup-epochs $(summary_field "$h" sparse_warmup_epochs)" \
  "--selector $(summary_field "$h" selector); 2 emulated hosts x 2 ranks, uplink ${link:-unknown}"
echo
echo "$rows" | awk -v pct="$pct" -v repeat="$repeat" '
  function median(a, n,   i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  BEGIN {
    printf "| run | mode | final test accuracy | time to %s%% (epoch) | total wall | mean comm share |\n", pct
    print "|---|---|---|---|---|---|"
  }
  {
    mode = $2; m = $2 == "dense" ? "dense" : "sparse"
    share = $7 / ($7 + $8)
    tt = $4 == "null" ? "not reached" : sprintf("%.2f s (%.2f)", $4, $5)
    printf "| %s | %s | %.2f%% | %s | %.2f s | %.0f%% |\n", $1, mode, 100 * $3, tt, $6, 100 * share
    n[m]++; acc[m, n[m]] = $3; wall[m, n[m]] = $6; sh[m, n[m]] = share; label[m] = mode
    if ($4 == "null") miss[m]++; else { nt[m]++; tt_[m, nt[m]] = $4 }
  }
  END {
    for (k = 0; k < 2; k++) {
      m = k == 0 ? "dense" : "sparse"
      delete a; for (i = 1; i <= n[m]; i++) a[i] = acc[m, i]; macc[m] = median(a, n[m])
      delete a; for (i = 1; i <= n[m]; i++) a[i] = wall[m, i]; mwall[m] = median(a, n[m])
      delete a; for (i = 1; i <= n[m]; i++) a[i] = sh[m, i]; msh[m] = median(a, n[m])
      # a run that never reached the target counts as slower than any that did
      delete a; for (i = 1; i <= nt[m]; i++) a[i] = tt_[m, i]; for (i = 1; i <= miss[m]; i++) a[nt[m] + i] = 1e30
      mtt[m] = median(a, n[m])
      if (repeat > 1)
        printf "| median of %d | %s | %.2f%% | %s | %.2f s | %.0f%% |\n", n[m], label[m], 100 * macc[m],
          (mtt[m] >= 1e30 ? "not reached" : sprintf("%.2f s", mtt[m])), mwall[m], 100 * msh[m]
    }
    gap = 100 * (macc["sparse"] - macc["dense"])
    printf "\n%s final accuracy within 1 point of dense: %s (%+.2f points%s)\n", label["sparse"],
      (gap >= -1 ? "yes" : "NO"), gap, (repeat > 1 ? ", medians" : "")
    if (mtt["sparse"] >= 1e30) verdict = "NO (never reached)"
    else if (mtt["dense"] >= 1e30) verdict = "yes (dense never reached it)"
    else verdict = sprintf("%s (%.2fx)", mtt["sparse"] < mtt["dense"] ? "yes" : "NO", mtt["dense"] / mtt["sparse"])
    printf "%s reached %s%% in less wall time than dense: %s\n", label["sparse"], pct, verdict
  }'
echo
echo "time to target: wall time from the first training step to the end of the first evaluation at or above" \
  "the target (evaluations included); comm share: comm_s / (compute_s + comm_s), evaluations excluded."
echo "runs: $runs/{$(IFS=,; echo "${names[*]}")}"
