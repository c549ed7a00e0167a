# Sourced by the live scheduler's one-host tests (sched_live.sh, sched_hints.sh,
# sched_background.sh): their arguments, temporary directory, helpers and the
# clean-up that stops the daemon and every keeper it left.
# Usage: . sched_lib.sh BUILD_DIR SOURCE_DIR NAME (sets tools, traces, tmp, dir,
#        mark, daemon, fails; exits 77 without the Pollux traces)
build=$1
src=$2
tools=$build/tools
traces=$src/../shared/data/pollux-osdi21/traces
[ -d "$traces" ] || { echo "SKIP: no traces at $traces"; exit 77; }
tmp=$(mktemp -d "/tmp/tide-$3.XXXXXX")
dir=$tmp/d
mark=${3#sched-}$$x # in the jobs' command lines: pgrep finds this run's processes only
daemon=
fails=0

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
field() { awk -v j="$1" -v c="$2" '$1 == j { print $c }' "$dir/jobs.txt"; } # job id, column
jobs() { "$tools/tide" jobs --dir "$dir" > "$dir/jobs.txt" 2>/dev/null; }
state_of() { sed -n 's/^state //p' "$dir/jobs/$1/state"; }
keeper_of() { sed -n 's/^keeper //p' "$dir/jobs/$1/state"; }
alive() { pgrep -f -- "$1" > /dev/null; } # a process whose command line holds $1
is_state() { [ "$(state_of "$1")" = "$2" ]; }
gone() { ! alive "$1" && ! kill -0 "$2" 2> /dev/null; } # PATTERN KEEPER_PID
# wait_for SECONDS COMMAND...: until COMMAND succeeds
wait_for() {
  local n=$(($1 * 10)); shift
  for _ in $(seq "$n"); do "$@" && return 0; sleep 0.1; done
  return 1
}
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2> /dev/null && wait "$daemon" 2> /dev/null
  for s in "$dir"/jobs/*/state; do
    [ -f "$s" ] || continue
    k=$(sed -n 's/^keeper //p' "$s")
    [ -n "$k" ] && [ "$k" -gt 0 ] && kill "$k" 2> /dev/null
  done
  sleep 1.5
  [ -n "${KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT
