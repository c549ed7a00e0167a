#!/usr/bin/env bash
# tide's loader against torch's DataLoader + torchvision's ImageFolder on the
# same PNG folder on local disk, one process each, side by side, alternating
# R times: images/s delivered to the loop per epoch (JSON lines).
#   bench/loader_vs_torch.sh BUILD_DIR FOLDER [EPOCHS] [REPEATS]
# FOLDER: e.g. from `tide data export fashion-mnist /tmp/fm`.
set -euo pipefail
build=$1 folder=$2 epochs=${3:-3} repeats=${4:-1}
here=$(cd "$(dirname "$0")" && pwd)
for ((r = 0; r < repeats; r++)); do
  # tide: one rank, 2 read/decode threads (torch: 2 workers), no disk cache
  # (local disk), batch 64
  TIDE_DATA_CACHE=none "$build/tools/tiderun" -np 1 "$build/bench/loader_bench" --data "$folder" --batch 64 \
    --threads 2 --epochs "$epochs"
  /usr/bin/python3 "$here/loader_torch.py" --data "$folder" --batch 64 --workers 2 --epochs "$epochs"
done
