#!/usr/bin/env bash
# Installs snapfill's build and test dependencies from Debian's packages,
# the King James Bible (bible-kjv), the long public-domain text of the
# main job, gnuplot (gnuplot-nox), which draws `snapfill plot`'s figures, and
# OpenBLAS (libopenblas-dev), the sgemm reference rate of bench/bm_matmul_amx,
# and oneDNN (libdnnl-dev, with ocl-icd-opencl-dev that its CMake config looks
# for), a well-kept library's bf16 matmul that bench/bm_onednn times at the
# shapes of bm_matmul_amx, OpenMPI (libopenmpi-dev, openmpi-bin), with
# which `snapfill batch` runs as MPI ranks, and OpenSSL (libssl-dev), whose
# SHA-256 checks a batch manifest's inputs.
# Idempotent: packages already present are not reinstalled.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libabsl-dev libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev nlohmann-json3-dev libxxhash-dev python3 python3-pip unzip
  bible-kjv bible-kjv-text time
  sqlite3-doc
  gnuplot-nox
  libopenblas-dev
  libdnnl-dev ocl-icd-opencl-dev
  libopenmpi-dev openmpi-bin libssl-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
