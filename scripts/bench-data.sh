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
#   shards-*      the same three over the sharded export of the same images
#                 (tide data export --shard-bytes, BENCH_SHARD_BYTES, default
#                 256K): one GET per shard instead of one per image
# usage: scripts/bench-data.sh [BUILD_DIR] [files|shards|all]
#   (BENCH_DATA_DIR, default /tmp/tide-bench-data; all is the default;
#    BENCH_DATA_TRAIN=0: the loader runs only)
set -uo pipefail
me=bench-data
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
work=${BENCH_DATA_DIR:-/tmp/tide-bench-data}
which=${2:-all}
case $which in files | shards | all) ;; *) echo "usage: $0 [BUILD_DIR] [files|shards|all]" >&2; exit 2 ;; esac
shard_bytes=${BENCH_SHARD_BYTES:-256K}
mkdir -p "$work"
export_set() { # dir, then tide data export's options
  local dir=$1
  shift
  if [ ! -f "$dir/index.txt" ]; then
    "$build/tools/tide" data export fashion-mnist "$dir" "$@" >&2 || exit 1
  fi
}
link_MBps=12.5 # 100 Mbit/s

emu() { # storage dir, log file, then the program and its arguments
  local dir=$1 log=$2
  shift 2
  bash "$here/emulate-cluster.sh" --hosts 2 --ranks-per-host 2 --bandwidth 1gbit --storage "$dir" \
    --storage-bandwidth 100mbit --build "$build" --no-prefix -- "$@" > "$log" 2>&1
}
served() { grep -o 'storage: served [0-9]* bytes' "$1" | awk '{print $3}'; }
requests() { grep -o 'storage: served [0-9]* bytes in [0-9]* requests' "$1" | awk '{print $6}'; }

# The storage host's uplink as the kernel counts it (bytes on the wire,
# headers included), every 50 ms, as "seconds bytes" lines in $1, until
# killed: the newest emulated storage namespace that did not exist before.
sample_link() { # out file
  local ns="" old b
  old=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -- '-st$')
  while :; do
    [ -n "$ns" ] || ns=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -- '-st$' | grep -vxF "${old:-none}" | head -1)
    if [ -n "$ns" ]; then
      b=$(ip -n "$ns" -s link show eth0 2>/dev/null | awk '/TX:/ {getline; print $1; exit}')
      [ -n "$b" ] && echo "$(date +%s.%N) $b"
    fi
    sleep 0.05
  done >"$1"
}

# Each host's loader gets its own disk cache (a node's local disk).
loader() { # storage dir, cache dir, log
  sample_link "$3.link" &
  local sampler=$!
  emu "$1" "$3" sh -c 'TIDE_DATA_CACHE="$1/h$TIDE_EMU_HOST" exec "$0" --data "$TIDE_EMU_STORAGE_URL" --batch 64 --epochs 2' \
    "$build/bench/loader_bench" "$2"
  local rc=$?
  kill "$sampler" 2>/dev/null
  wait "$sampler" 2>/dev/null
  return $rc
}

bench_set() { # name prefix ("" or "shards-"), storage dir
local prefix=$1 folder=$2
rm -rf "$work/${prefix}cache" "$work/${prefix}cache-train" "$work/${prefix}runs"
mkdir -p "$work/${prefix}cache" "$work/${prefix}cache-train" "$work/${prefix}runs"
echo "$me: ${prefix}loader from $folder, $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for run in cold warm; do
  log=$work/${prefix}loader-$run.log
  loader "$folder" "$work/${prefix}cache" "$log" ||
    { echo "$me: loader_bench ($run) failed:" >&2; tail -20 "$log" >&2; exit 1; }
  e1=$(grep '^{"lib":"tide","epoch":1' "$log")
  e2=$(grep '^{"lib":"tide","epoch":2' "$log")
  /usr/bin/python3 - "$prefix$run" "$e1" "$e2" "$(served "$log")" "$link_MBps" "$(requests "$log")" "$(cut -d' ' -f1-3 /proc/loadavg)" "$log.link" <<'PY'
import json, sys
run, e1, e2, served, link = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4] or -1), float(sys.argv[5])
nreq, load = int(sys.argv[6] or -1), sys.argv[7]
# The uplink while it carried data: from the first to the last 50 ms
# interval that moved more than 5% of the link's rate (the index fetch at
# open, any gap before epoch 1 and the shards or images all inside; not the
# last ACKs and FINs).
samples = [tuple(map(float, l.split())) for l in open(sys.argv[8]) if len(l.split()) == 2]
moved = [k for k in range(1, len(samples))
         if samples[k][1] - samples[k - 1][1] > 0.05 * link * 1e6 * (samples[k][0] - samples[k - 1][0])]
wire = {}
if moved:
    t0, b0 = samples[moved[0] - 1]
    t1, b1 = samples[moved[-1]]
    wire = {"wire_bytes": int(b1 - b0), "wire_active_s": round(t1 - t0, 3),
            "wire_MBps": round((b1 - b0) / (t1 - t0) / 1e6, 3), "wire_link_share": round((b1 - b0) / (t1 - t0) / 1e6 / link, 3)}
dataset = e1["images"] * 28 * 28  # decoded bytes (uint8, 28 x 28 x 1)
bound = 1.1 * dataset / 2 + e1["window_bytes"]
print(json.dumps({"bench": "loader-" + run, "epoch1_s": e1["seconds"], "epoch1_source_MBps": e1["source_MBps"],
                  "link_share": round(e1["source_MBps"] / link, 3), "epoch2_images_per_s": e2["images_per_s"],
                  "server_bytes_sent": served, "server_requests": nreq, "store_bytes_host0": e1["store_bytes"],
                  "store_bound_bytes": int(bound), "store_within_bound": e1["store_bytes"] <= bound,
                  "store_share_host0": round(e1["store_bytes"] / dataset, 4), **wire, "load_after": load}))
PY
done

[ "${BENCH_DATA_TRAIN:-1}" = 0 ] && return 0
log=$work/${prefix}train.log
emu "$folder" "$log" sh -c 'exec "$0" --model cnn --epochs 3 --data "$TIDE_EMU_STORAGE_URL" --cache-dir "$1/h$TIDE_EMU_HOST" \
  --runs "$2" --name cnn' "$build/tools/tide-train" "$work/${prefix}cache-train" "$work/${prefix}runs" ||
  { echo "$me: tide-train failed:" >&2; tail -20 "$log" >&2; exit 1; }
/usr/bin/python3 - "$work/${prefix}runs/cnn/metrics.jsonl" "$(served "$log")" "${prefix}train" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import json, sys
name = sys.argv[3]
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
    print(json.dumps({"bench": name, "data_epoch": epoch + 1, "steps": steps, "data_s": round(data_s, 3),
                      "step_s": round(step_s, 3), "data_share": round(data_s / step_s, 4)}))
print(json.dumps({"bench": name, "server_bytes_sent": int(sys.argv[2] or -1), "load_after": sys.argv[4]}))
PY
}

if [ "$which" != shards ]; then
  export_set "$work/fashion-mnist-png"
  bench_set "" "$work/fashion-mnist-png"
fi
if [ "$which" != files ]; then
  export_set "$work/fashion-mnist-shards-$shard_bytes" --shard-bytes "$shard_bytes"
  bench_set shards- "$work/fashion-mnist-shards-$shard_bytes"
fi
