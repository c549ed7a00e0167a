#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/) with clang and runs each for a
# while. Usage: scripts/fuzz.sh [--seconds N] [--build DIR] [NAME...]
#   NAME: store_frame, handshake, coll_header, index_parse, image_probe
#         (default: all five)
#   --seconds N  how long each harness runs (default 60)
#   --build DIR  build directory (default build-fuzz); new inputs found are
#                kept in DIR/corpus/NAME, crashes in DIR/artifacts/
# Exits 77 (skipped) without clang or its libFuzzer runtime (Debian: clang,
# libclang-rt-dev; scripts/install-deps.sh installs them), non-zero when a
# harness crashes, with the input that did it.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
seconds=60
build=$root/build-fuzz
names=()
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) names+=("$1"); shift ;;
  esac
done
[ ${#names[@]} -gt 0 ] || names=(store_frame handshake coll_header index_parse image_probe)
case $seconds in ''|*[!0-9]*) echo "fuzz.sh: --seconds takes a whole number, not '$seconds'" >&2; exit 2 ;; esac

if ! command -v clang >/dev/null; then
  echo "fuzz.sh: clang is not installed (apt-get install clang libclang-rt-dev): skipped"
  exit 77
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' >"$probe/p.c"
if ! clang -fsanitize=fuzzer "$probe/p.c" -o "$probe/p" 2>"$probe/err"; then
  echo "fuzz.sh: clang cannot link libFuzzer (apt-get install libclang-rt-dev): skipped"
  cat "$probe/err"
  exit 77
fi

CC=clang cmake -S "$root/fuzz" -B "$build" >/dev/null
cmake --build "$build" -j "${JOBS:-2}" >/dev/null

status=0
for name in "${names[@]}"; do
  exe=$build/fuzz_$name
  [ -x "$exe" ] || { echo "fuzz.sh: no harness named $name" >&2; exit 2; }
  corpus=$build/corpus/$name
  mkdir -p "$corpus" "$build/artifacts"
  echo "fuzz.sh: $name for $seconds s (corpus $corpus, seeds fuzz/corpus/$name)"
  # New inputs go to the first directory; the seeds in the tree stay as they are.
  if ! "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$name-" "$corpus" "$root/fuzz/corpus/$name" \
      >"$build/$name.log" 2>&1; then
    echo "fuzz.sh: $name FAILED; the input is in $build/artifacts/ (rerun: $exe FILE)"
    tail -n 60 "$build/$name.log"
    status=1
    continue
  fi
  grep -E '^stat::number_of_executed_units|^Done' "$build/$name.log" | tail -n 1 | sed "s/^/fuzz.sh: $name: /"
done
exit $status
