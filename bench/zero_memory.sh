#!/usr/bin/env bash
# Per-rank memory of DDP vs ZeRO-2 (--fsdp shard_grad_op) vs ZeRO-3 (--fsdp full_shard) at world sizes 1-8,
# from `trainer estimate`'s dry run on the meta device (exact against measured CPU runs: tests/zero_runs.sh,
# tests/zero3_runs.sh): GPT-2 124M (bf16, block 1024,
# batch 8) and a Llama-3.2-1B shape (bf16, block 2048, batch 1, gradient checkpointing), AdamW. Prints the
# peak, where it falls, and the persistent parts that shard (fp32 master slices and reduced gradients,
# optimizer state; *: DDP whole fp32 masters, ZeRO-2/3 this rank's master slices plus its reduced gradient
# shard).
# Usage: bench/zero_memory.sh TRAINER [WORKDIR=/tmp/trainer-zero-memory]
set -euo pipefail
trainer=$1 work=${2:-/tmp/trainer-zero-memory}
mkdir -p "$work"
echo '{"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
  "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
  "tie_word_embeddings": true, "rope_theta": 500000.0, "rms_norm_eps": 1e-5}' >"$work/llama1b.json"
# --save_strategy no: the step's memory (a save gathers rank 0's whole fp32 masters, docs/PERFORMANCE.md).
models=("GPT-2 124M|--config_name gpt2 --block_size 1024 --per_device_train_batch_size 8 --bf16 --save_strategy no"
        "Llama 1B|--config_name $work/llama1b.json --block_size 2048 --per_device_train_batch_size 1 --bf16 --gradient_checkpointing --save_strategy no")
printf '%-11s %-6s %-7s %10s %14s %14s  %s\n' model mode world "peak GiB" "fp32 masters*" "optim state" "peak at"
for m in "${models[@]}"; do
  name=${m%%|*}
  read -r -a flags <<<"${m#*|}"
  for mode in DDP ZeRO-2 ZeRO-3; do
    for world in 1 2 4 8; do
      [[ $mode != DDP && $world == 1 ]] && continue
      extra=(); [[ $mode == ZeRO-2 ]] && extra=(--fsdp shard_grad_op); [[ $mode == ZeRO-3 ]] && extra=(--fsdp full_shard)
      "$trainer" estimate "${flags[@]}" --world_size "$world" "${extra[@]}" --json >"$work/e.json"
      python3 - "$work/e.json" "$name" "$mode" "$world" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
b = j["breakdown"]
shard = next(v for k, v in b.items() if k.startswith("fp32 masters"))
print(f"{sys.argv[2]:<11} {sys.argv[3]:<6} {sys.argv[4]:<7} {j['peak_bytes'] / 2**30:>10.3f} {shard / 2**30:>14.3f} "
      f"{b['optimizer state'] / 2**30:>14.3f}  {j['peak_at']}")
PY
    done
  done
done
