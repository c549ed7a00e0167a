#!/usr/bin/env bash
# The data pipeline's bars (docs/data.md) on the emulated cluster: 2 hosts x
# 2 ranks (1 Gbit/s between them), the Fashion-MNIST PNG ImageFolder served
# by the emulated storage host (lighttpd) at 100 Mbit/s. Root (network
# namespaces). Prints one JSON line per measurement:
#   loader-cold   bench/loader_bench alone (no compute), empty disk caches:
#                 epoch 1 is link-bound; its source MB/s against the link's
#                 12.5 MB/s, the bytes the server sent, the decoded store of
#                 host 0 against 1.1 x (dataset / hosts) + the window
#   loader-warm   the same again with the caches the first run filled: the
#                 bytes the server sent (only the index's revalidation)
#   train         tide-train --model cnn --epochs 3 from the same URL, empty
#                 caches: per data epoch, rank 0's time waiting for data
#                 (data_s) against its step time (step_s)
# usage: scripts/bench-data.sh [BUILD_DIR]   (BENCH_DATA_DIR, default /tmp/tide-bench-data)
set -uo pipefail
me=bench-data
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
work=${BENCH_DATA_DIR:-/tmp/tide-bench-data}
folder=$work/fashion-mnist-png
mkdir -p "$work"
if [ ! -f "$folder/index.txt" ]; then
  "$build/tools/tide" data export fashion-mnist "$folder" >&2 || exit 1
fi
rm -rf "$work/cache" "$work/cache-train" "$work/runs"
mkdir -p "$work/cache" "$work/cache-train" "$work/runs"
link_MBps=12.5 # 100 Mbit/s

emu() { # log file, then the program and its arguments
  local log=$1
  shift
  bash "$here/emulate-cluster.sh" --hosts 2 --ranks-per-host 2 --bandwidth 1gbit --storage "$folder" \
    --storage-bandwidth 100mbit --build "$build" --no-prefix -- "$@" > "$log" 2>&1
}
served() { grep -o 'storage: served [0-9]* bytes' "$1" | awk '{print $3}'; }

# Each host's loader gets its own disk cache (a node's local disk).
loader() { # log
  emu "$1" sh -c 'TIDE_DATA_CACHE="$1/h$TIDE_EMU_HOST" exec "$0" --data "$TIDE_EMU_STORAGE_URL" --batch 64 --epochs 2' \
    "$build/bench/loader_bench" "$work/cache"
}

for run in cold warm; do
  log=$work/loader-$run.log
  loader "$log" || { echo "$me: loader_bench ($run) failed:" >&2; tail -20 "$log" >&2; exit 1; }
  e1=$(grep '^{"lib":"tide","epoch":1' "$log")
  e2=$(grep '^{"lib":"tide","epoch":2' "$log")
  /usr/bin/python3 - "$run" "$e1" "$e2" "$(served "$log")" "$link_MBps" <<'PY'
import json, sys
run, e1, e2, served, link = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4] or -1), float(sys.argv[5])
dataset = e1["images"] * 28 * 28  # decoded bytes (uint8, 28 x 28 x 1)
bound = 1.1 * dataset / 2 + e1["window_bytes"]
print(json.dumps({"bench": "loader-" + run, "epoch1_s": e1["seconds"], "epoch1_source_MBps": e1["source_MBps"],
                  "link_share": round(e1["source_MBps"] / link, 3), "epoch2_images_per_s": e2["images_per_s"],
                  "server_bytes_sent": served, "store_bytes_host0": e1["store_bytes"],
                  "store_bound_bytes": int(bound), "store_within_bound": e1["store_bytes"] <= bound}))
PY
done

log=$work/train.log
emu "$log" sh -c 'exec "$0" --model cnn --epochs 3 --data "$TIDE_EMU_STORAGE_URL" --cache-dir "$1/h$TIDE_EMU_HOST" \
  --runs "$2" --name cnn' "$build/tools/tide-train" "$work/cache-train" "$work/runs" ||
  { echo "$me: tide-train failed:" >&2; tail -20 "$log" >&2; exit 1; }
/usr/bin/python3 - "$work/runs/cnn/metrics.jsonl" "$(served "$log")" <<'PY'
import json, sys
per = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("type") != "step":
        continue
    e = per.setdefault(r["epoch"], [0, 0.0, 0.0])
    e[0] += 1
    e[1] += r["data_s"] or 0.0
    e[2] += r["step_s"]
for epoch, (steps, data_s, step_s) in sorted(per.items()):
    print(json.dumps({"bench": "train", "data_epoch": epoch + 1, "steps": steps, "data_s": round(data_s, 3),
                      "step_s": round(step_s, 3), "data_share": round(data_s / step_s, 4)}))
print(json.dumps({"bench": "train", "server_bytes_sent": int(sys.argv[2] or -1)}))
PY
