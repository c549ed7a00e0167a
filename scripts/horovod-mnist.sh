#!/usr/bin/env bash
# Runs Horovod's own examples/pytorch/pytorch_mnist.py (from a Horovod
# checkout) on tide.torch with only its import lines changed: `import
# horovod` and `import horovod.torch as hvd` become `import tide.torch as
# hvd` (the first is used only by the example's --num-proc path, which
# launches through horovod.run). The data is Debian's Fashion-MNIST
# (dataset-fashion-mnist), laid out as torchvision's MNIST expects it, so
# nothing is downloaded. Prints the example's output and its final test
# accuracy. --backend gloo runs the same script on torch.distributed's gloo
# instead (a module this script writes gives it the five calls the example
# makes: the gradients averaged by all_reduce before each step, DDP's
# arithmetic), the baseline for the accuracy. docs/torch.md ("Horovod's
# examples") has the results.
set -uo pipefail

me=horovod-mnist
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(dirname "$here")

usage() {
  cat <<'EOF2'
usage: scripts/horovod-mnist.sh [options] HOROVOD_CHECKOUT

  --np N          ranks (default 2)
  --epochs E      epochs (default 1)
  --build DIR     tide build directory (default build)
  --data DIR      MNIST-format .gz files (default /usr/share/datasets/fashion-mnist)
  --backend B     tide (default) or gloo (the baseline: torch.distributed)
  -- ARGS         passed on to the example (e.g. --fp16-allreduce, --use-adasum)
EOF2
}

np=2 epochs=1 build=$src/build data=/usr/share/datasets/fashion-mnist backend=tide
while [ $# -gt 0 ]; do
  case $1 in
    --np) np=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) break ;;
    -*) echo "$me: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] && [ "$1" != "--" ] || { usage >&2; exit 2; }
checkout=$1; shift
[ "${1:-}" = "--" ] && shift
case $backend in tide|gloo) ;; *) echo "$me: --backend must be tide or gloo, got '$backend'" >&2; exit 2 ;; esac
example=$checkout/examples/pytorch/pytorch_mnist.py
[ -f "$example" ] || { echo "$me: $example not found: HOROVOD_CHECKOUT must be a Horovod source tree" >&2; exit 2; }
[ -x "$build/tools/tiderun" ] && [ -f "$build/libtide.so" ] ||
  { echo "$me: no tools/tiderun or libtide.so in $build: build tide first or pass --build DIR" >&2; exit 2; }
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  [ -f "$data/$f.gz" ] || { echo "$me: $data/$f.gz missing (apt-get install dataset-fashion-mnist, or --data DIR)" >&2
                            exit 2; }
done
for m in torch torchvision filelock packaging; do
  /usr/bin/python3 -c "import $m" 2>/dev/null ||
    { echo "$me: /usr/bin/python3 lacks $m (scripts/install-deps.sh installs it)" >&2; exit 2; }
done

tmp=$(mktemp -d /tmp/horovod-mnist.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/data/MNIST/raw"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  gzip -dc "$data/$f.gz" > "$tmp/data/MNIST/raw/$f"
done
# The import lines, and nothing else: the diff is printed so the reader can check.
module=tide.torch
[ $backend = gloo ] && module=gloo_hvd
sed -e '/^import horovod$/d' -e "s/^import horovod\.torch as hvd\$/import $module as hvd/" "$example" > "$tmp/pytorch_mnist.py"
diff "$example" "$tmp/pytorch_mnist.py"
[ "$(diff "$example" "$tmp/pytorch_mnist.py" | grep -c '^[<>]')" = 3 ] ||
  { echo "$me: the example's import lines were not where expected; not run" >&2; exit 1; }

# The baseline's five calls on torch.distributed (gloo), as a DDP script
# would make them: every gradient averaged by all_reduce before the step.
cat > "$tmp/gloo_hvd.py" <<'EOF2'
import os
import torch
import torch.distributed as dist
Average, Adasum = "average", "adasum"


class Compression:
    none, fp16 = None, "fp16"


def init():
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % os.environ["GLOO_HVD_PORT"],
                            rank=int(os.environ["TIDE_RANK"]), world_size=int(os.environ["TIDE_SIZE"]))


def rank():
    return dist.get_rank()


def size():
    return dist.get_world_size()


def local_rank():
    return int(os.environ["TIDE_LOCAL_RANK"])


def nccl_built():
    return 0


def broadcast_parameters(state, root_rank):
    for t in state.values():
        dist.broadcast(t, root_rank)


def broadcast_optimizer_state(optimizer, root_rank):
    box = [optimizer.state_dict()]
    dist.broadcast_object_list(box, root_rank)
    optimizer.load_state_dict(box[0])


def allreduce(tensor, name=None):
    t = tensor.clone()
    dist.all_reduce(t)
    return t / dist.get_world_size()


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, op=Average,
                         gradient_predivide_factor=1.0):
    assert compression is None and op == Average and gradient_predivide_factor == 1.0, "the baseline: defaults only"
    step = optimizer.step

    def synced_step(closure=None):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= dist.get_world_size()
        return step(closure)
    optimizer.step = synced_step
    return optimizer
EOF2
export GLOO_HVD_PORT=$((29600 + RANDOM % 1000))
export PYTHONPATH=$tmp:$src/python${PYTHONPATH:+:$PYTHONPATH}
export TIDE_LIBRARY=$build/libtide.so
cd "$tmp" || exit 2
start=$(date +%s)
"$build/tools/tiderun" -np "$np" --timeout 1800 /usr/bin/python3 "$tmp/pytorch_mnist.py" --epochs "$epochs" \
  --data-dir "$tmp/data" --no-cuda "$@" 2>&1 | tee "$tmp/out.log"
rc=${PIPESTATUS[0]}
acc=$(grep -o 'Accuracy: [0-9.]*%' "$tmp/out.log" | tail -1)
echo "$me: tiderun exited $rc after $(( $(date +%s) - start )) s ($backend, $np ranks, $epochs epoch(s)); final test ${acc:-accuracy: none printed}"
[ "$rc" = 0 ] && [ -n "$acc" ]
