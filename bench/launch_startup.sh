#!/usr/bin/env bash
# A launched run's start-up cost: `trainer launch --nproc_per_node P train` for one step on a text file that
# every run tokenizes (a tiny GPT-2, so the tokenization and the rendezvous are most of it), wall and CPU
# seconds per trainer binary, alternating - to compare builds (e.g. one tokenization for all ranks).
# Usage: bench/launch_startup.sh TOKENIZER_DIR TEXT NPROC ROUNDS TRAINER [TRAINER...]
set -euo pipefail
tok=$1 text=$2 nproc=$3 rounds=$4
shift 4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo '{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}' \
  >"$work/gpt2.json"
for r in $(seq "$rounds"); do
  for t in "$@"; do
    port=$((22000 + RANDOM % 8000))
    /usr/bin/time -f "$t: wall %e s, cpu %U + %S s" "$t" launch --nproc_per_node "$nproc" --master_port "$port" \
      train --config_name "$work/gpt2.json" --tokenizer_name "$tok" --train_file "$text" --block_size 64 \
      --per_device_train_batch_size 2 --max_steps 1 --use_cpu --save_strategy no --output_dir "$work/run" \
      --overwrite_output_dir >"$work/log" 2>&1 || { tail "$work/log"; exit 1; }
    tail -n 1 "$work/log"
  done
done
