#!/usr/bin/env bash
# The test command: install what is missing, build (CUDA backend included when nvcc is present), run ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's OpenBLAS 0.3.21 misbehaves on these CPUs unless its core type is pinned; keep a caller's choice.
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
scripts/setup.sh
preset=release
[[ -x /usr/local/cuda/bin/nvcc ]] || preset=cpu
cmake --preset "$preset"
cmake --build --preset "$preset"
ctest --preset "$preset" -j2 "$@"
