#!/usr/bin/env bash
# What the step API costs: tide-train on the library's trainer against the
# hand-written loop it replaced (tide-train as of --baseline-rev, built
# here from git), same model, exchange, data and seeds, runs alternating.
# Per run: training seconds per step = (wall_s - eval_s) / steps from
# summary.json; prints both medians and their ratio. docs/adaptation.md
# has results.
set -uo pipefail
usage() { echo "usage: scripts/bench-step-overhead.sh --build DIR [--baseline-rev REV] [--repeat N] [--np N] [-- ARGS]"; }
build="" rev=60b1675 repeat=5 np=2
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;; --baseline-rev) rev=$2; shift 2 ;; --repeat) repeat=$2; shift 2 ;;
    --np) np=$2; shift 2 ;; -h|--help) usage; exit 0 ;; --) shift; break ;;
    *) echo "bench-step-overhead: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
extra=("$@")
[ ${#extra[@]} -eq 0 ] && extra=(--model mlp --epochs 2 --batch 64 --lr 0.05 --threads 1)
[ -x "$build/tools/tide-train" ] || { echo "bench-step-overhead: --build DIR must hold tools/tide-train" >&2; exit 2; }
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d /tmp/step-overhead.XXXXXX)
trap 'git -C "$src" worktree remove --force "$work/src" >/dev/null 2>&1; rm -rf "$work"' EXIT
echo "bench-step-overhead: building tide-train at $rev in $work" >&2
git -C "$src" worktree add --detach "$work/src" "$rev" >/dev/null 2>&1 || { echo "cannot check out $rev" >&2; exit 1; }
cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DTIDE_BUILD_TESTS=OFF \
  -DTIDE_BUILD_BENCH_PEERS=OFF >/dev/null && cmake --build "$work/build" -j2 --target tide-train tiderun >/dev/null ||
  { echo "bench-step-overhead: the baseline does not build" >&2; exit 1; }
for ((i = 1; i <= repeat; i++)); do
  for kind in loop api; do
    dir=$work/build; [ $kind = api ] && dir=$build
    "$dir/tools/tiderun" -np "$np" "$dir/tools/tide-train" "${extra[@]}" --name "$kind-$i" --runs "$work/runs" \
      >"$work/$kind-$i.log" 2>&1 || { tail "$work/$kind-$i.log" >&2; exit 1; }
  done
done
/usr/bin/python3 - "$work/runs" "$repeat" "$rev" <<'PY'
import json, statistics, sys
runs, repeat, rev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
per = {"loop": [], "api": []}
for kind in per:
    for i in range(1, repeat + 1):
        s = json.load(open("%s/%s-%d/summary.json" % (runs, kind, i)))
        steps = s.get("steps") or s["epochs"] * -(-s["train_images"] // s["global_batch"])
        per[kind].append((s["wall_s"] - s["eval_s"]) / steps)
for kind, label in (("loop", "hand-written loop (%s)" % rev), ("api", "step API")):
    print("%-32s median %.3f ms/step  (runs: %s)" % (label, 1e3 * statistics.median(per[kind]),
          ", ".join("%.3f" % (1e3 * v) for v in per[kind])))
print("step API / loop = %.3f" % (statistics.median(per["api"]) / statistics.median(per["loop"])))
PY
