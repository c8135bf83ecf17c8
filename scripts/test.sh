#!/usr/bin/env bash
# The test command: install what is missing, build (CUDA backend included when nvcc is present), run ctest.
set -euo pipefail
source "$(dirname "$0")/prepare.sh"
ctest --preset "$preset" -j2 "$@"
