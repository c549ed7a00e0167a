#!/usr/bin/env bash
# The data pipeline's bounds re-run from outside (issue 26, docs/data.md "What
# is bounded"): each section of test_data_limits runs as its own process tree
# under /usr/bin/time and a timeout, with a 20000 x 20000 PNG and JPEG bomb
# (400 M pixels: 400 MB gray if it were decoded) and a misbehaving HTTP server
# that offers 4 GiB instead of 64 MiB. For each section it prints the exit
# status, the wall time, the peak RSS of the largest process of the tree and
# what is left behind: /dev/shm/tide* names, processes, listening ports.
# The test's own checks say that each error is the clear one; this script says
# that memory stayed bounded (under 2 x the largest decoded sample store the
# test makes, 3 MiB, plus 256 MiB), nothing hung past its timeout, and nothing
# was left.
# usage: scripts/data-limits-check.sh [BUILD_DIR (default build)]
set -u
build=${1:-build}
bin=$build/test/test_data_limits
[ -x "$bin" ] || { echo "data-limits-check: $bin not found: build the tests first (cmake --build $build)" >&2; exit 2; }
bound_kb=$(((256 + 2 * 3) * 1024))
export TIDE_TEST_BOMB_SIDE=${TIDE_TEST_BOMB_SIDE:-20000} TIDE_TEST_SERVER_MAX_MB=${TIDE_TEST_SERVER_MAX_MB:-4096}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shm() { ls /dev/shm 2> /dev/null | grep '^tide' | sort; }
# A new name that a live process still maps or holds open is another test's (ctest -j runs this
# beside others), not one this section's processes left: they are gone by then.
in_use() { grep -qsF "/dev/shm/$1" /proc/[0-9]*/maps || find /proc/[0-9]*/fd -lname "/dev/shm/$1" 2> /dev/null | grep -q .; }
fail=0
printf '%-9s %5s %8s %12s %10s %s\n' section exit wall_s peak_rss_MB bound_MB "left behind"
for s in bombs cache cachedir listing local http shm; do
  shm > "$tmp/shm-before"
  timeout 300 /usr/bin/time -f '%M %e' -o "$tmp/time" "$bin" "$s" > "$tmp/$s.log" 2>&1
  rc=$?
  sleep 0.5
  shm > "$tmp/shm-after"
  left=$(comm -13 "$tmp/shm-before" "$tmp/shm-after" | while read -r n; do in_use "$n" || echo "$n"; done | tr '\n' ' ')
  procs=$(pgrep -f "$bin $s\$" | tr '\n' ' ') # this section's, not the ctest entry test_data_limits'
  ports=0 # listening sockets of this section's processes (those of the ctest entry's are not)
  for p in $procs; do ports=$((ports + $(ss -ltnpH 2> /dev/null | grep -c "pid=$p,"))); done
  read -r rss wall < <(tail -1 "$tmp/time")
  what=""
  [ -n "$left" ] && what+="shm: $left"
  [ -n "$procs" ] && what+="processes: $procs"
  [ "$ports" != 0 ] && what+="$ports listening port(s)"
  printf '%-9s %5s %8s %12.1f %10d %s\n' "$s" "$rc" "$wall" "$(echo "$rss / 1024" | bc -l)" $((bound_kb / 1024)) "${what:-nothing}"
  if [ "$rc" != 0 ] || [ "$rss" -gt "$bound_kb" ] || [ -n "$what" ]; then
    fail=1
    echo "  $s failed; its log:" && tail -20 "$tmp/$s.log" | sed 's/^/  | /'
  fi
done
exit $fail
