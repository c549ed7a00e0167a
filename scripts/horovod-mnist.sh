#!/usr/bin/env bash
# Runs Horovod's own examples/pytorch/pytorch_mnist.py (from a Horovod
# checkout) on tide.torch with only its import lines changed, on Debian's
# Fashion-MNIST (nothing is downloaded); --backend gloo runs the same script
# on torch.distributed's gloo (bench/gloo_hvd.py), the baseline for the
# accuracy. One example of scripts/horovod-examples.sh, which does the work:
#
#   scripts/horovod-mnist.sh [--np N] [--epochs E] [--build DIR] [--data DIR]
#                            [--backend tide|gloo|both] HOROVOD_CHECKOUT [-- ARGS]
#
# (ARGS go to the example, e.g. -- --fp16-allreduce, -- --use-adasum).
# docs/torch.md ("Horovod's examples") has the results.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec bash "$here/horovod-examples.sh" --backend tide --example mnist "$@"
