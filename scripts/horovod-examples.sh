#!/usr/bin/env bash
# Runs Horovod's PyTorch examples that run on a CPU (from a Horovod
# checkout) with only their import lines changed: `import horovod.torch as
# hvd` becomes `import tide.torch as hvd` (and `import horovod`, used only
# by pytorch_mnist.py's --num-proc path through horovod.run, goes), against
# the same file with `import gloo_hvd as hvd` (bench/gloo_hvd.py: the same
# calls on torch.distributed's gloo, DDP's arithmetic), the baseline. The
# diff of each file is checked to touch the import lines only. MNIST data is
# Debian's Fashion-MNIST laid out as torchvision's MNIST (nothing is
# downloaded); the synthetic benchmarks make their own data. Prints each
# run's output and, at the end, one line per run: example, backend, result
# (final test accuracy, or total images/s), wall time, exit status.
# docs/torch.md ("Horovod's examples") has the results and the examples that
# cannot run here, with why.
set -uo pipefail

me=horovod-examples
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(dirname "$here")
all="mnist mnist-fp16 mnist-adasum synthetic synthetic-fp16 synthetic-adasum synthetic-elastic"

usage() {
  cat <<EOF2
usage: scripts/horovod-examples.sh [options] HOROVOD_CHECKOUT [EXAMPLE ...] [-- ARGS]

  HOROVOD_CHECKOUT   a Horovod source tree (git clone of horovod/horovod)
  EXAMPLE            any of: $all
                     (default: all). mnist*: examples/pytorch/pytorch_mnist.py
                     (-fp16: --fp16-allreduce, -adasum: --use-adasum);
                     synthetic*: examples/pytorch/pytorch_synthetic_benchmark.py;
                     synthetic-elastic: examples/elastic/pytorch/
                     pytorch_synthetic_benchmark_elastic.py (tide: under
                     tiderun --elastic)

  --example EXAMPLE  the same as naming it after HOROVOD_CHECKOUT (repeatable)
  --backend B        tide, gloo or both (default both)
  --np N             ranks (default 2)
  --epochs E         mnist epochs (default 1)
  --model M          synthetic: torchvision model (default resnet18; the
                     example's resnet50 takes minutes per iteration on 2 cores)
  --batch-size B     synthetic: per-rank batch (default 8)
  --num-iters I      synthetic: timed iterations of 3 batches (default 5)
  --build DIR        tide build directory (default build)
  --data DIR         MNIST-format .gz files (default /usr/share/datasets/fashion-mnist)
  --cuda             on a GPU: the examples without --no-cuda, every rank its own
                     host (TIDE_HOST_ID), so their set_device(hvd.local_rank())
                     finds a machine's one GPU; tide only (gloo_hvd is CPU's)
  -- ARGS            passed on to every example run

  PYTHON             the interpreter with torch (default /usr/bin/python3)
EOF2
}

np=2 epochs=1 model=resnet18 batch=8 iters=5 build=$src/build data=/usr/share/datasets/fashion-mnist
backends="tide gloo" checkout="" examples="" cuda=0
while [ $# -gt 0 ]; do
  case $1 in
    --np) np=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --num-iters) iters=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --cuda) cuda=1; backends=tide; shift ;;
    --example) examples="$examples $2"; shift 2 ;;
    --backend)
      case $2 in tide|gloo) backends=$2 ;; both) backends="tide gloo" ;;
        *) echo "$me: --backend must be tide, gloo or both, got '$2'" >&2; exit 2 ;; esac
      shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "$me: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) if [ -z "$checkout" ]; then checkout=$1; else examples="$examples $1"; fi; shift ;;
  esac
done
[ -n "$checkout" ] || { usage >&2; exit 2; }
checkout=$(cd "$checkout" 2>/dev/null && pwd) ||
  { echo "$me: HOROVOD_CHECKOUT is not a directory" >&2; exit 2; }
[ -n "$examples" ] || examples=$all
for ex in $examples; do
  case " $all " in *" $ex "*) ;; *) echo "$me: unknown example '$ex' (one of: $all)" >&2; exit 2 ;; esac
done
for v in "np:$np" "epochs:$epochs" "batch-size:$batch" "num-iters:$iters"; do
  case ${v#*:} in ''|*[!0-9]*|0) echo "$me: --${v%%:*} must be a positive integer, got '${v#*:}'" >&2; exit 2 ;; esac
done
[ -x "$build/tools/tiderun" ] && [ -f "$build/libtide.so" ] ||
  { echo "$me: no tools/tiderun or libtide.so in $build: build tide first or pass --build DIR" >&2; exit 2; }
py=${PYTHON:-/usr/bin/python3}
for m in torch torchvision numpy filelock packaging; do
  $py -c "import $m" 2>/dev/null ||
    { echo "$me: $py lacks $m (scripts/install-deps.sh installs it)" >&2; exit 2; }
done

tmp=$(mktemp -d /tmp/horovod-examples.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
case " $examples " in *" mnist"*)
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    [ -f "$data/$f.gz" ] ||
      { echo "$me: $data/$f.gz missing (apt-get install dataset-fashion-mnist, or --data DIR)" >&2; exit 2; }
  done
  mkdir -p "$tmp/data/MNIST/raw"
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    gzip -dc "$data/$f.gz" > "$tmp/data/MNIST/raw/$f"
  done ;;
esac
cp "$src/bench/gloo_hvd.py" "$tmp/gloo_hvd.py"
nocuda=(--no-cuda) host=()
if [ $cuda = 1 ]; then
  nocuda=()
  printf '#!/bin/sh\nexport TIDE_HOST_ID=rank$TIDE_RANK\nexec "$@"\n' > "$tmp/own-host.sh"
  chmod +x "$tmp/own-host.sh"
  host=("$tmp/own-host.sh")
fi
export PYTHONPATH=$tmp:$src/python${PYTHONPATH:+:$PYTHONPATH}
export TIDE_LIBRARY=$build/libtide.so
summary=$tmp/summary

# run EXAMPLE BACKEND: one example on one backend; appends its line to the summary.
run() {
  local ex=$1 be=$2 file args module=tide.torch elastic=0 out metric rc start
  shift 2
  case $ex in
    mnist*) file=examples/pytorch/pytorch_mnist.py
            args=(--epochs "$epochs" --data-dir "$tmp/data" "${nocuda[@]}") ;;
    synthetic-elastic) file=examples/elastic/pytorch/pytorch_synthetic_benchmark_elastic.py; elastic=1 ;;
    synthetic*) file=examples/pytorch/pytorch_synthetic_benchmark.py ;;
  esac
  case $ex in synthetic*)
    args=("${nocuda[@]}" --model "$model" --batch-size "$batch" --num-warmup-batches 2 --num-batches-per-iter 3
          --num-iters "$iters") ;;
  esac
  case $ex in *-fp16) args+=(--fp16-allreduce) ;; *-adasum) args+=(--use-adasum) ;; esac
  if [ ! -f "$checkout/$file" ]; then
    echo "$me: RESULT $ex $be: $file not in the checkout" >> "$summary"; return
  fi
  [ "$be" = gloo ] && module=gloo_hvd
  out=$tmp/$ex-$be.py
  sed -e '/^import horovod$/d' -e "s/^import horovod\.torch as hvd\$/import $module as hvd/" "$checkout/$file" > "$out"
  # the import lines, and nothing else
  if diff "$checkout/$file" "$out" | grep '^[<>]' | grep -qv '^[<>] import '; then
    echo "$me: $file: more than the import lines would change; not run" >&2
    echo "$me: RESULT $ex $be: not run (its import lines were not where expected)" >> "$summary"; return
  fi
  echo "== $ex on $be: $file ${args[*]} $*"
  diff "$checkout/$file" "$out"
  local launch=("$build/tools/tiderun" -np "$np" --timeout 1800)
  [ "$be" = tide ] && [ $elastic = 1 ] && launch=("$build/tools/tiderun" --elastic --min-np "$np" --max-np "$np"
                                                   -np "$np" --timeout 1800)
  export GLOO_HVD_PORT=$((29600 + RANDOM % 1000))
  start=$(date +%s)
  (cd "$tmp" && "${launch[@]}" "${host[@]}" "$py" "$out" "${args[@]}" "$@") 2>&1 | tee "$tmp/$ex-$be.log"
  rc=${PIPESTATUS[0]}
  case $ex in
    mnist*) metric=$(grep -o 'Accuracy: [0-9.]*%' "$tmp/$ex-$be.log" | tail -1) ;;
    *) metric=$(grep -o 'Total img/sec on .*' "$tmp/$ex-$be.log" | tail -1) ;;
  esac
  echo "$me: RESULT $ex $be: ${metric:-no result printed}; $(( $(date +%s) - start )) s; exit $rc" >> "$summary"
}

for ex in $examples; do
  for be in $backends; do
    run "$ex" "$be" "$@"
  done
done
echo "== $me: $np ranks, Horovod $(git -C "$checkout" rev-parse --short HEAD 2>/dev/null || echo "(not a git tree)")"
cat "$summary"
! grep -q -e 'no result printed' -e 'exit [1-9]' -e 'not run' -e 'not in the checkout' "$summary"
