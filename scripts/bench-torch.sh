#!/usr/bin/env bash
# tide.torch against torch DistributedDataParallel (gloo), side by side in one
# run: examples/torch_fashion_mnist.py with the same model, data, batch,
# optimizer, threads and process count, --backend tide then --backend ddp,
# alternating. Prints one JSON line per run (examples' --json) and a markdown
# table; docs/performance.md ("tide.torch against DDP") has the results.
set -uo pipefail

me=bench-torch
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(dirname "$here")

usage() {
  cat <<'EOF2'
usage: scripts/bench-torch.sh [options] local|emulated

  local      4 processes on this host (tiderun -np 4): MLP and CNN, images/s,
             final accuracy, and the CNN's share of the exchange hidden behind
             backward (--report-overlap: every 10th step is a probe whose
             exchange nothing hides, so a model's images/s is measured without
             it unless named in --overlap-models)
  emulated   2 emulated hosts x 2 ranks (scripts/emulate-cluster.sh, root) at
             --bandwidth: MLP, tide with --compression against DDP, time to
             --target test accuracy

  --build DIR          tide build directory (default build)
  --models LIST        local: models (default "mlp cnn")
  --epochs N           local: epochs (default 2); emulated: 3
  --repeat R           run each pair R times, alternating (default 1)
  --overlap-models L   local: models run with --report-overlap (default cnn)
  --compression C      emulated: tide's compression (default hitopk:0.01)
  --sparse-warmup E    emulated: its density warm-up in epochs (default 0)
  --bandwidth RATE     emulated: each host's uplink (default 1gbit)
  --target X           emulated: target accuracy (default 0.85)
  --eval-every N       emulated: evaluate every N steps (default 25)
  --out FILE           also append the JSON lines to FILE
EOF2
}

build=$src/build models="mlp cnn" overlap_models=cnn epochs="" repeat=1 compression=hitopk:0.01 sparse_warmup=0 bandwidth=1gbit target=0.85
eval_every=25 out=""
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --models) models=$2; shift 2 ;;
    --overlap-models) overlap_models=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --compression) compression=$2; shift 2 ;;
    --sparse-warmup) sparse_warmup=$2; shift 2 ;;
    --bandwidth) bandwidth=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --eval-every) eval_every=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    local|emulated) mode=$1; shift ;;
    *) echo "$me: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "${mode:-}" ] || { usage >&2; exit 2; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "$me: /usr/bin/python3 cannot import torch (python3-torch)" >&2; exit 77; }
export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH} TIDE_LIBRARY=$build/libtide.so
example=$src/examples/torch_fashion_mnist.py
results=$(mktemp)
trap 'rm -f "$results"' EXIT

run() { # label, command...
  local label=$1; shift
  echo "$me: $label: $*" >&2
  local line
  line=$("$@" 2>&1 | tee /dev/stderr | grep '^{' | tail -n1)
  [ -n "$line" ] || { echo "$me: $label produced no result" >&2; return 1; }
  echo "$line" | tee -a "$results"
  [ -z "$out" ] || echo "$line" >> "$out"
}

if [ "$mode" = local ]; then
  epochs=${epochs:-2}
  for model in $models; do
    overlap=()
    case " $overlap_models " in *" $model "*) overlap=(--report-overlap) ;; esac
    for r in $(seq "$repeat"); do
      for backend in tide ddp; do
        run "$model $backend #$r" "$build/tools/tiderun" -np 4 /usr/bin/python3 "$example" --model "$model" \
          --backend "$backend" --epochs "$epochs" "${overlap[@]}" --json
      done
    done
  done
else
  epochs=${epochs:-3}
  for r in $(seq "$repeat"); do
    for backend in tide ddp; do
      extra=()
      [ "$backend" = tide ] && extra=(--compression "$compression" --sparse-warmup-epochs "$sparse_warmup")
      GLOO_SOCKET_IFNAME=eth0 run "emulated $backend #$r" bash "$here/emulate-cluster.sh" --hosts 2 \
        --ranks-per-host 2 --bandwidth "$bandwidth" --build "$build" --no-prefix -- /usr/bin/python3 "$example" \
        --model mlp --backend "$backend" --epochs "$epochs" --target-accuracy "$target" \
        --eval-every "$eval_every" --json "${extra[@]}"
    done
  done
fi

# The table: medians per (model, backend, compression).
/usr/bin/python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
groups = {}
for r in rows:
    groups.setdefault((r["model"], r["backend"], r["compression"]), []).append(r)
print("| model | backend | compression | runs | images/s (median) | final accuracy | time to target (s) | exchange hidden |")
print("|---|---|---|---|---|---|---|---|")
for (m, b, c), rs in groups.items():
    ips = statistics.median(r["images_per_s"] for r in rs)
    acc = statistics.median(r["final_accuracy"] for r in rs)
    tt = [r["time_to_target_s"] for r in rs if r["time_to_target_s"] is not None]
    hid = [r["overlap"]["hidden_share"] for r in rs if "overlap" in r]
    print("| %s | %s | %s | %d | %.0f | %.4f | %s | %s |" % (m, b, c, len(rs), ips, acc,
          "%.1f" % statistics.median(tt) if tt else "-", "%.0f%%" % (100 * statistics.median(hid)) if hid else "-"))
for m in sorted({k[0] for k in groups}):
    t = [k for k in groups if k[0] == m and k[1] == "tide"]
    d = [k for k in groups if k[0] == m and k[1] == "ddp"]
    if t and d:
        ti = statistics.median(r["images_per_s"] for r in groups[t[0]])
        di = statistics.median(r["images_per_s"] for r in groups[d[0]])
        print("%s: tide/ddp images/s %.2fx" % (m, ti / di), end="")
        tt = [r["time_to_target_s"] for r in groups[t[0]] if r["time_to_target_s"] is not None]
        dt = [r["time_to_target_s"] for r in groups[d[0]] if r["time_to_target_s"] is not None]
        if tt and dt:
            print(", time to target: ddp/tide %.2fx" % (statistics.median(dt) / statistics.median(tt)), end="")
        print()
PY
