#!/usr/bin/env bash
# Training a model split by --device_map auto (HF's naive pipeline) over host partitions cpu:1, cpu:2 - to
# every op devices as distinct as two GPUs - against the same run on one device:
#  1. Llama (untied head) and GPT-2 (tied head), with gradient accumulation, clipping, an epoch boundary and
#     evaluation: losses, grad norms and eval_loss bit-identical per step; also bf16, fp16 (loss scaling),
#     gradient checkpointing, SGD with momentum, Adafactor and 8-bit AdamW;
#  2. the split run's checkpoint resumes split and on one device, and one device's split, bit-identical to
#     the uninterrupted runs;
#  3. refused before any work: --fsdp, --torch_compile, batch size auto, --max_memory without auto; a launched
#     world once the ranks have built the model.
# Usage: device_map_runs.sh TRAINER TOKENIZER_DIR TEXT WORK_DIR
set -euo pipefail
suite=device_map_runs
source "$(dirname "$0")/dist_lib.sh"

# Llama's 3.3M parameters are 12.9 MB in f32, its two untied 6.4 MB tables most of it: cpu:1 takes the
# embeddings and layer 0, cpu:2 layer 1 and the head.
split=(--device_map auto --max_memory cpu:1:7MB,cpu:2:7MB)
one llama_w1 6 --config_name llama.json
one llama_split 6 --config_name llama.json "${split[@]}"
grep -q "device_map auto: embeddings and layer 0 on cpu:1; layer 1 and the head on cpu:2; trained as a naive pipeline" llama_split.log ||
  { grep device_map llama_split.log; fail "the split is not announced"; }
compare llama_w1 llama_split 0
# Each device holds its part: both partitions peak below the one-device run (weights, gradients, moments and
# the activations of its layers).
python3 - <<'PY' || fail "per-device peaks"
import json
one = json.load(open("llama_w1/train_results.json"))["train_peak_memory_gib"]
per = json.load(open("llama_split/train_results.json"))["train_peak_memory_gib_per_device"]
print("device_map_runs: one device %.1f MiB; split %s" % (one * 1024, {d: round(g * 1024, 1) for d, g in per.items()}))
assert list(per) == ["cpu:1", "cpu:2"], per
assert all(0 < g < one for g in per.values()), (one, per)
PY
# GPT-2's tied head reads the embeddings' table: both on cpu:1 with layer 0, layer 1 on cpu:2.
one gpt2_w1 6 --config_name gpt2.json
one gpt2_split 6 --config_name gpt2.json --device_map auto --max_memory cpu:1:6500KB,cpu:2:6500KB
grep -q "device_map auto: embeddings, layer 0 and the head on cpu:1; layer 1 on cpu:2" gpt2_split.log ||
  { grep device_map gpt2_split.log; fail "gpt2's split is not announced"; }
compare gpt2_w1 gpt2_split 0
for variant in "bf16:--bf16" "fp16:--fp16" "ckpt:--gradient_checkpointing" \
  "sgd:--optim sgd --optim_args momentum=0.9" "adafactor:--optim adafactor" "adam8:--optim adamw_bnb_8bit"; do
  name=${variant%%:*}
  read -r -a flags <<<"${variant#*:}"
  one "${name}_w1" 6 --config_name llama.json "${flags[@]}"
  one "${name}_split" 6 --config_name llama.json "${flags[@]}" "${split[@]}"
  compare "${name}_w1" "${name}_split" 0
done

# 2. The split run's step-4 checkpoint, resumed split and on one device: the uninterrupted run's steps 5-8.
one resume_split 6 --config_name llama.json "${split[@]}" --resume_from_checkpoint llama_split/checkpoint-4
compare llama_split resume_split 0 5
one resume_one 6 --config_name llama.json --resume_from_checkpoint llama_split/checkpoint-4
compare llama_split resume_one 0 5
one split_from_one 6 --config_name llama.json "${split[@]}" --resume_from_checkpoint llama_w1/checkpoint-4
compare llama_w1 split_from_one 0 5

# 3. Refusals, before any work.
refused() {  # NAME EXPECTED ARGS...
  local name=$1 want=$2; shift 2
  if "$trainer" "$@" >"$name.log" 2>&1; then fail "$name was accepted"; fi
  grep -q -- "$want" "$name.log" || { cat "$name.log"; fail "$name: expected '$want'"; }
  [[ ! -e "$name" ]] || fail "$name made its output folder"
}
refused with_fsdp "a model is either split across devices or sharded across processes" train "${common[@]}" \
  --config_name llama.json --per_device_train_batch_size 6 --output_dir with_fsdp "${split[@]}" --fsdp full_shard
refused with_compile "the compiled step runs on one device" train "${common[@]}" --config_name llama.json \
  --per_device_train_batch_size 6 --output_dir with_compile "${split[@]}" --torch_compile
refused batch_auto "chosen by one device's estimate" train "${common[@]}" --config_name llama.json \
  --per_device_train_batch_size auto --output_dir batch_auto "${split[@]}"
refused max_memory_alone "goes with --device_map auto" train "${common[@]}" --config_name llama.json \
  --per_device_train_batch_size 6 --output_dir max_memory_alone --max_memory cpu:1:7MB
next_port
if "$trainer" launch --nproc_per_node 2 --master_port "$port" train "${common[@]}" --config_name llama.json \
  --per_device_train_batch_size 3 --output_dir launched "${split[@]}" >launched.log 2>&1; then
  fail "a launched split was accepted"
fi
grep -q "each process would split its own replica" launched.log || { cat launched.log; fail "launched: no reason"; }
echo "$suite: OK"
