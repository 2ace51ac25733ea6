#!/usr/bin/env bash
# Installs every Debian package gflow needs to build, test and benchmark.
# Idempotent: packages already present are left alone. Run as root (or via sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config g++ clang
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  clang-format
  # peers for side-by-side benchmarks (bench/compare)
  libgloo-dev openmpi-bin libopenmpi-dev
  # later issues: topology, verbs, python
  libhwloc-dev libibverbs-dev
  # the PMIx bootstrap: <pmix.h> at build time (libpmix2 is loaded at run time;
  # Slurm's PMIx plugin also loads the unversioned libpmix.so that -dev ships)
  libpmix-dev
  # tests/netns/test_srun.sh: a throwaway Slurm cluster (srun --mpi=pmix)
  slurmd slurmctld slurm-client
  # multi-host tests (network namespaces) and tooling
  iproute2 procps python3
  # examples/digits_train: zlib, and the digits data shipped by scikit-learn
  zlib1g-dev python3-sklearn
  # python/: the pybind11 module, the torch.distributed backend (libtorch),
  # pytest, and pip packaging with Debian's setuptools (docs/python.md)
  python3-dev pybind11-dev python3-numpy python3-pytest python3-setuptools python3-pip
  python3-wheel python3-torch libtorch-dev
  # bench/train: the synthetic DDP benchmark's models and its plots
  python3-torchvision python3-matplotlib
  # scripts/torch2_tests.sh: a Debian trixie chroot with torch 2.x
  debootstrap
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
