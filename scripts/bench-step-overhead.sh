#!/usr/bin/env bash
# What the step API costs: tide-train on the library's trainer against the
# hand-written training loop it replaced (tools/tide-train.c as of
# --baseline-rev, compiled here against this build's libraries, so only the
# loop differs), same model, exchange, data, seed and launcher, runs
# alternating. Per run: training seconds per step = (wall_s - eval_s) /
# steps from summary.json; prints both medians and their ratio.
# docs/adaptation.md has results.
set -uo pipefail
usage() { echo "usage: scripts/bench-step-overhead.sh --build DIR [--baseline-rev REV] [--repeat N] [--np N] [-- ARGS]"; }
build="" rev=60b1675 repeat=6 np=2
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;; --baseline-rev) rev=$2; shift 2 ;; --repeat) repeat=$2; shift 2 ;;
    --np) np=$2; shift 2 ;; -h|--help) usage; exit 0 ;; --) shift; break ;;
    *) echo "bench-step-overhead: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
extra=("$@")
[ ${#extra[@]} -eq 0 ] && extra=(--model mlp --epochs 2 --batch 64 --lr 0.05 --threads 1)
[ -x "$build/tools/tide-train" ] && [ -f "$build/libtide.a" ] ||
  { echo "bench-step-overhead: --build DIR must be a tide build (tools/tide-train, libtide.a)" >&2; exit 2; }
build=$(cd "$build" && pwd)
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d /tmp/step-overhead.XXXXXX)
trap 'rm -rf "$work"' EXIT
git -C "$src" show "$rev:tools/tide-train.c" >"$work/loop.c" || { echo "no tools/tide-train.c at $rev" >&2; exit 1; }
# libtide.a (tide_static) holds the MPI transport when the build found Open MPI
mpi=$(pkg-config --libs ompi 2>/dev/null || true)
cc -std=c11 -O3 -g -D_GNU_SOURCE -I"$src/include" -I"$src/src" "$work/loop.c" \
  "$build/libtide.a" -lopenblas -lz -lnlopt -lhwloc -lm -lpthread -lrt $mpi -o "$work/loop" ||
  { echo "bench-step-overhead: the $rev loop does not build against this library" >&2; exit 1; }
for ((i = 1; i <= repeat; i++)); do
  order="api loop"; [ $((i % 2)) = 0 ] && order="loop api"
  for kind in $order; do
    bin=$build/tools/tide-train; [ $kind = loop ] && bin=$work/loop
    "$build/tools/tiderun" -np "$np" "$bin" "${extra[@]}" --name "$kind-$i" --runs "$work/runs" \
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
