#!/usr/bin/env bash
# Shared preamble of test.sh, train.sh and bench.sh (source it): installs what is missing, pins OpenBLAS's
# core type, configures and builds. Sets `preset` (release with CUDA when nvcc is present, else cpu).
# Usage: source scripts/prepare.sh [--bench] [build targets...]
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Debian's OpenBLAS 0.3.21 misbehaves on these CPUs unless its core type is pinned; keep a caller's choice.
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
setup_args=()
if [[ "${1:-}" == "--bench" ]]; then setup_args+=(--bench); shift; fi
scripts/setup.sh "${setup_args[@]}"
preset=release
[[ -x /usr/local/cuda/bin/nvcc ]] || preset=cpu
cmake --preset "$preset" >/dev/null
if (($#)); then cmake --build --preset "$preset" --target "$@"; else cmake --build --preset "$preset"; fi
