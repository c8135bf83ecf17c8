#!/usr/bin/env bash
# Formats the C++/CUDA sources with the checked-in .clang-format; --check lists files that differ instead.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files 'src/*' 'tests/*' 'bench/*' | grep -E '\.(cpp|h|cu|cuh)$')
if [[ "${1:-}" == "--check" ]]; then
  bad=0
  for f in $files; do clang-format "$f" | cmp -s - "$f" || { echo "needs formatting: $f"; bad=1; }; done
  exit $bad
fi
clang-format -i $files
