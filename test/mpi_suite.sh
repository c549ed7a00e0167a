#!/usr/bin/env bash
# The MPI test under MPICH, installed side by side with Open MPI (Debian:
# mpich + libmpich-dev, which give mpicc.mpich and mpirun.mpich). libtide in
# the build tree links Open MPI, so this compiles the library's sources
# (the layers the test uses, the rest only if the link asks for them)
# together with test/test_mpi.c with MPICH's compiler wrapper, then lets
# test_mpi drive itself under mpirun.mpich (np = 1..4).
#
#   test/mpi_suite.sh SOURCE_DIR WORK_DIR
#
# Exit 77 (skipped) when MPICH's wrappers or headers are missing. The binary
# is rebuilt only when a source is newer than it.
set -euo pipefail
src=$(cd "$1" && pwd)
work=$2
for tool in mpicc.mpich mpirun.mpich; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "mpi_suite: $tool not found (apt-get install mpich libmpich-dev): MPICH part skipped"
    exit 77
  fi
done
if ! echo '#include <mpi.h>' | mpicc.mpich -E -x c - >/dev/null 2>&1; then
  echo "mpi_suite: mpicc.mpich finds no mpi.h (apt-get install libmpich-dev): MPICH part skipped"
  exit 77
fi
mkdir -p "$work/obj"
bin=$work/test_mpi_mpich
# The layers the test uses; the rest of libtide only if the link needs it.
mapfile -t layers < <(find "$src/src/core" "$src/src/store" "$src/src/transport" "$src/src/comm" "$src/src/coll" \
                        -name '*.c' | sort)
mapfile -t others < <(find "$src/src" -name '*.c' -not -path '*/src/nn/*' | sort | grep -v -F -x -f <(printf '%s\n' "${layers[@]}"))
tests=("$src/test/test_mpi.c" "$src/test/coll_suite.c" "$src/test/harness.c")

# The GPU kernels' source as C strings (src/gpu/driver.c includes them).
mkdir -p "$work/generated/gpu"
cmake "-DINPUTS=$src/src/gpu/select.cu;$src/src/gpu/state.h" "-DVARS=tide__gpu_select_cu;tide__gpu_state_h" \
      -DOUT="$work/generated/gpu/sources.h" -P "$src/cmake/embed.cmake"
export WORK=$work

# compile FILE...: objects in $work/obj, two compilers at a time (2 cores).
compile() {
  local s
  for s in "$@"; do
    printf '%s\n%s\n' "$s" "$work/obj/$(echo "${s#"$src"/}" | tr '/' '_').o"
  done | xargs -P 2 -n 2 sh -c 'mpicc.mpich -std=c11 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE \
      -DTIDE_BUILDING -DTIDE_HAVE_MPI -I"$0/include" -I"$0/src" -I"$0/test" -I"$WORK/generated" -c "$1" -o "$2"' "$src"
}
objects() {
  local s
  for s in "$@"; do echo "$work/obj/$(echo "${s#"$src"/}" | tr '/' '_').o"; done
}

if [ ! -x "$bin" ] || [ -n "$(find "$src/src" "$src/include" "$src/test" -newer "$bin" \( -name '*.c' -o -name '*.h' \) -print -quit)" ]; then
  echo "mpi_suite: building $bin with MPICH $(mpichversion 2>/dev/null | awk '/Version/ {print $3}')"
  rm -f "$work"/obj/*.o "$bin"
  compile "${layers[@]}" "${tests[@]}"
  mapfile -t objs < <(objects "${layers[@]}" "${tests[@]}")
  if ! mpicc.mpich "${objs[@]}" -o "$bin" -lpthread -lm -lrt -ldl -lhwloc -lnlopt -llapacke -lopenblas -lpng -ljpeg -lcurl -lz 2>/dev/null; then
    compile "${others[@]}"
    mapfile -t more < <(objects "${others[@]}")
    mpicc.mpich "${objs[@]}" "${more[@]}" -o "$bin" -lpthread -lm -lrt -ldl -lhwloc -lnlopt -llapacke -lopenblas -lpng -ljpeg -lcurl -lz
  fi
fi
# MPICH polls without yielding: 3 and 4 ranks on 2 cores are slow, so the
# suite runs smaller counts here than under Open MPI.
export TIDE_TEST_MPIRUN=mpirun.mpich
export TEST_MPI_MAX_COUNT=${TEST_MPI_MAX_COUNT:-1000} TEST_MPI_QUICK=1
exec "$bin"
