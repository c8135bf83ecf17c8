#!/usr/bin/env bash
# ZeRO-2 (--fsdp shard_grad_op) end to end on 127.0.0.1 (Gloo over TCP), `trainer launch` starting the ranks:
#  1. 2 and 3 ranks vs 1 process with the same global batch (gradient accumulation, an epoch boundary with
#     an uneven last batch, split evaluation): losses, grad norms and eval_loss within 1e-5 relative per step,
#     GPT-2 (tied head, 1.6M parameters: uneven shards) and Llama (grouped-query attention, untied head);
#     bf16 within bf16's bounds; torch_compile and small collectives bit-identical; reruns bit-identical;
#  2. the checkpoint's optimizer.rank-K.safetensors, each rank's optimizer state 1/3 of DDP's at 3 ranks;
#     `trainer estimate --world_size N --fsdp shard_grad_op` equal to rank 0's measured peak (fp32, bf16);
#  3. resume: a world-3 sharded checkpoint at world 3 (bit-exact), sharded at 2, DDP at 2 and one process
#     (within 1e-5); a one-process checkpoint continued sharded at 2; SGD's momentum across world sizes;
#     Adagrad, Lion and AdEMAMix sharded as one process trains them;
#  4. SIGTERM to the launcher: one checkpoint with every rank's file, exit 0; two nodes (two launchers) equal
#     one when they share output_dir, and are refused before training when they do not;
#     --deepspeed's ZeRO-2 config the same bits as --fsdp shard_grad_op;
#  5. bad input: an optimizer that needs whole tensors, offload without a strategy, a rank file missing on
#     resume (full_shard's own: zero3_runs.sh).
# Usage: zero_runs.sh TRAINER TOKENIZER_DIR TEXT WORK_DIR
set -euo pipefail
suite=zero_runs
source "$(dirname "$0")/dist_lib.sh"

# 1. World sizes 1, 2, 3 with the same global batch of 6 sequences x 2 accumulation steps.
one gpt2_w1 6 --config_name gpt2.json
many zero_w2 2 3 --config_name gpt2.json --fsdp shard_grad_op
many zero_w3 3 2 --config_name gpt2.json --fsdp "shard_grad_op auto_wrap"
grep -q "x 3 processes (ZeRO-2 shard_grad_op over gloo" zero_w3.log || fail "the sharded run does not say so"
compare gpt2_w1 zero_w2 1e-5
compare gpt2_w1 zero_w3 1e-5
one llama_w1 6 --config_name llama.json
many llama_zero_w3 3 2 --config_name llama.json --fsdp shard_grad_op
compare llama_w1 llama_zero_w3 1e-5
one bf16_w1 6 --config_name llama.json --bf16
many bf16_zero_w2 2 3 --config_name llama.json --bf16 --fsdp shard_grad_op
compare bf16_w1 bf16_zero_w2 1e-3 1 loss,eval_loss
# SGD shards too; collectives of 1 MB (several rounds per step), torch_compile's replayed step: the same bits.
one sgd_w1 6 --config_name gpt2.json --optim sgd --optim_args momentum=0.9
many sgd_zero_w2 2 3 --config_name gpt2.json --optim sgd --optim_args momentum=0.9 --fsdp shard_grad_op
compare sgd_w1 sgd_zero_w2 1e-5
# So do Adagrad (its sums made before the first step) and bitsandbytes' 32-bit Lion.
one adagrad_w1 6 --config_name gpt2.json --optim adagrad
many adagrad_zero_w2 2 3 --config_name gpt2.json --optim adagrad --fsdp shard_grad_op
compare adagrad_w1 adagrad_zero_w2 1e-5
one lion_w1 6 --config_name gpt2.json --optim lion_32bit --weight_decay 0.1 --learning_rate 1e-3
many lion_zero_w3 3 2 --config_name gpt2.json --optim lion_32bit --weight_decay 0.1 --learning_rate 1e-3 --fsdp shard_grad_op
compare lion_w1 lion_zero_w3 1e-5
one ademamix_w1 6 --config_name gpt2.json --optim ademamix --weight_decay 0.1 --learning_rate 1e-3 --optim_args t_alpha=3,t_beta3=4
many ademamix_zero_w2 2 3 --config_name gpt2.json --optim ademamix --weight_decay 0.1 --learning_rate 1e-3 --optim_args t_alpha=3,t_beta3=4 --fsdp shard_grad_op
compare ademamix_w1 ademamix_zero_w2 1e-5
many zero_w3_again 3 2 --config_name gpt2.json --fsdp shard_grad_op
compare zero_w3 zero_w3_again 0
many zero_w3_small 3 2 --config_name gpt2.json --fsdp shard_grad_op --ddp_bucket_cap_mb 1
compare zero_w3 zero_w3_small 0
# --deepspeed: HF's ZeRO-2 example (DeepSpeed's AdamW, every value "auto") trains the bits of --fsdp
# shard_grad_op; a config whose train_batch_size was written for another world size gets HF's mismatch.
echo '{"optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": "auto", "contiguous_gradients": true},
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto", "steps_per_print": 2000}' >ds_zero2.json
many ds_zero_w2 2 3 --config_name gpt2.json --deepspeed ds_zero2.json
compare zero_w2 ds_zero_w2 0
echo '{"zero_optimization": {"stage": 2}, "train_batch_size": 12}' >ds_12.json
next_port
"$trainer" launch --nproc_per_node 3 --master_port "$port" train "${common[@]}" --config_name gpt2.json \
  --per_device_train_batch_size 3 --output_dir ds_18 --deepspeed ds_12.json >ds_18.log 2>&1 &&
  fail "a train_batch_size written for 2 ranks trained at 3"
grep -qF -- "- ds train_batch_size=12 vs hf train_batch_size (calculated)=18" ds_18.log ||
  { tail ds_18.log; fail "the world's train_batch_size mismatch"; }
many zero_w3_compile 3 2 --config_name gpt2.json --fsdp shard_grad_op --torch_compile
compare zero_w3 zero_w3_compile 0
# --fsdp offload on the host: the shard is in host memory already (said once), the same bits. Off the host
# (cpu:1, cuda:0) the offloaded shard's bits are test_zero_devices.cpp's.
many zero_w2_offload 2 3 --config_name gpt2.json --fsdp "shard_grad_op offload"
grep -q "train: --fsdp offload: the run is on the host, where the shard is already" zero_w2_offload.log ||
  fail "offload on the host does not say so"
compare zero_w2 zero_w2_offload 0

# 2. One optimizer file per rank, the state split three ways (DDP's ranks each hold all of it).
for k in 0 1 2; do [[ -s zero_w3/checkpoint-4/optimizer.rank-$k.safetensors ]] || fail "no optimizer.rank-$k"; done
[[ ! -e zero_w3/checkpoint-4/optimizer.safetensors && ! -e zero_w3/checkpoint-4/optimizer.rank-3.safetensors ]] ||
  fail "files of another layout in the sharded checkpoint"
many ddp_w3 3 2 --config_name gpt2.json
python3 - <<'PY' || fail "per-rank memory"
import json
z, d = (json.load(open(f"{n}/train_results.json")) for n in ("zero_w3", "ddp_w3"))
assert z["fsdp"] == "shard_grad_op" and d["fsdp"] == "", (z["fsdp"], d["fsdp"])
zs, ds = z["optimizer_state_gib_per_rank"], d["optimizer_state_gib_per_rank"]
assert len(zs) == len(ds) == 3, (zs, ds)
assert all(abs(x / ds[0] - 1 / 3) < 0.01 for x in zs), (zs, ds)  # ceil(P / 3) elements of state per rank
assert len(z["train_peak_memory_gib_per_rank"]) == 3
print(f"zero_runs: optimizer state per rank {zs[0] * 2**30 / 1e6:.2f} MB sharded vs {ds[0] * 2**30 / 1e6:.2f} MB DDP")
PY

# `trainer estimate --world_size N --fsdp shard_grad_op` predicts rank 0's measured peak to the byte.
predict shard_grad_op zero_w2 2 3 gpt2.json
predict shard_grad_op zero_w3 3 2 gpt2.json
predict shard_grad_op bf16_zero_w2 2 3 llama.json --bf16

# 3. Resume world 3's checkpoint-4 sharded at 3 (bit-exact) and 2, under DDP at 2 and in one process; one
#    process's checkpoint sharded at 2.
many resume_w3 3 2 --config_name gpt2.json --fsdp shard_grad_op --resume_from_checkpoint zero_w3/checkpoint-4
compare zero_w3 resume_w3 0 5
many resume_w2 2 3 --config_name gpt2.json --fsdp shard_grad_op --resume_from_checkpoint zero_w3/checkpoint-4
compare zero_w3 resume_w2 1e-5 5
many resume_ddp_w2 2 3 --config_name gpt2.json --resume_from_checkpoint zero_w3/checkpoint-4
compare zero_w3 resume_ddp_w2 1e-5 5
one resume_w1 6 --config_name gpt2.json --resume_from_checkpoint zero_w3/checkpoint-4
compare zero_w3 resume_w1 1e-5 5
many from_w1 2 3 --config_name gpt2.json --fsdp shard_grad_op --resume_from_checkpoint gpt2_w1/checkpoint-4
compare gpt2_w1 from_w1 1e-5 5
# bf16: each rank keeps only its fp32 master slices; the checkpoint's fp32 weights are gathered from them.
many bf16_resume_w2 2 3 --config_name llama.json --bf16 --fsdp shard_grad_op --resume_from_checkpoint bf16_zero_w2/checkpoint-4
compare bf16_zero_w2 bf16_resume_w2 0 5
one bf16_resume_w1 6 --config_name llama.json --bf16 --resume_from_checkpoint bf16_zero_w2/checkpoint-4
compare bf16_zero_w2 bf16_resume_w1 1e-3 5 loss,eval_loss
# SGD's momentum buffers appear at its first step (a fresh optimizer lists none): resumed from the files.
many sgd_resume_w3 3 2 --config_name gpt2.json --optim sgd --optim_args momentum=0.9 --fsdp shard_grad_op \
  --resume_from_checkpoint sgd_zero_w2/checkpoint-4
compare sgd_zero_w2 sgd_resume_w3 1e-5 5
one sgd_resume_w1 6 --config_name gpt2.json --optim sgd --optim_args momentum=0.9 \
  --resume_from_checkpoint sgd_zero_w2/checkpoint-4
compare sgd_zero_w2 sgd_resume_w1 1e-5 5

# 4. SIGTERM to the launcher: every rank's optimizer file in the one checkpoint, exit 0.
long=(--tokenizer_name "$tok" --train_file "$text" --block_size 16 --learning_rate 0.01 --use_cpu --max_steps 100000
      --logging_steps 10 --save_steps 100000 --config_name gpt2.json --per_device_train_batch_size 2
      --fsdp shard_grad_op)
launch_and_terminate term 2 "${long[@]}"
ckpts=(term/checkpoint-*)
[[ ${#ckpts[@]} == 1 && -s ${ckpts[0]}/optimizer.rank-0.safetensors && -s ${ckpts[0]}/optimizer.rank-1.safetensors ]] ||
  { ls -R term; fail "expected one checkpoint with both ranks' optimizer files after SIGTERM"; }
[[ -z $(ls -A term | grep '^\.tmp-') ]] || fail "a staging folder was left behind"

# Two launchers as two nodes sharing output_dir equal one node; nodes that do not share it are refused
# before training (their ranks could not put their optimizer files into one checkpoint).
node() {  # NODE_RANK OUTPUT_DIR
  OMP_NUM_THREADS=1 "$trainer" launch --nnodes 2 --node_rank "$1" --nproc_per_node 1 --master_addr 127.0.0.1 \
    --master_port "$port" train "${common[@]}" --config_name gpt2.json --per_device_train_batch_size 3 \
    --fsdp shard_grad_op --output_dir "$2" >"$2.node$1.log" 2>&1
}
next_port
node 1 nodes & node1=$!
node 0 nodes || { tail nodes.node0.log; fail "node 0"; }
wait $node1 || { tail nodes.node1.log; fail "node 1"; }
compare zero_w2 nodes 0
next_port
rc0=0 rc1=0
node 1 apart1 & node1=$!
node 0 apart0 || rc0=$?
wait $node1 || rc1=$?
[[ $rc0 == 1 && $rc1 == 1 ]] &&
  grep -q "error: --fsdp shard_grad_op: 1 of the 2 ranks cannot see apart0/.trainer-shared-check written by rank 0" apart0.node0.log ||
  { cat apart0.node0.log apart1.node1.log; fail "nodes without a shared output_dir"; }
[[ ! -e apart0/.trainer-shared-check ]] || fail "the marker was left behind"

# 5. Bad input: one message each, non-zero exit.
next_port
rc=0; "$trainer" launch --nproc_per_node 2 --master_port "$port" train "${common[@]}" --config_name gpt2.json \
  --per_device_train_batch_size 3 --output_dir ada --fsdp shard_grad_op --optim adafactor >ada.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "error: --fsdp shard_grad_op with --optim adafactor: sharding splits tensors" ada.log ||
  { cat ada.log; fail "adafactor sharded"; }
next_port
rc=0; "$trainer" launch --nproc_per_node 2 --master_port "$port" train "${common[@]}" --config_name gpt2.json \
  --per_device_train_batch_size 3 --output_dir alone --fsdp offload >alone.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "error: --fsdp offload can't work on its own. It needs to be added to --fsdp full_shard" alone.log ||
  { cat alone.log; fail "offload without a strategy"; }
cp -r zero_w3/checkpoint-4 broken && rm broken/optimizer.rank-1.safetensors
next_port
rc=0; "$trainer" launch --nproc_per_node 2 --master_port "$port" train "${common[@]}" --config_name gpt2.json \
  --per_device_train_batch_size 3 --output_dir broken_run --fsdp shard_grad_op --resume_from_checkpoint broken \
  >broken.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "checkpoint broken: missing optimizer.rank-1.safetensors: its optimizer state was saved by 3 ranks" broken.log ||
  { cat broken.log; fail "a missing rank file"; }
echo "zero_runs: OK"
