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
mkdir "$prefix/consumer"
cat > "$prefix/consumer/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.16)
project(consumer C)
find_package(tide REQUIRED)
add_executable(demo $src/examples/collectives_demo.c)
target_link_libraries(demo tide::tide)
CM
cmake -S "$prefix/consumer" -B "$prefix/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer/build" >/dev/null
"$prefix/consumer/build/demo" | grep -q "every rank agrees           = yes"
# The Python package finds the installed libtide relative to itself.
pydir=$(dirname "$(find "$prefix" -name _install.py | head -n1)")/..
env -u LD_LIBRARY_PATH -u TIDE_LIBRARY PYTHONPATH="$pydir" /usr/bin/python3 -c \
  "import tide, tide._lib as l; assert '$prefix' in l._library_path(), l._library_path()"
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  env -u LD_LIBRARY_PATH -u TIDE_LIBRARY PYTHONPATH="$pydir" "$prefix/bin/tiderun" -np 2 /usr/bin/python3 -c \
    "import torch, tide.torch as tt; tt.init(); assert tt.allreduce(torch.ones(3), op=tt.Sum).tolist() == [2.0] * 3" 
fi
echo "install: pkg-config and find_package(tide) both build and run against $prefix; so does tide.torch"
