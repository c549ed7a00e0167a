#!/usr/bin/env bash
# The GPU check of tide's CUDA path (docs/performance.md records its output):
# test_gpu (the kernels against the CPU selectors), test/torch/test_cuda.py
# (tide.torch.topk against torch.topk, collectives and DistributedOptimizer on
# CUDA tensors from 2 processes sharing the GPU), bench/topk_gpu.py against
# torch.topk (5 launches), and the Fashion-MNIST example with hitopk on CUDA
# against the same run on the CPU; then a table. About 3-5 minutes on one GPU.
#
#   scripts/gpu-check.sh                 on a GPU machine with tide's Debian
#                                        packages: builds (make build), runs
#   scripts/gpu-check.sh --bundle        here, without a GPU: builds and packs
#                                        what the check needs into .gpu-bundle/
#                                        (libtide and the tools with the shared
#                                        libraries they use, a Fashion-MNIST
#                                        subset), for a GPU machine that lacks
#                                        those packages (the lent ones do)
#   scripts/gpu-check.sh --from-bundle   there: runs from .gpu-bundle/
#
# BASELINE=path/to/libtide.so (with --bundle, or on a GPU machine): also
# benchmarks that build of libtide at 25.5M elements, in the same run, for
# a before/after on the same GPU.
#
# Writes the log and the benchmark's JSON lines to $OUT when set (else
# gpu-check-out/). BUILD names the build directory (default build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mode=${1:-build}
bundle=$root/.gpu-bundle
build=${BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac

if [ "$mode" = "--bundle" ]; then
  make build BUILD="$build" >/dev/null
  rm -rf "$bundle"
  mkdir -p "$bundle/stage/lib" "$bundle/stage/bin" "$bundle/stage/data"
  cp -L "$build/libtide.so.0" "$bundle/stage/lib/"
  cp "$build/tools/tiderun" "$build/tools/tide" "$build/test/test_gpu" "$bundle/stage/bin/"
  if [ -n "${BASELINE:-}" ]; then mkdir -p "$bundle/stage/baseline" && cp -L "$BASELINE" "$bundle/stage/baseline/libtide.so.0"; fi
  # Every shared library they load except glibc's own (the GPU machine has its own).
  for f in "$build/libtide.so.0" "$build/tools/tiderun" "$build/test/test_gpu"; do
    ldd "$f" | awk '$3 ~ /^\// {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libgcc_s.so*|ld-linux*) ;;
      *) cp -L "$lib" "$bundle/stage/lib/" ;;
    esac
  done
  # They find each other through DT_RPATH (inherited down the chain of
  # dependencies, unlike RUNPATH), not LD_LIBRARY_PATH: python3's own libz,
  # libssl and libffi stay the GPU machine's.
  command -v patchelf >/dev/null || { echo "gpu-check: --bundle needs patchelf (apt-get install patchelf)" >&2; exit 1; }
  for f in "$bundle"/stage/lib/*; do patchelf --force-rpath --set-rpath '$ORIGIN' "$f"; done
  for f in "$bundle"/stage/bin/* "$bundle"/stage/baseline/*; do
    [ -e "$f" ] && patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$f"
  done
  /usr/bin/python3 - "$bundle/stage/data" <<'EOF'
import gzip, sys
src, out = "/usr/share/datasets/fashion-mnist", sys.argv[1]
for kind, n in (("train", 20000), ("t10k", 5000)):
    with gzip.open("%s/%s-images-idx3-ubyte.gz" % (src, kind)) as f:
        img = f.read()
    with gzip.open("%s/%s-labels-idx1-ubyte.gz" % (src, kind)) as f:
        lab = f.read()
    head = bytearray(img[:16]); head[4:8] = n.to_bytes(4, "big")
    with gzip.open("%s/%s-images-idx3-ubyte.gz" % (out, kind), "wb") as f:
        f.write(bytes(head) + img[16:16 + n * 784])
    lhead = bytearray(lab[:8]); lhead[4:8] = n.to_bytes(4, "big")
    with gzip.open("%s/%s-labels-idx1-ubyte.gz" % (out, kind), "wb") as f:
        f.write(bytes(lhead) + lab[8:8 + n])
EOF
  tar -C "$bundle/stage" -cf - . | xz -T2 -1 >"$bundle/bundle.tar.xz"
  rm -rf "$bundle/stage"
  du -sh "$bundle/bundle.tar.xz"
  exit 0
fi

out=${OUT:-$root/gpu-check-out}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1

py=python3
if [ "$mode" = "--from-bundle" ]; then
  run=/tmp/tide-gpu-bundle
  rm -rf "$run"
  mkdir -p "$run"
  tar -C "$run" -xJf "$bundle/bundle.tar.xz"
  export TIDE_LIBRARY="$run/lib/libtide.so.0" TIDE_TOOLS_DIR="$run/bin"
  [ -e "$run/baseline/libtide.so.0" ] && BASELINE=$run/baseline/libtide.so.0
  bin=$run/bin
  data=$run/data
else
  make build BUILD="$build" >/dev/null
  export TIDE_LIBRARY="$build/libtide.so" TIDE_TOOLS_DIR="$build/tools"
  bin=$build/test
  data=/usr/share/datasets/fashion-mnist
  [ -x /usr/bin/python3 ] && py=/usr/bin/python3
fi
# NVRTC: the CUDA toolkit's, else the one torch's wheels bring.
if [ -z "${TIDE_NVRTC_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
  for f in /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda-*/lib64/libnvrtc.so* \
           $($py -c "import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))" 2>/dev/null)/nvidia/*/lib/libnvrtc.so*; do
    if [ -e "$f" ]; then export TIDE_NVRTC_LIBRARY=$f; break; fi
  done
fi
export PYTHONPATH="$root/python" PYTHONUNBUFFERED=1 TIDE_SOURCE_DIR="$root" TIDE_GPU_CACHE=/tmp/tide-gpu-cache

echo "== gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo '?')"
$py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
status=0
step() { # name, command...
  local name=$1
  shift
  local t0=$SECONDS
  if "$@"; then echo "== $name: passed ($((SECONDS - t0)) s)"; else echo "== $name: FAILED ($((SECONDS - t0)) s)"; status=1; fi
}

step "test_gpu (kernels against the CPU selectors)" "$bin/test_gpu"
step "test_gpu with TIDE_GPU_GRAPHS=0 (every kernel launched by itself)" env TIDE_GPU_GRAPHS=0 "$bin/test_gpu"
step "test_cuda.py (tide.torch on CUDA tensors)" $py test/torch/test_cuda.py

: >"$out/topk_gpu.jsonl"
for launch in 1 2 3 4 5; do
  step "topk_gpu launch $launch" sh -c "$py bench/topk_gpu.py --json >> '$out/topk_gpu.jsonl'"
done

# The same at 25.5M with graphs off: what the graph replay is worth.
: >"$out/topk_gpu_nographs.jsonl"
for launch in 1 2 3; do
  step "topk_gpu launch $launch at 25.5M, TIDE_GPU_GRAPHS=0" sh -c "TIDE_GPU_GRAPHS=0 $py bench/topk_gpu.py \
    --sizes 25500000 --json >> '$out/topk_gpu_nographs.jsonl'"
done

step "topk_gpu kernel profile at 25.5M, 0.1%" $py bench/topk_gpu.py --sizes 25500000 --density 0.001 --dists normal \
  --repeats 5 --profile
if [ -n "${BASELINE:-}" ]; then
  : >"$out/topk_gpu_baseline.jsonl"
  for launch in 1 2 3; do
    step "topk_gpu baseline launch $launch ($BASELINE)" sh -c "TIDE_LIBRARY='$BASELINE' $py bench/topk_gpu.py \
      --sizes 25500000 --json >> '$out/topk_gpu_baseline.jsonl'"
  done
fi

for device in cpu cuda; do
  step "fashion-mnist mlp hitopk:0.01 on $device" "$TIDE_TOOLS_DIR/tiderun" -np 2 $py examples/torch_fashion_mnist.py \
    --device $device --compression hitopk:0.01 --epochs 2 --data "$data" --threads 4 --json
done

echo "== topk_gpu: median over calls per launch; min-max over the 5 launches"
$py - "$out/topk_gpu.jsonl" <<'EOF'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not rows:
    sys.exit("no benchmark rows")
print("device:", rows[0]["device"])
groups = collections.OrderedDict()
for r in rows:
    groups.setdefault((r["d"], r["dist"], r["density"]), []).append(r)
def span(rs, key, fmt="%.3f"):
    v = [r[key] for r in rs]
    return (fmt % min(v)) if min(v) == max(v) else (fmt + "-" + fmt) % (min(v), max(v))
hdr = ("d", "dist", "density", "read ms", "torch.topk ms", "exact ms", "sampled ms", "mstopk ms", "mstopk mass",
       "best vs torch", "best / read")
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for (d, dist, density), rs in groups.items():
    best = [min(r["exact_ms"], r["sampled_ms"]) for r in rs]
    speed = [r["torch_ms"] / b for r, b in zip(rs, best)]
    read = [b / r["read_ms"] for r, b in zip(rs, best)]
    print("| %d | %s | %g | %s | %s | %s | %s | %s | %s | %.1f-%.1fx | %.1f-%.1fx |" % (
        d, dist, density, span(rs, "read_ms"), span(rs, "torch_ms"), span(rs, "exact_ms"), span(rs, "sampled_ms"),
        span(rs, "mstopk_ms"), span(rs, "mstopk_mass", "%.4f"), min(speed), max(speed), min(read), max(read)))
EOF
for f in nographs baseline; do
  [ -s "$out/topk_gpu_$f.jsonl" ] || continue
  echo "== $f at 25.5M: fastest exact-k selector vs torch.topk, and sampled ms, min-max over 3 launches"
  $py - "$out/topk_gpu_$f.jsonl" <<'EOF2'
import json, sys, collections
g = collections.OrderedDict()
for l in open(sys.argv[1]):
    if l.strip():
        r = json.loads(l)
        g.setdefault((r["dist"], r["density"]), []).append(r)
for (dist, density), rs in g.items():
    v = [r["torch_ms"] / min(r["exact_ms"], r["sampled_ms"]) for r in rs]
    s = [r["sampled_ms"] for r in rs]
    print("| %s | %g | %.1f-%.1fx | sampled %.3f-%.3f ms |" % (dist, density, min(v), max(v), min(s), max(s)))
EOF2
done
grep -h '"final_accuracy"' "$out/gpu-check.log" | sed 's/^\[[0-9]*\] //' || true
echo "== gpu-check: $([ $status = 0 ] && echo all passed || echo FAILURES above)"
exit $status
