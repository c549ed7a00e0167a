#!/usr/bin/env bash
# The noise scale tide reports for the Fashion-MNIST MLP (4 workers x 64)
# at the end of an epoch, against a brute-force reference from per-example
# gradients (test/gns_torch_ref.py) at the parameters of each of that
# epoch's last K steps and its end, averaged (a single point's |G|^2 swings
# 2x from one step to the next): within 25% (docs/adaptation.md, "Noise
# scale against per-example gradients"). The ctest checks the issue's run:
# the default momentum, 2 epochs, seed 1, at the end of epoch 1 (K = 10).
# With --all (a benchmark, about 15 minutes on 2 loaded cores) four cases
# are printed, not checked, each as that 2-epoch run (K = 10) and as 3-epoch
# runs with seeds 1 and 2 (K = 30, the ends of epochs 1 and 2):
#   momentum       the default optimizer and rate (0.05), fixed batch
#   nesterov       nesterov, lr 0.1, fixed batch
#   momentum-gns   momentum, the batch grown by --adapt gns
#   nesterov-gns   nesterov, lr 0.1, the batch grown by --adapt gns
# Not all of them are within 25% (docs/adaptation.md says which and why).
# The last epoch's end is never compared: the cosine schedule's rate
# reaches 0, the iterate settles and |G|^2 falls below what per-step
# estimates resolve.
#   gns_reference.sh BUILD SRC [--all]
# GNS_ARGS adds tide-train options to every case (e.g. GNS_ARGS="--gns-decay 0.99").
# Exits 77 (skipped) without torch or the data set.
set -uo pipefail
build=$1 src=$2 all=${3:-}
data=/usr/share/datasets/fashion-mnist
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "skipped: /usr/bin/python3 has no torch"; exit 77; }
[ -f "$data/train-images-idx3-ubyte.gz" ] || { echo "skipped: no Fashion-MNIST in $data"; exit 77; }
runs=$(mktemp -d /tmp/gns_reference.XXXXXX)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$runs"' EXIT
# name|epochs|epochs checked|K|tide-train options
cases=("momentum|2|1|10|")
if [ "$all" = "--all" ]; then
  cases=()
  for c in "momentum|" "nesterov|--optim nesterov --lr 0.1" "momentum-gns|--adapt gns" \
           "nesterov-gns|--optim nesterov --lr 0.1 --adapt gns"; do
    IFS='|' read -r name args <<<"$c"
    cases+=("$name|2|1|10|$args" "$name-3|3|1,2|30|$args" "$name-3-seed2|3|1,2|30|$args --seed 2")
  done
fi
# Each case trains, then its reference runs in the background while the
# next one trains (the two share the machine's cores).
for c in "${cases[@]}"; do
  IFS='|' read -r name epochs checked k args <<<"$c"
  # shellcheck disable=SC2086
  "$build/tools/tiderun" -np 4 "$build/tools/tide-train" --model mlp --epochs "$epochs" --batch 64 --threads 1 \
    --save-params="$k" --name "$name" --runs "$runs" $args ${GNS_ARGS:-} >"$runs/$name.log" 2>&1 ||
    { cat "$runs/$name.log"; exit 1; }
  [ ${#pids[@]} -gt 0 ] && wait "${pids[-1]}" # one reference at a time (about 1.5 GB each)
  ( /usr/bin/python3 "$src/test/gns_torch_ref.py" "$runs/$name" "$checked" >"$runs/$name.ref" 2>"$runs/$name.ref.err"
    echo $? >"$runs/$name.rc"; rm -f "$runs/$name"/params-*.bin ) &
  pids+=($!)
done
wait
failed=0
for c in "${cases[@]}"; do
  IFS='|' read -r name epochs checked k args <<<"$c"
  [ "$(cat "$runs/$name.rc")" = 0 ] || { cat "$runs/$name.ref.err"; exit 1; }
  /usr/bin/python3 -c '
import json, sys
name, checked = sys.argv[1], [int(e) for e in sys.argv[2].split(",") if e] if sys.argv[4] != "--all" else []
bad = 0
for line in open(sys.argv[3]):
    r = json.loads(line)
    ratio, check = r["tide_over_reference"], r["epoch"] in checked
    ok = ratio is not None and 0.75 <= ratio <= 1.25
    tide = r["tide_noise_scale"]
    print("%-19s epoch %d: tide %8s, reference %8.1f (%2d points; the end point alone %8.1f): %s %s" % (
        name, r["epoch"], "none" if tide is None else "%.1f" % tide, r["tail_noise_scale"], r["tail_points"],
        r["noise_scale"], "-" if ratio is None else "%.3f" % ratio,
        ("within 25%" if ok else "NOT within 25%") + ("" if check else " (not checked)")))
    bad |= check and not ok
sys.exit(bad)' "$name" "$checked" "$runs/$name.ref" "$all" || failed=1
done
exit $failed
