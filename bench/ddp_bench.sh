#!/usr/bin/env bash
# DDP, ZeRO-2 and ZeRO-3 on one host: the same global batch trained by 1 process (all cores) and by N
# processes (cores split, Gloo over 127.0.0.1) under DDP, --fsdp shard_grad_op and --fsdp full_shard;
# GPT-2 n_embd 256 x 4 layers,
# block 128, global batch 8, fp32 unless a flag says otherwise. Prints tokens/s of each, their ratio, this
# rank's bytes handed to collectives per step (DDP: the gradient all-reduce, 4 bytes x parameters, plus the
# token count, loss and stop flag; ZeRO-2: the reduce-scatter's input and the all-gather; ZeRO-3: each
# layer's gathers for forward and backward and its gradient pieces every micro-batch), the share of step
# time the training thread waited on collectives (buckets still in flight when backward ended, the small
# reductions; ZeRO-2's reduce-scatter and all-gather block), rank 0's peak memory and each rank's optimizer
# state. Usage: bench/ddp_bench.sh TRAINER TOKENIZER CORPUS [STEPS=30] [NPROC=2] [WORKDIR=/tmp/trainer-ddp]
# [TRAIN FLAGS...] (added to every run, e.g. --bf16). DDP_BENCH_MODEL=llama trains a Llama of hidden 256 x 8
# layers with an untied head instead (its head's gradients are final first, its embeddings' last: the case
# where ZeRO's reductions can overlap most of the backward).
set -euo pipefail
trainer=$1 tok=$2 corpus=$3 steps=${4:-30} nproc=${5:-2} work=${6:-/tmp/trainer-ddp}
shift $(($# < 6 ? $# : 6))
rm -rf "$work" && mkdir -p "$work"
if [[ ${DDP_BENCH_MODEL:-gpt2} == llama ]]; then
  echo '{"model_type": "llama", "vocab_size": 50257, "hidden_size": 256, "intermediate_size": 1024,
    "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
    "tie_word_embeddings": false}' >"$work/config.json"
else
  echo '{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 256, "n_layer": 4, "n_head": 4, "n_positions": 128}' \
    >"$work/config.json"
fi
common=(--config_name "$work/config.json" --tokenizer_name "$tok" --train_file "$corpus" --block_size 128
        --learning_rate 6e-4 --max_steps "$steps" --logging_steps 10 --save_strategy no --use_cpu "$@")
"$trainer" train "${common[@]}" --per_device_train_batch_size 8 --output_dir "$work/one" >"$work/one.log" 2>&1 ||
  { tail "$work/one.log"; exit 1; }
"$trainer" launch --nproc_per_node "$nproc" --master_port $((20000 + $$ % 12000)) train "${common[@]}" \
  --per_device_train_batch_size $((8 / nproc)) --output_dir "$work/ddp" >"$work/ddp.log" 2>&1 ||
  { tail "$work/ddp.log"; exit 1; }
"$trainer" launch --nproc_per_node "$nproc" --master_port $((20001 + $$ % 12000)) train "${common[@]}" \
  --per_device_train_batch_size $((8 / nproc)) --output_dir "$work/zero" --fsdp shard_grad_op >"$work/zero.log" 2>&1 ||
  { tail "$work/zero.log"; exit 1; }
"$trainer" launch --nproc_per_node "$nproc" --master_port $((20002 + $$ % 12000)) train "${common[@]}" \
  --per_device_train_batch_size $((8 / nproc)) --output_dir "$work/zero3" --fsdp full_shard >"$work/zero3.log" 2>&1 ||
  { tail "$work/zero3.log"; exit 1; }
python3 - "$work" "$nproc" <<'PY'
import json, sys
work, n = sys.argv[1], int(sys.argv[2])
one = json.load(open(f"{work}/one/train_results.json"))
ddp = json.load(open(f"{work}/ddp/train_results.json"))
zero = json.load(open(f"{work}/zero/train_results.json"))
zero3 = json.load(open(f"{work}/zero3/train_results.json"))
opt_mb = lambda r: r["optimizer_state_gib_per_rank"][0] * 2**30 / 1e6
print(f"{'run':<32}{'tokens/s':>10}{'peak GiB':>10}{'optim MB/rank':>15}{'comm MB/step':>14}{'wait share':>12}")
print(f"{'1 process':<32}{one['train_tokens_per_second']:>10.0f}{one['train_peak_memory_gib']:>10.3f}{'-':>15}"
      f"{'-':>14}{'-':>12}")
for name, r in ((f"{n} processes (DDP, gloo)", ddp), (f"{n} processes (ZeRO-2, gloo)", zero),
                (f"{n} processes (ZeRO-3, gloo)", zero3)):
    print(f"{name:<32}{r['train_tokens_per_second']:>10.0f}{r['train_peak_memory_gib']:>10.3f}{opt_mb(r):>15.1f}"
          f"{r['ddp_comm_bytes_per_step'] / 1e6:>14.1f}{100 * r['ddp_comm_wait_share']:>11.1f}%")
tps = lambda r: r["train_tokens_per_second"] / one["train_tokens_per_second"]
print(f"ratio to 1 process: DDP {tps(ddp):.2f}x, ZeRO-2 {tps(zero):.2f}x, ZeRO-3 {tps(zero3):.2f}x; mean loss "
      f"{one['train_loss']:.4f} vs {ddp['train_loss']:.4f} vs {zero['train_loss']:.4f} vs {zero3['train_loss']:.4f}")
PY
