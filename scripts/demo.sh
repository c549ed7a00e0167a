#!/usr/bin/env bash
# `make demo`: 4 ranks on this host run the collectives demo under tiderun.
set -euo pipefail
build=${1:-build}
echo "== tiderun -np 4 $build/examples/collectives_demo"
"$build/tools/tiderun" -np 4 "$build/examples/collectives_demo"
