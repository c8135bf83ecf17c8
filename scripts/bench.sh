#!/usr/bin/env bash
# Builds and runs the CPU benchmarks next to PyTorch CPU (Debian's python3-torch), same machine, same run.
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
scripts/setup.sh --bench
preset=release
[[ -x /usr/local/cuda/bin/nvcc ]] || preset=cpu
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
"build/$preset/bench/bench_ops" 10
"build/$preset/bench/bench_block" 10
