#!/usr/bin/env bash
# The test command: install what is missing, build (CUDA backend included when nvcc is present), run ctest.
# Without arguments it leaves out the label `long` (the 100-signal stress run: `bash scripts/test.sh -L long`).
set -euo pipefail
source "$(dirname "$0")/prepare.sh"
if (($#)); then ctest --preset "$preset" -j2 "$@"; else ctest --preset "$preset" -j2 -LE long; fi
