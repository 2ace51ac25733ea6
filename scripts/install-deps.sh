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
  # multi-host tests (network namespaces) and tooling
  iproute2 procps python3
  # examples/digits_train: zlib, and the digits data shipped by scikit-learn
  zlib1g-dev python3-sklearn
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
