#!/usr/bin/env bash
# Installs what detr-c needs to build and test on a fresh Debian 12 machine (idempotent).
set -euo pipefail
packages=(build-essential cmake pkg-config libopenblas-openmp-dev check libsubunit-dev zlib1g-dev libyajl-dev libstb-dev
          openmpi-bin libopenmpi-dev   # data-parallel training (optional at build time)
          libdnnl-dev                  # oneDNN: CPU convolution (optional at build time)
          clang libclang-rt-dev libomp-dev  # the fuzz harnesses: clang, its libFuzzer runtime and OpenMP
          clang-format                     # the layout check (tools/format.sh)
          protobuf-c-compiler libprotobuf-c-dev  # TensorBoard event files (train/tensorboard.c)
          python3-venv)                          # tools/test.sh's venv for TensorBoard's reader
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
