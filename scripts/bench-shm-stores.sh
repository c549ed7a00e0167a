#!/usr/bin/env bash
# How shared-memory sends write into the ring (TIDE_SHM_STORES), side by
# side: each round runs the f32-sum allreduce at np 2, 1 MiB and np 4, 16 MiB
# once per setting (plain, auto, stream; one launch of `tide bench` each, in
# that order), so the settings see the same stretch of the machine's time.
# Prints one line per launch round (the p50s in ms) and then, per case and
# setting, the median p50 over the rounds in which plain ran at its usual
# speed and over those in which it did not (a "spell": plain's p50 over 2x
# its lowest in the run; docs/performance.md, "Shared-memory stores"), with
# auto / plain.
#
#   scripts/bench-shm-stores.sh [BUILD_DIR]        (default: build)
#
# Environment: ROUNDS=16, PAUSE=5 (seconds between rounds: spells come and
# go over seconds to minutes), SETTINGS="plain auto stream".
set -uo pipefail

build=${1:-build}
if [ ! -x "$build/tools/tide" ] || [ ! -x "$build/tools/tiderun" ]; then
  echo "bench-shm-stores: $build/tools/tide or tiderun not found (build first: make build)" >&2
  exit 2
fi
rounds=${ROUNDS:-16}
settings=${SETTINGS:-plain auto stream}
cases=("2 1M 300" "4 16M 30")

p50_ms() { sed -n 's/.*"p50_s":\([0-9.e+-]*\).*/\1/p' | awk '{ printf "%.3f", $1 * 1e3 }'; }

echo "Started $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average$(uptime | sed 's/.*load average//')"
header="| round |"
for c in "${cases[@]}"; do
  set -- $c
  for s in $settings; do header="$header np $1, $2, $s (ms) |"; done
done
echo "$header"
echo "|---|$(for c in "${cases[@]}"; do for s in $settings; do printf -- '---|'; done; done)"
out=$(mktemp)
for ((round = 1; round <= rounds; round++)); do
  line="| $round |"
  for c in "${cases[@]}"; do
    set -- $c
    for s in $settings; do
      t=$(TIDE_SHM_STORES=$s timeout -k 5 120 "$build/tools/tiderun" -np "$1" "$build/tools/tide" bench --op allreduce \
        --dtype f32 --min-bytes "$2" --max-bytes "$2" --iters "$3" | p50_ms)
      line="$line ${t:-failed} |"
      echo "$round np$1-$2 $s ${t:-nan}" >>"$out"
    done
  done
  echo "$line"
  [ "$round" -lt "$rounds" ] && sleep "${PAUSE:-5}"
done
echo "Finished $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo
awk -v settings="$settings" '
  function median(list,   a, n, i, j, t) {
    n = split(list, a, " ")
    if (n == 0) return "-"
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j] + 0 < a[j - 1] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  { t[$1, $2, $3] = $4; cases[$2] = 1; if ($1 > rounds) rounds = $1
    if ($3 == "plain" && $4 != "nan" && (!($2 in low) || $4 + 0 < low[$2])) low[$2] = $4 + 0 }
  END {
    n = split(settings, s, " ")
    printf "| case | rounds plain / spell |"
    for (k = 1; k <= n; k++) printf " %s: median p50, usual / spell (ms) |", s[k]
    print " auto / plain, usual / spell |"
    printf "|---|---|"
    for (k = 1; k <= n; k++) printf "---|"
    print "---|"
    for (c in cases) {
      delete list
      usual = spell = 0
      for (r = 1; r <= rounds; r++) {
        sp = t[r, c, "plain"] > 2 * low[c]
        if (sp) spell++; else usual++
        for (k = 1; k <= n; k++) list[s[k], sp] = list[s[k], sp] " " t[r, c, s[k]]
      }
      printf "| %s | %d / %d |", c, usual, spell
      for (k = 1; k <= n; k++) printf " %s / %s |", median(list[s[k], 0]), median(list[s[k], 1])
      pu = median(list["plain", 0]); ps = median(list["plain", 1]); au = median(list["auto", 0]); as = median(list["auto", 1])
      printf " %s / %s |\n", (pu != "-" && au != "-") ? sprintf("%.2f", au / pu) : "-", (ps != "-" && as != "-") ? sprintf("%.2f", as / ps) : "-"
    }
  }' "$out"
rm -f "$out"
