#!/usr/bin/env bash
# Adasum allreduce against tide's dense allreduce (f32 sum) of the same size,
# side by side: every round runs `tide bench --op allreduce,adasum
# --interleave` once per rank count and size (a launch of its own), whose
# iterations alternate (allreduce, Adasum, allreduce, ...), so both p50s
# come from the same stretch of the machine's time; rounds repeat that.
# Each round is one launch of `tiderun` per rank count and size, so ROUNDS
# (or LAUNCHES, the same) counts the launches behind every row. Prints a
# markdown table of the medians over rounds of each p50 and of the per-round
# ratios adasum/allreduce of the p50s and of the fastest iterations, and the
# spread of the p50 ratio over the launches (lowest and highest round: the
# 1.3x bar holds only if the highest is under it), then the worst launch and
# how many rows have every launch within BAR; every JSON line goes to OUT.
#
#   scripts/bench-adasum.sh [BUILD_DIR]        (default: build)
#
# Environment (all optional):
#   NPS="2 4"  ROUNDS=5 (or LAUNCHES=5)  SIZES="1M 4M 16M 64M"
#   ITERS (timed iterations of each op per launch; default 300 below 4 MiB,
#   100 below 16 MiB, else 30: a 1 MiB call lasts ~0.06 ms, and 30 of them
#   are a 2 ms sample that one preemption moves)
#   BAR=1.3  OUT=BUILD_DIR/bench-adasum.jsonl  RUN_TIMEOUT=300 (seconds per run)
set -uo pipefail

build=${1:-build}
if [ ! -x "$build/tools/tide" ] || [ ! -x "$build/tools/tiderun" ]; then
  echo "bench-adasum: $build/tools/tide or tiderun not found (build first: make build)" >&2
  exit 2
fi
build=$(cd "$build" && pwd)
nps=${NPS:-2 4}
rounds=${LAUNCHES:-${ROUNDS:-5}}
out=${OUT:-$build/bench-adasum.jsonl}
: >"$out"
status=0
# The machine's load, before and after: the ratios mean little on a busy one.
echo "Started $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average$(uptime | sed 's/.*load average//')"
for ((round = 1; round <= rounds; round++)); do
  for np in $nps; do
    for size in ${SIZES:-1M 4M 16M 64M}; do
      echo "bench-adasum: round $round, np=$np, $size" >&2
      case $size in
        *K | [1-3]M) iters=${ITERS:-300} ;;
        [4-9]M | 1[0-5]M) iters=${ITERS:-100} ;;
        *) iters=${ITERS:-30} ;;
      esac
      tmp=$(mktemp)
      timeout -k 10 "${RUN_TIMEOUT:-300}" "$build/tools/tiderun" -np "$np" "$build/tools/tide" bench \
        --op allreduce,adasum --dtype f32 --min-bytes "$size" --max-bytes "$size" --iters "$iters" \
        --check --interleave >"$tmp" || status=1
      grep '^{' "$tmp" | sed "s/}\$/,\"round\":$round}/" >>"$out"
      rm -f "$tmp"
    done
  done
done

# One row per (np, bytes): medians over rounds.
echo "Finished $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average$(uptime | sed 's/.*load average//')"
awk -v bar="${BAR:-1.3}" '
  function field(name,   m) {
    if (match($0, "\"" name "\":\"?[^,\"}]*")) { m = substr($0, RSTART, RLENGTH); sub(/.*:"?/, "", m); return m }
    return ""
  }
  function median(list,   a, n, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j] + 0 < a[j - 1] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  /^\{/ {
    key = field("np") " " field("bytes"); r = field("round")
    t[key, field("op"), r] = field("p50_s"); tmin[key, field("op"), r] = field("min_s"); rounds[r] = 1; keys[key] = 1
    if (field("ok") != "true") bad = 1
  }
  END {
    print "| np | bytes | allreduce p50 (ms) | adasum p50 (ms) | adasum / allreduce, p50 | adasum / allreduce, fastest | p50 ratio over launches: lowest-highest (launches) |"
    print "|---|---|---|---|---|---|---|"
    n = 0
    for (k in keys) order[++n] = k
    for (i = 2; i <= n; i++) for (j = i; j > 1; j--) {
      split(order[j], x, " "); split(order[j - 1], y, " ")
      if (x[1] + 0 < y[1] + 0 || (x[1] == y[1] && x[2] + 0 < y[2] + 0)) { s = order[j]; order[j] = order[j - 1]; order[j - 1] = s }
    }
    for (i = 1; i <= n; i++) {
      k = order[i]; a = ""; d = ""; q = ""; qm = ""; lo = ""; hi = ""; m = 0
      for (r in rounds) if ((k, "allreduce", r) in t && (k, "adasum", r) in t) {
        a = a " " t[k, "allreduce", r]; d = d " " t[k, "adasum", r]; ratio = t[k, "adasum", r] / t[k, "allreduce", r]
        q = q " " ratio; qm = qm " " tmin[k, "adasum", r] / tmin[k, "allreduce", r]; m++
        if (lo == "" || ratio < lo) lo = ratio
        if (hi == "" || ratio > hi) hi = ratio
      }
      split(k, x, " ")
      printf "| %d | %d MiB | %.2f | %.2f | %.2f | %.2f | %.2f-%.2f (%d) |\n", x[1], x[2] / 1048576, median(a) * 1e3,
        median(d) * 1e3, median(q), median(qm), lo, hi, m
      if (hi > worst) { worst = hi; worst_key = x[1] " " x[2] / 1048576 }
      if (hi <= bar) within++
    }
    if (n > 0) printf "\nWorst launch: adasum / allreduce p50 %.2f (np = %d, %d MiB)\n", worst, substr(worst_key, 1, index(worst_key, " ") - 1), substr(worst_key, index(worst_key, " ") + 1)
    if (n > 0) printf "Rows with every launch within %sx: %d of %d\n", bar, within, n
    if (bad) print "bench-adasum: a --check failed (ok=false)" > "/dev/stderr"
  }' "$out"
exit $status
