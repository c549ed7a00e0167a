#!/usr/bin/env bash
# Multiplexing a background job on a communication-bound foreground (issue 27,
# item 4's bar; docs/elastic.md, "Multiplexing"). On 2 emulated hosts
# (scripts/emulate-cluster.sh, 1 rank each, 100 Mbit/s, 0.5 ms):
#   fg-solo       the foreground alone: tide-train MLP, dense allreduce
#   fg-solo-block the same with its waits blocking (TIDE_SPIN_US=0)
#   bg-solo       the background alone: tide-train CNN, topk:0.01 at that density
#                 from the first step (no density warm-up, whose first epoch
#                 sends 10x more), normal priority, before the pairs and again
#                 after them (bg-solo-after): the reference is their mean
#   bg-solo-idle  the same with tiderun --background (SCHED_IDLE)
#   mux           both: fg --hosts-background (blocks while it waits), bg
#                 --background --foreground (SCHED_IDLE, guarded at 110%)
#   mux-spin      the same, but the foreground spins as by default (TIDE_SPIN_US=200)
#   mux-normal    the same as mux, but the background at normal priority (guard only)
#   equal         both at equal priority: no --background, no guard, default spin
# Each pair starts the foreground with emulate-cluster.sh, then the background's
# two tideruns inside the same host namespaces (its own store on port 29501).
# The foreground's step time is its median over the steps that ended while
# the background ran; the background's throughput counts its steps that ended
# while the foreground ran (images / the sum of their step_s, pauses
# included), against the mean of bg-solo and bg-solo-after. One JSON line per
# configuration, then a table.
#
# usage: scripts/bench-multiplex.sh [--build DIR] [--out DIR] [--bandwidth RATE] [--latency TIME]
#                                   [--only LIST]   (comma-separated configurations)
#                                   [--quick]       (shorter jobs: a check of the script, not the bar)
# Needs root (emulate-cluster.sh) and Fashion-MNIST. About 12 minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${TIDE_BUILD_DIR:-$here/../build}
out=runs/bench-multiplex
bandwidth=100mbit
latency=0.5ms
only=fg-solo,fg-solo-block,bg-solo,bg-solo-idle,mux,mux-spin,mux-normal,equal
fg_args=(--model mlp --epochs 2 --subset 60000 --threads 1)
bg_args=(--model cnn --epochs 2 --subset 6400 --threads 1 --grad topk:0.01 --sparse-warmup-epochs 0)
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --bandwidth) bandwidth=$2; shift 2 ;;
    --latency) latency=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --quick) fg_args=(--model mlp --epochs 1 --subset 19200 --threads 1)
             bg_args=(--model cnn --epochs 1 --subset 3200 --threads 1 --grad topk:0.01 --sparse-warmup-epochs 0); shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "bench-multiplex: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
build=$(cd "$build" && pwd)
[ -x "$build/tools/tide-train" ] || { echo "bench-multiplex: no $build/tools/tide-train: build first" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
emulate=("$here/emulate-cluster.sh" --build "$build" --hosts 2 --ranks-per-host 1 --bandwidth "$bandwidth"
         --latency "$latency" --no-prefix)
fg_token=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
bg_token=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
wanted() { [[ ",$only," == *",$1,"* ]]; }

solo() { # NAME: the foreground's or background's arguments follow
  local name=$1; shift
  rm -rf "$out/$name"
  "${emulate[@]}" "$@" --name "$name" --runs "$out" > "$out/$name.log" 2>&1
}

# pair MODE: the foreground with emulate-cluster.sh, the background in its namespaces.
pair() {
  local mode=$1 fg_extra=() bg_extra=() fg_env=() bg_env=()
  case "$mode" in
    mux) fg_extra=(--tiderun-arg --hosts-background); bg_extra=(--background --foreground 10.213.0.1:29500) ;;
    mux-spin) fg_extra=(--tiderun-arg --hosts-background); fg_env=(TIDE_SPIN_US=200)
              bg_extra=(--background --foreground 10.213.0.1:29500) ;;
    mux-normal) fg_extra=(--tiderun-arg --hosts-background)
                bg_env=(TIDE_FOREGROUND=10.213.0.1:29500) ;;
    equal) ;;
  esac
  rm -rf "$out/fg-$mode" "$out/bg-$mode"
  env "${fg_env[@]}" TIDE_JOB_TOKEN="$fg_token" "${emulate[@]}" "${fg_extra[@]}" -- tide-train "${fg_args[@]}" \
    --name "fg-$mode" --runs "$out" > "$out/fg-$mode.log" 2>&1 &
  local emu=$! i
  for i in $(seq 300); do
    ip netns list 2>/dev/null | grep -q "tide-emu-$emu-h1" && [ -e "$out/fg-$mode/metrics.jsonl" ] && break
    sleep 0.1
  done
  sleep 1 # the foreground's first steps
  local pids=()
  for h in 0 1; do
    ip netns exec "tide-emu-$emu-h$h" env -u TIDE_HOST_ID "${bg_env[@]}" TIDE_SOCKET_IFNAME=eth0 TIDE_JOB_TOKEN="$bg_token" \
      TIDE_FOREGROUND_TOKEN="$fg_token" "$build/tools/tiderun" --nnodes 2 --node-rank $h --nproc-per-node 1 \
      --rdzv 10.213.0.1:29501 "${bg_extra[@]}" -- "$build/tools/tide-train" "${bg_args[@]}" --name "bg-$mode" \
      --runs "$out" > "$out/bg-$mode-h$h.log" 2>&1 &
    pids+=($!)
  done
  # The foreground's end removes the hosts, and with them a background that
  # has not finished: its steps up to then count.
  local rc=0
  wait "$emu" || rc=1
  for p in "${pids[@]}"; do wait "$p" || echo "bench-multiplex: $mode: the background was stopped with the foreground" >&2; done
  [ $rc -eq 0 ] || { echo "bench-multiplex: $mode: the foreground failed; see $out/fg-$mode.log" >&2; return 1; }
}

echo "bench-multiplex: $bandwidth, $latency, 2 emulated hosts x 1 rank; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
wanted fg-solo && solo fg-solo -- tide-train "${fg_args[@]}"
wanted fg-solo-block && TIDE_SPIN_US=0 solo fg-solo-block -- tide-train "${fg_args[@]}"
wanted bg-solo && solo bg-solo -- tide-train "${bg_args[@]}"
wanted bg-solo-idle && solo bg-solo-idle --tiderun-arg --background -- tide-train "${bg_args[@]}"
for mode in mux mux-spin mux-normal equal; do
  if wanted "$mode"; then pair "$mode"; fi
done
# The background alone again: on a shared machine its solo rate drifts with
# the load, so the reference is the mean of the runs before and after.
wanted bg-solo && solo bg-solo-after -- tide-train "${bg_args[@]}"

python3 - "$out" "$only" <<'EOF'
import json, os, statistics, sys
out, only = sys.argv[1], sys.argv[2].split(",")

def load(name):
    """Step lines (each with its wall-clock end, unix_s), the first's start
    and the last's end; a background stopped with its foreground has no
    summary.json, but its lines up to then."""
    steps = [json.loads(l) for l in open(os.path.join(out, name, "metrics.jsonl")) if l.strip()]
    steps = [s for s in steps if s["type"] == "step"]
    return steps, steps[0]["unix_s"] - steps[0]["step_s"], steps[-1]["unix_s"]

def med(steps):
    return statistics.median(s["step_s"] for s in steps[2:]) if len(steps) > 2 else float("nan")

def rate(steps):
    steps = steps[1:]
    return sum(s["global_batch"] for s in steps) / sum(s["step_s"] for s in steps) if steps else float("nan")

have = lambda n: os.path.exists(os.path.join(out, n, "metrics.jsonl"))
fg_solo = med(load("fg-solo")[0]) if have("fg-solo") else float("nan")
solos = [rate(load(n)[0]) for n in ("bg-solo", "bg-solo-after") if have(n)]
bg_solo = sum(solos) / len(solos) if solos else float("nan")
rows = []
for name in ("fg-solo", "fg-solo-block"):
    if have(name):
        st = load(name)[0]
        rows.append(dict(config=name, fg_step_s=med(st), fg_ratio=med(st) / fg_solo))
for name in ("bg-solo", "bg-solo-after", "bg-solo-idle"):
    if have(name):
        st = load(name)[0]
        rows.append(dict(config=name, bg_images_per_s=rate(st), bg_share=rate(st) / bg_solo))
for mode in ("mux", "mux-spin", "mux-normal", "equal"):
    if not (have("fg-" + mode) and have("bg-" + mode)):
        continue
    fg, fs, fe = load("fg-" + mode)
    bg, bs, be = load("bg-" + mode)
    fg_in = [s for s in fg if bs + 1 <= s["unix_s"] <= be]
    bg_in = [s for s in bg if s["unix_s"] <= fe]
    row = dict(config=mode, fg_step_s=med(fg_in), fg_ratio=med(fg_in) / fg_solo, fg_steps_overlapped=len(fg_in),
               bg_images_per_s=rate(bg_in), bg_share=rate(bg_in) / bg_solo, bg_steps_overlapped=len(bg_in),
               bg_paused_s=sum(s.get("paused_s") or 0 for s in bg), bg_pauses=bg[-1].get("pauses", 0))
    solo_seen = [s["solo_step_s"] for s in fg if s.get("solo_step_s")]
    if solo_seen:
        row["fg_published_solo_s"] = solo_seen[-1]
    rows.append(row)
for r in rows:
    print(json.dumps({k: (round(v, 5) if isinstance(v, float) else v) for k, v in r.items()}))
print("\n| configuration | foreground step (s) | vs fg-solo | background images/s | vs bg-solo | bg paused (s, pauses) |")
print("|---|---|---|---|---|---|")
f = lambda v, fmt: (fmt % v) if isinstance(v, (int, float)) and v == v else "-"
for r in rows:
    print("| %s | %s | %s | %s | %s | %s |" % (r["config"], f(r.get("fg_step_s"), "%.4f"), f(r.get("fg_ratio"), "%.3fx"),
          f(r.get("bg_images_per_s"), "%.0f"), f(r.get("bg_share"), "%.0f%%" if False else "%.2f"),
          ("%.1f, %d" % (r["bg_paused_s"], r["bg_pauses"])) if "bg_paused_s" in r else "-"))
EOF
