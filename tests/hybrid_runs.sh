#!/usr/bin/env bash
# Hybrid sharding (issue 12: --fsdp hybrid_shard / hybrid_shard_zero2, HF's HYBRID_SHARD): two "nodes" (two
# `trainer launch --nnodes 2` on 127.0.0.1) of 2 processes each, ZeRO within each node and the gradient shards
# summed across the nodes:
#  1. losses, grad norms and eval_loss within 1e-5 relative of one process with the same global batch, for
#     both stages; a rerun bit-identical;
#  2. `trainer estimate --world_size 4 --nproc_per_node 2` predicts rank 0's peak and set-up peak to the byte;
#  3. checkpoints: the first node's ranks write the 2 shard files; a resume continues bit-exactly, and one
#     process resumes the hybrid checkpoint;
#  4. bad input: two strategies, nodes that load different weights.
# Usage: hybrid_runs.sh TRAINER TOKENIZER_DIR TEXT WORK_DIR
set -euo pipefail
suite=hybrid_runs
source "$(dirname "$0")/dist_lib.sh"

nodes() {  # two launchers of NPROC ranks each as nodes 0 and 1: NAME NPROC BATCH ARGS...
  local name=$1 n=$2 batch=$3; shift 3
  next_port
  local node_args=(--nnodes 2 --nproc_per_node "$n" --master_addr 127.0.0.1 --master_port "$port")
  "$trainer" launch "${node_args[@]}" --node_rank 1 train "${common[@]}" --per_device_train_batch_size "$batch" \
    --output_dir "$name" "$@" >"$name.node1.log" 2>&1 &
  local other=$!
  "$trainer" launch "${node_args[@]}" --node_rank 0 train "${common[@]}" --per_device_train_batch_size "$batch" \
    --output_dir "$name" "$@" >"$name.log" 2>&1 || { wait "$other" || true; tail -20 "$name.log"; fail "run $name"; }
  wait "$other" || { tail -20 "$name.node1.log"; fail "run $name (node 1)"; }
}

# 1. 2 nodes x 2 ranks x batch 1 = one process x batch 4 (x 2 accumulation steps).
one gpt2_b4 4 --config_name gpt2.json
nodes hyb 2 1 --config_name gpt2.json --fsdp hybrid_shard
grep -q "x 4 processes (ZeRO-3 hybrid_shard over gloo: sharded within each of 2 nodes" hyb.log ||
  { cat hyb.log; fail "the hybrid run does not say so"; }
compare gpt2_b4 hyb 1e-5
nodes hyb_z2 2 1 --config_name gpt2.json --fsdp hybrid_shard_zero2
compare gpt2_b4 hyb_z2 1e-5
one llama_b4 4 --config_name llama.json --bf16
nodes llama_hyb 2 1 --config_name llama.json --bf16 --fsdp hybrid_shard
compare llama_b4 llama_hyb 1e-3 1 loss,eval_loss
nodes hyb_again 2 1 --config_name gpt2.json --fsdp hybrid_shard
compare hyb hyb_again 0

# 2. Per rank: a shard of the node's 2 ranks, predicted exactly.
predict hybrid_shard hyb 4 1 gpt2.json --nproc_per_node 2
predict hybrid_shard_zero2 hyb_z2 4 1 gpt2.json --nproc_per_node 2
predict hybrid_shard llama_hyb 4 1 llama.json --nproc_per_node 2 --bf16
# AdamW's two f32 moments of half the parameters per rank (a node's shard), not a quarter (the world's).
params=$("$trainer" estimate --config_name gpt2.json --block_size 16 --use_cpu --json | python3 -c "import json,sys; print(json.load(sys.stdin)['parameters'])")
python3 - hyb/train_results.json "$params" <<'PY' || fail "per-rank optimizer state"
import json, sys
r = json.load(open(sys.argv[1]))
s = [round(v * 2**30) for v in r["optimizer_state_gib_per_rank"]]
half = (int(sys.argv[2]) + 1) // 2
assert r["fsdp"] == "hybrid_shard" and len(s) == 4 and all(abs(v - 8 * half) <= 64 for v in s), (r, half)
print(f"hybrid_runs: optimizer state per rank {s} bytes: 8 x {half} (half of the parameters) each")
PY

# 3. Checkpoints: the shards once (the first node's), resumed by the same layout and by one process.
for k in 0 1; do [[ -s hyb/checkpoint-4/optimizer.rank-$k.safetensors ]] || fail "no optimizer.rank-$k"; done
[[ ! -e hyb/checkpoint-4/optimizer.rank-2.safetensors ]] || fail "the second node wrote shard files"
nodes hyb_resume 2 1 --config_name gpt2.json --fsdp hybrid_shard --resume_from_checkpoint hyb/checkpoint-4
compare hyb hyb_resume 0 5
one hyb_to_w1 4 --config_name gpt2.json --resume_from_checkpoint hyb/checkpoint-4
compare hyb hyb_to_w1 1e-5 5

# 4. Bad input.
next_port
rc=0; "$trainer" launch --nproc_per_node 2 --master_port "$port" train "${common[@]}" --config_name gpt2.json \
  --per_device_train_batch_size 3 --output_dir bad_two --fsdp "hybrid_shard full_shard" >bad_two.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "error: --fsdp hybrid_shard full_shard: .* are sharding strategies; give one" bad_two.log ||
  { cat bad_two.log; fail "two strategies"; }
# Each rank reads the checkpoint itself: a node that loads other weights is named, and every rank stops.
next_port
node_args=(--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port")
"$trainer" launch "${node_args[@]}" --node_rank 1 train "${common[@]}" --per_device_train_batch_size 1 \
  --model_name_or_path hyb --output_dir bad_weights --fsdp hybrid_shard >bad_weights.node1.log 2>&1 &
other=$!
rc=0; "$trainer" launch "${node_args[@]}" --node_rank 0 train "${common[@]}" --per_device_train_batch_size 1 \
  --model_name_or_path gpt2_b4 --output_dir bad_weights --fsdp hybrid_shard >bad_weights.log 2>&1 || rc=$?
wait $other || true
[[ $rc == 1 ]] && grep -q "error: gpt2_b4: ranks 2, 3 read other weights than rank 0" bad_weights.log ||
  { cat bad_weights.log bad_weights.node1.log; fail "different weights on the nodes"; }
echo "hybrid_runs: OK"
