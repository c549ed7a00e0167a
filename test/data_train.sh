#!/usr/bin/env bash
# tide-train through the data loader end to end: Fashion-MNIST exported as a
# PNG ImageFolder, 2 ranks, a disk cache; the second run is served from it;
# data_s is in metrics.jsonl; tide data stats reads the cache.
set -euo pipefail
build=$1
tools=$build/tools
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || { echo "no Fashion-MNIST"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$tools/tide" data export fashion-mnist "$work/fm" --limit 1500 >/dev/null
for run in 1 2; do
  "$tools/tiderun" -np 2 "$tools/tide-train" --data "$work/fm" --cache-dir "$work/cache" --epochs 1 \
    --runs "$work/runs" --name r$run >"$work/out$run" 2>&1 || { cat "$work/out$run"; exit 1; }
  grep -q "replicas identical: yes" "$work/out$run"
  grep -q '"data_s":' "$work/runs/r$run/metrics.jsonl"
done
"$tools/tide" data stats "$work/cache" | tee "$work/stats"
# run 1 missed every object once, run 2 hit every one
grep -q "lookups 3000: hits 1500, misses 1500" "$work/stats"
# a corrupt image: named, or skipped with --on-bad-sample skip
printf 'garbage' > "$(ls -d "$work"/fm/3_*/ | head -1)/$(ls "$(ls -d "$work"/fm/3_*/ | head -1)" | head -1)"
if "$tools/tiderun" -np 2 "$tools/tide-train" --data "$work/fm" --epochs 1 --runs "$work/runs" --name bad \
    >"$work/bad" 2>&1; then
  echo "a corrupt image did not fail the run"; exit 1
fi
grep -q "is a corrupt or truncated image" "$work/bad"
"$tools/tiderun" -np 2 "$tools/tide-train" --data "$work/fm" --epochs 1 --runs "$work/runs" --name skip \
  --on-bad-sample skip >"$work/skip" 2>&1 || { cat "$work/skip"; exit 1; }
grep -q "skipping" "$work/skip"
# a sharded export (tide data export --shard-bytes): the same training, read one shard per request
"$tools/tide" data export fashion-mnist "$work/fm-shards" --limit 1500 --shard-bytes 64K >/dev/null
[ "$(head -1 "$work/fm-shards/index.txt")" = "tide-imagefolder 2" ]
"$tools/tiderun" -np 2 "$tools/tide-train" --data "$work/fm-shards" --cache-dir "$work/cache-shards" --epochs 1 \
  --runs "$work/runs" --name shards >"$work/shards" 2>&1 || { cat "$work/shards"; exit 1; }
grep -q "replicas identical: yes" "$work/shards"
nshards=$(ls "$work/fm-shards/shards" | wc -l)
"$tools/tide" data stats "$work/cache-shards" | tee "$work/stats-shards"
grep -q "misses $nshards\b" "$work/stats-shards"
# the sharded export keeps the per-file layout's samples, labels and order
cmp <(awk '/^file/ {print $2, $4}' "$work/fm/index.txt") <(awk '/^sample/ {print $2, $6}' "$work/fm-shards/index.txt")
# packed in place, twice (the second with larger shards), then listed again: the same 10 classes
"$tools/tide" data index "$work/fm" --shard-bytes 16K >/dev/null
"$tools/tide" data index "$work/fm" --shard-bytes 64K >/dev/null
[ "$(ls "$work/fm/shards" | wc -l)" = "$nshards" ]
"$tools/tide" data index "$work/fm" | grep -q "1500 images in 10 classes"
echo "data_train: ok"
