#!/usr/bin/env bash
# Installs the Debian packages tide needs to build, test and benchmark.
# Safe to run again: it installs only what is missing. Runs apt-get as root
# (or through sudo when available).
set -euo pipefail

# Open MPI is the default mpicc/mpirun; MPICH (mpicc.mpich, mpirun.mpich)
# sits beside it for test_mpi_mpich. clang and libclang-rt-dev build the
# libFuzzer harnesses (scripts/fuzz.sh, make fuzz). Slurm 22.05 and munge run
# the real-Slurm tests on emulated hosts (scripts/slurm-cluster.sh). GNU time
# measures peak RSS from outside (scripts/data-limits-check.sh). pytest,
# packaging, mock, cloudpickle and filelock run Horovod's test_torch.py and
# examples against tide.torch (scripts/horovod-*.sh; not needed by make test).
packages=(build-essential cmake pkg-config zlib1g-dev libopenblas-dev liblapacke-dev libhwloc-dev clang libclang-rt-dev
          openmpi-bin libopenmpi-dev mpich libmpich-dev libgloo-dev iproute2
          iptables libnetfilter-queue-dev
          dataset-fashion-mnist gnuplot-nox libnlopt-dev
          python3 python3-numpy python3-torch python3-pytest python3-packaging python3-mock python3-cloudpickle python3-filelock
          libpng-dev libjpeg62-turbo-dev libcurl4-openssl-dev lighttpd python3-torchvision
          slurm-wlm slurmctld slurmd slurm-client munge
          time)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
