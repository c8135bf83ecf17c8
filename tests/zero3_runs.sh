#!/usr/bin/env bash
# ZeRO-3 (--fsdp full_shard) end to end on 127.0.0.1 (Gloo over TCP), `trainer launch` starting the ranks:
#  1. 2 and 3 ranks vs 1 process with the same global batch (gradient accumulation, epoch boundaries where
#     ranks 1 and 2 run idle micro-batches, split evaluation with idle batches): losses, grad norms and
#     eval_loss within 1e-5 relative per step for GPT-2 (tied head, uneven shards) and Llama (GQA, untied
#     head), with gradient checkpointing, collectives of 1 MB (the embedding in 7 chunks), SGD and dropout;
#     bf16 and fp16 within their bounds; a rerun, every fsdp_config prefetch mode and --deepspeed's stage 3
#     (offload_optimizer cpu) bit-identical;
#  2. memory: each rank's peak below ZeRO-2's and DDP's at 3 ranks (Llama, 8 layers), optimizer state 1/3 of
#     DDP's; `trainer estimate --world_size N --fsdp full_shard` equal to rank 0's measured peak;
#  3. checkpoints: the saved weights evaluate as the one-process run's (within 1e-5); resume bit-exact at the
#     same world size, and across stages and world sizes within 1e-5 (ZeRO-3 at 2 from ZeRO-3 at 3, ZeRO-2
#     and DDP at 2 from ZeRO-3, ZeRO-3 from ZeRO-2 and from one process; bf16 at the same size bit-exact);
#  4. bad input: full_shard with torch_compile, with shard_grad_op, with an optimizer that needs whole tensors,
#     an fsdp_config value or key that is not HF's.
# Usage: zero3_runs.sh TRAINER TOKENIZER_DIR TEXT WORK_DIR
set -euo pipefail
suite=zero3_runs
source "$(dirname "$0")/dist_lib.sh"

# 1. World sizes 1, 2, 3 with the same global batch of 6 sequences x 2 accumulation steps.
one gpt2_w1 6 --config_name gpt2.json
many full_w2 2 3 --config_name gpt2.json --fsdp full_shard
many full_w3 3 2 --config_name gpt2.json --fsdp "full_shard auto_wrap"
grep -q "x 3 processes (ZeRO-3 full_shard over gloo" full_w3.log || fail "the sharded run does not say so"
compare gpt2_w1 full_w2 1e-5
compare gpt2_w1 full_w3 1e-5
# --deepspeed's stage 3 with offload_optimizer cpu: --fsdp "full_shard offload", whose bits are full_shard's.
echo '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "stage3_prefetch_bucket_size": "auto",
  "stage3_param_persistence_threshold": "auto", "stage3_gather_16bit_weights_on_model_save": true},
  "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto"}' >ds_zero3.json
many ds_full_w2 2 3 --config_name gpt2.json --deepspeed ds_zero3.json
compare full_w2 ds_full_w2 0
one llama_w1 6 --config_name llama.json
many llama_full_w3 3 2 --config_name llama.json --fsdp full_shard
compare llama_w1 llama_full_w3 1e-5
one ckpt_w1 6 --config_name llama.json --gradient_checkpointing
many ckpt_full_w2 2 3 --config_name llama.json --fsdp full_shard --gradient_checkpointing --ddp_bucket_cap_mb 1
compare ckpt_w1 ckpt_full_w2 1e-5
compare llama_w1 ckpt_w1 1e-6
one sgd_w1 6 --config_name gpt2.json --optim sgd --optim_args momentum=0.9
many sgd_full_w3 3 2 --config_name gpt2.json --optim sgd --optim_args momentum=0.9 --fsdp full_shard
compare sgd_w1 sgd_full_w3 1e-5
one rms_w1 6 --config_name gpt2.json --optim rmsprop --optim_args momentum=0.9 --learning_rate 1e-3
many rms_full_w2 2 3 --config_name gpt2.json --optim rmsprop --optim_args momentum=0.9 --learning_rate 1e-3 --fsdp full_shard
compare rms_w1 rms_full_w2 1e-5
one bf16_w1 6 --config_name llama.json --bf16
many bf16_full_w2 2 3 --config_name llama.json --bf16 --fsdp full_shard
compare bf16_w1 bf16_full_w2 1e-3 1 loss,eval_loss
one fp16_w1 6 --config_name llama.json --fp16
many fp16_full_w3 3 2 --config_name llama.json --fp16 --fsdp full_shard
compare fp16_w1 fp16_full_w3 1e-3 1 loss,eval_loss
# Dropout (GPT-2's 0.1 everywhere), with gradient checkpointing replaying it: each rank draws its rows' part
# of the single process's masks.
sed 's/"resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0/"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1/' \
  gpt2.json >dropout.json
one drop_w1 6 --config_name dropout.json
many drop_full_w3 3 2 --config_name dropout.json --fsdp full_shard --gradient_checkpointing
compare drop_w1 drop_full_w3 1e-5
many full_w3_again 3 2 --config_name gpt2.json --fsdp full_shard
compare full_w3 full_w3_again 0
# HF's fsdp_config prefetch keys move gathers onto the communication thread earlier or later: the same bits.
echo '{"fsdp_forward_prefetch": true, "backward_prefetch": "backward_post", "transformer_layer_cls_to_wrap": ["GPT2Block"]}' >post.json
echo '{"forward_prefetch": false, "backward_prefetch": "no_prefetch"}' >none.json
many full_w3_post 3 2 --config_name gpt2.json --fsdp full_shard --fsdp_config post.json
compare full_w3 full_w3_post 0
many full_w3_none 3 2 --config_name gpt2.json --fsdp full_shard --fsdp_config none.json
compare full_w3 full_w3_none 0
# Untied (Llama): the head's unit is reduced first, and backward_post prefetches the last layer then.
many llama_full_w3_post 3 2 --config_name llama.json --fsdp full_shard --fsdp_config post.json
compare llama_full_w3 llama_full_w3_post 0

# 2. Memory: a Llama of 8 layers of hidden 256 (7.1M parameters in layers beside the tied 12.9M embedding).
echo '{"model_type": "llama", "vocab_size": 50257, "hidden_size": 256, "intermediate_size": 1024,
  "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
  "tie_word_embeddings": true}' >wide.json
mem=(--config_name wide.json --max_steps 2 --do_eval false --eval_strategy no --save_strategy no)
many mem_full 3 2 "${mem[@]}" --fsdp full_shard
many mem_zero2 3 2 "${mem[@]}" --fsdp shard_grad_op
many mem_ddp 3 2 "${mem[@]}"
python3 - <<'PY' || fail "per-rank memory"
import json
f, z, d = (json.load(open(f"{n}/train_results.json")) for n in ("mem_full", "mem_zero2", "mem_ddp"))
assert f["fsdp"] == "full_shard" and z["fsdp"] == "shard_grad_op" and d["fsdp"] == "", (f["fsdp"], z["fsdp"])
fp, zp, dp = (r["train_peak_memory_gib_per_rank"] for r in (f, z, d))
assert len(fp) == 3 and all(a < b < c for a, b, c in zip(fp, zp, dp)), (fp, zp, dp)
fs, ds = f["optimizer_state_gib_per_rank"], d["optimizer_state_gib_per_rank"]
assert all(abs(x / ds[0] - 1 / 3) < 0.01 for x in fs), (fs, ds)
mb = lambda v: f"{v[0] * 2**30 / 1e6:.1f} MB"
print(f"zero3_runs: rank 0's peak: full_shard {mb(fp)}, shard_grad_op {mb(zp)}, DDP {mb(dp)}")
PY

# `trainer estimate --world_size N --fsdp full_shard` predicts rank 0's measured peak to the byte.
predict full_shard full_w2 2 3 gpt2.json
predict full_shard full_w3 3 2 gpt2.json
predict full_shard llama_full_w3 3 2 llama.json
predict full_shard ckpt_full_w2 2 3 llama.json --gradient_checkpointing --ddp_bucket_cap_mb 1
predict full_shard bf16_full_w2 2 3 llama.json --bf16
predict full_shard full_w3_post 3 2 gpt2.json --fsdp_config post.json
predict full_shard full_w3_none 3 2 gpt2.json --fsdp_config none.json
# The set-up makes one parameter at a time, so no rank holds the whole fp32 model (the estimate's set-up peak
# is the measured one above). The tiny models' embedding is most of them: a Llama-3.1-8B shape at 8 ranks shows it.
echo '{"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192}' >l8b.json
"$trainer" estimate --config_name l8b.json --block_size 2048 --per_device_train_batch_size 1 --bf16 \
  --gradient_checkpointing --world_size 8 --fsdp full_shard --json >l8b.est.json
python3 - l8b.est.json <<'PY' || fail "the 8B set-up or save holds the whole fp32 model"
import json, sys
e = json.load(open(sys.argv[1]))
whole = 4 * e["parameters"]
print(f"zero3_runs: 8B at 8 ranks: set-up peak {e['setup_peak_bytes'] / 2**30:.2f} GiB per rank, the whole fp32 "
      f"model {whole / 2**30:.2f} GiB, step peak {e['peak_bytes'] / 2**30:.2f} GiB, checkpoint save "
      f"{e['save_peak_bytes'] / 2**30:.2f} GiB")
# A save streams the masters one parameter at a time: it stays below the step (whole: 44.88 GiB).
sys.exit(0 if e["setup_peak_bytes"] < 0.25 * whole and 0 < e["save_peak_bytes"] < e["peak_bytes"] else 1)
PY

# 3. Checkpoints. The final weights (gathered from the shards) evaluate as the one-process run's.
evals() {  # RUN: eval_loss of its saved folder
  "$trainer" eval --model_name_or_path "$1" --train_file "$text" --block_size 16 --validation_split_percentage 20 \
    --per_device_eval_batch_size 2 --use_cpu --output_dir "$1.eval" >"$1.eval.log" 2>&1 || { cat "$1.eval.log"; fail "eval $1"; }
  python3 -c "import json; print(json.load(open('$1.eval/eval_results.json'))['eval_loss'])"
}
a=$(evals gpt2_w1) b=$(evals full_w3)
python3 -c "import sys; a, b = map(float, sys.argv[1:]); assert abs(a - b) <= 1e-5 * a, (a, b)" "$a" "$b" ||
  fail "saved weights: eval_loss $b, one process $a"
echo "zero3_runs: saved weights evaluate to $b (one process: $a)"
for k in 0 1 2; do [[ -s full_w3/checkpoint-4/optimizer.rank-$k.safetensors ]] || fail "no optimizer.rank-$k"; done
many resume_w3 3 2 --config_name gpt2.json --fsdp full_shard --resume_from_checkpoint full_w3/checkpoint-4
compare full_w3 resume_w3 0 5
many resume_w2 2 3 --config_name gpt2.json --fsdp full_shard --resume_from_checkpoint full_w3/checkpoint-4
compare full_w3 resume_w2 1e-5 5
many resume_zero2_w2 2 3 --config_name gpt2.json --fsdp shard_grad_op --resume_from_checkpoint full_w3/checkpoint-4
compare full_w3 resume_zero2_w2 1e-5 5
many resume_ddp_w2 2 3 --config_name gpt2.json --resume_from_checkpoint full_w3/checkpoint-4
compare full_w3 resume_ddp_w2 1e-5 5
many zero2_w3 3 2 --config_name gpt2.json --fsdp shard_grad_op
many from_zero2 2 3 --config_name gpt2.json --fsdp full_shard --resume_from_checkpoint zero2_w3/checkpoint-4
compare gpt2_w1 from_zero2 1e-5 5
many from_w1 3 2 --config_name gpt2.json --fsdp full_shard --resume_from_checkpoint gpt2_w1/checkpoint-4
compare gpt2_w1 from_w1 1e-5 5
many bf16_resume_w2 2 3 --config_name llama.json --bf16 --fsdp full_shard --resume_from_checkpoint bf16_full_w2/checkpoint-4
compare bf16_full_w2 bf16_resume_w2 0 5

# 4. Bad input: one message each, non-zero exit, before any training.
refused() {  # NAME EXPECTED_MESSAGE FLAGS...
  local name=$1 want=$2; shift 2
  next_port
  local rc=0
  "$trainer" launch --nproc_per_node 2 --master_port "$port" train "${common[@]}" --config_name gpt2.json \
    --per_device_train_batch_size 3 --output_dir "$name" "$@" >"$name.log" 2>&1 || rc=$?
  [[ $rc == 1 ]] && grep -q "error: $want" "$name.log" || { cat "$name.log"; fail "$name"; }
}
refused bad_compile "--fsdp full_shard with --torch_compile: the captured step replays fixed parameter addresses" \
  --fsdp full_shard --torch_compile
refused bad_both "--fsdp full_shard shard_grad_op: full_shard, shard_grad_op, hybrid_shard and hybrid_shard_zero2 are sharding strategies" \
  --fsdp "full_shard shard_grad_op"
refused bad_optim "--fsdp full_shard with --optim adafactor: sharding splits tensors" --fsdp full_shard --optim adafactor
echo '{"backward_prefetch": "BACKWARD_PRE", "forward_prefetc": true}' >typo.json
refused bad_config1 "--fsdp_config typo.json: backward_prefetch is \"BACKWARD_PRE\", expected \"backward_pre\", \"backward_post\" or \"no_prefetch\"" \
  --fsdp full_shard --fsdp_config typo.json
echo '{"forward_prefetc": true}' >typo.json
refused bad_config2 "--fsdp_config typo.json: unknown FSDP option 'forward_prefetc'.*did you mean 'forward_prefetch'" \
  --fsdp full_shard --fsdp_config typo.json
echo "zero3_runs: OK"
