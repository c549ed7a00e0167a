#!/usr/bin/env bash
# The noise scale tide reports for the Fashion-MNIST MLP at the end of epoch
# 1 (4 workers x 64) against a brute-force reference from per-example
# gradients at the same parameters (test/gns_torch_ref.py): within 25%.
# Exits 77 (skipped) without torch or the data set.
set -uo pipefail
build=$1 src=$2
data=/usr/share/datasets/fashion-mnist
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "skipped: /usr/bin/python3 has no torch"; exit 77; }
[ -f "$data/train-images-idx3-ubyte.gz" ] || { echo "skipped: no Fashion-MNIST in $data"; exit 77; }
runs=$(mktemp -d /tmp/gns_reference.XXXXXX)
trap 'rm -rf "$runs"' EXIT
"$build/tools/tiderun" -np 4 "$build/tools/tide-train" --model mlp --epochs 2 --batch 64 --optim nesterov --lr 0.1 \
  --threads 1 --save-params --name gns --runs "$runs" >"$runs/log" 2>&1 || { cat "$runs/log"; exit 1; }
out=$(/usr/bin/python3 "$src/test/gns_torch_ref.py" "$runs/gns" 1) || exit 1
echo "$out"
echo "$out" | /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.stdin.read())["tide_over_reference"]
ok = r is not None and 0.75 <= r <= 1.25
print("tide / reference = %.3f: %s" % (r, "within 25%" if ok else "NOT within 25%"))
sys.exit(0 if ok else 1)'
