#!/usr/bin/env bash
# Builds and runs the CPU benchmarks next to PyTorch CPU (Debian's python3-torch), same machine, same run.
set -euo pipefail
source "$(dirname "$0")/prepare.sh" --bench
"build/$preset/bench/bench_ops" 10
"build/$preset/bench/bench_block" 10
