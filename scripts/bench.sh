#!/usr/bin/env bash
# Builds and runs the CPU benchmarks next to PyTorch CPU (Debian's python3-torch), same machine, same run.
set -euo pipefail
source "$(dirname "$0")/prepare.sh" --bench
"build/$preset/bench/bench_ops" 10
"build/$preset/bench/bench_block" 10
# Attention forward+backward, T = 64 .. 4096: the fused kernel, the blocked form, eager (ours only).
"build/$preset/bench/bench_attention" 5
# Whole training runs: the same GPT-2 (same init, same batches) through `trainer train` and PyTorch CPU; loss
# curves must agree (exit 1 otherwise), tokens/s and peak RSS as ratios (bench/train_side_by_side.py).
"${TRAINER_TORCH_PYTHON:-/usr/bin/python3}" bench/train_side_by_side.py --trainer "build/$preset/trainer"
# The guide's feature table on ours: each feature alone against a baseline, speed and memory ratios.
"${TRAINER_TORCH_PYTHON:-/usr/bin/python3}" bench/guide_table.py --trainer "build/$preset/trainer"
