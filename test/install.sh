#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs a program
# against it the two ways a user would: pkg-config and find_package(tide).
set -euo pipefail
build=$1
src=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name tide.pc | head -n1)")/..
export PKG_CONFIG_PATH=$libdir/pkgconfig LD_LIBRARY_PATH=$libdir
cc -std=c11 -Wall -Werror "$src/examples/collectives_demo.c" $(pkg-config --cflags --libs tide) -o "$prefix/demo"
"$prefix/demo" | grep -q "every rank agrees           = yes"
"$prefix/bin/tiderun" -np 2 "$prefix/demo" | grep -q "2 ranks on 1 host"
# The model engine is part of the installed library: its header beside
# tide.h, its calls in libtide.so (exported) and libtide.a.
[ -f "$prefix/include/tide_nn.h" ] || { echo "install: include/tide_nn.h is not installed" >&2; exit 1; }
cc -std=c11 -Wall -Werror "$src/examples/nn_minimal.c" $(pkg-config --cflags --libs tide) -o "$prefix/nn_shared"
"$prefix/nn_shared" | grep -q "nn_minimal: flatten"
cc -std=c11 -Wall -Werror "$src/examples/nn_minimal.c" $(pkg-config --cflags tide) "$libdir/libtide.a" \
  $(pkg-config --libs --static tide | sed 's/-ltide //') -o "$prefix/nn_static"
env -u LD_LIBRARY_PATH "$prefix/nn_static" | grep -q "nn_minimal: flatten"
mkdir "$prefix/consumer"
cat > "$prefix/consumer/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.16)
project(consumer C)
find_package(tide REQUIRED)
add_executable(demo $src/examples/collectives_demo.c)
target_link_libraries(demo tide::tide)
add_executable(nn $src/examples/nn_minimal.c)
target_link_libraries(nn tide::tide)
CM
cmake -S "$prefix/consumer" -B "$prefix/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer/build" >/dev/null
"$prefix/consumer/build/demo" | grep -q "every rank agrees           = yes"
"$prefix/consumer/build/nn" | grep -q "nn_minimal: flatten"
# The Python package finds the installed libtide relative to itself.
pydir=$(dirname "$(find "$prefix" -name _install.py | head -n1)")/..
env -u LD_LIBRARY_PATH -u TIDE_LIBRARY PYTHONPATH="$pydir" /usr/bin/python3 -c \
  "import tide, tide._lib as l; assert '$prefix' in l._library_path(), l._library_path()"
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  env -u LD_LIBRARY_PATH -u TIDE_LIBRARY PYTHONPATH="$pydir" "$prefix/bin/tiderun" -np 2 /usr/bin/python3 -c \
    "import torch, tide.torch as tt; tt.init(); assert tt.allreduce(torch.ones(3), op=tt.Sum).tolist() == [2.0] * 3" 
fi
echo "install: pkg-config and find_package(tide) both build and run against $prefix (the collectives demo and the nn engine, shared and static); so does tide.torch"
