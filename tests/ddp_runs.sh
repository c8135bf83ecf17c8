#!/usr/bin/env bash
# Distributed data parallel end to end on 127.0.0.1 (Gloo over TCP), `trainer launch` starting the ranks:
#  1. 2 and 3 ranks vs 1 process with the same global batch (gradient accumulation, an epoch boundary with
#     an uneven last batch, split evaluation): losses, grad norms and eval_loss within 1e-5 relative per step,
#     GPT-2 (tied head; with and without dropout, NEFTune and label smoothing) and Llama (grouped-query attention, untied head); bf16
#     and bf16 weights without masters (--torch_dtype bfloat16, resumed bit-exactly) within bf16's bounds; gradient checkpointing and torch_compile bit-identical to eager DDP;
#  2. two runs of world size 2 bit-identical; two "nodes" (two launchers, --nnodes 2) equal to one node;
#  3. resume: a world-size-2 checkpoint continued at world size 2 (bit-exact), 1 and 3 (within 1e-5);
#  4. SIGTERM to the launcher: every rank stops at the same step, one checkpoint, exit 0, and it resumes;
#  5. a rank killed with SIGKILL: the launcher exits 1 naming it within seconds, no process left behind;
#     with --max_restarts, two nodes' groups restart together and resume bit-exactly from a checkpoint;
#  schedule_free_adamw at world sizes 1 and 2, resumed at 2 bit-exactly; galore_adamw at 1 and 2;
#  6. bad input: a missing rank 0, disagreeing world sizes, --fsdp offload alone, launch flags, an incompatible
#     resume.
# Usage: ddp_runs.sh TRAINER TOKENIZER_DIR TEXT WORK_DIR
set -euo pipefail
suite=ddp_runs
source "$(dirname "$0")/dist_lib.sh"

# 1. World sizes 1, 2, 3 with the same global batch of 6 sequences x 2 accumulation steps.
one gpt2_w1 6 --config_name gpt2.json
many gpt2_w2 2 3 --config_name gpt2.json
many gpt2_w3 3 2 --config_name gpt2.json
grep -q "x 3 processes (DDP over gloo" gpt2_w3.log || fail "the DDP run does not say so"
compare gpt2_w1 gpt2_w2 1e-5
compare gpt2_w1 gpt2_w3 1e-5
# With dropout (GPT-2's 0.1 everywhere): each rank draws its rows' part of the single process's masks.
sed 's/"resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0/"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1/' \
  gpt2.json >dropout.json
one drop_w1 6 --config_name dropout.json
many drop_w3 3 2 --config_name dropout.json
compare drop_w1 drop_w3 1e-5
# NEFTune's embedding noise (each rank's rows of the single process's draw) with label smoothing (the smoothed
# loss normalized by the step's label tokens over every rank).
one neft_w1 6 --config_name gpt2.json --neftune_noise_alpha 5 --label_smoothing_factor 0.1
many neft_w3 3 2 --config_name gpt2.json --neftune_noise_alpha 5 --label_smoothing_factor 0.1
compare neft_w1 neft_w3 1e-5
one llama_w1 6 --config_name llama.json
many llama_w2 2 3 --config_name llama.json
compare llama_w1 llama_w2 1e-5
one bf16_w1 6 --config_name llama.json --bf16
many bf16_w2 2 3 --config_name llama.json --bf16
# bf16 rounds each rank's smaller GEMMs differently: the losses stay within 1e-3 (bf16 vs fp32 differ by
# 1e-3 here too); the grad norm of a few late steps moves by ~15% in either comparison at this learning rate.
compare bf16_w1 bf16_w2 1e-3 1 loss,eval_loss
# bf16 weights without masters (--torch_dtype bfloat16): each rank's bf16 gradients averaged in f32 buckets and
# rounded once; bf16's bounds, and a world-size-2 checkpoint (bf16 weights and moments) continues bit-exactly.
one half_w1 6 --config_name llama.json --torch_dtype bfloat16
many half_w2 2 3 --config_name llama.json --torch_dtype bfloat16
compare half_w1 half_w2 1e-3 1 loss,eval_loss
many half_resume_w2 2 3 --config_name llama.json --torch_dtype bfloat16 --resume_from_checkpoint half_w2/checkpoint-4
compare half_w2 half_resume_w2 0 5
# Only rank 0 writes: one metrics.jsonl line per log, the model, results with the world size.
[[ $(grep -c '"loss"' gpt2_w2/metrics.jsonl) == 8 ]] || fail "metrics.jsonl of world 2 has repeated lines"
python3 -c "import json,sys; r=json.load(open('gpt2_w3/train_results.json')); sys.exit(r['world_size']!=3)" ||
  fail "train_results.json lacks world_size 3"
[[ -s gpt2_w3/model.safetensors && -s gpt2_w3/checkpoint-8/optimizer.safetensors && ! -e gpt2_w3/checkpoint-8/optimizer.rank-0.safetensors ]] || fail "rank 0's files"

# schedulefree's AdamW: every rank switches between y (steps) and x (the split evaluation, the saves) alike;
# a world-size-2 checkpoint (x, eval mode) continues bit-exactly.
one sf_w1 6 --config_name gpt2.json --optim schedule_free_adamw
many sf_w2 2 3 --config_name gpt2.json --optim schedule_free_adamw
compare sf_w1 sf_w2 1e-5
many sf_resume_w2 2 3 --config_name gpt2.json --optim schedule_free_adamw --resume_from_checkpoint sf_w2/checkpoint-4
compare sf_w2 sf_resume_w2 0 5

# GaLore: every rank projects the same all-reduced gradients onto the same SVD bases.
galore=(--optim galore_adamw --optim_target_modules all-linear --optim_args rank=4,update_proj_gap=2)
one galore_w1 6 --config_name gpt2.json "${galore[@]}"
many galore_w2 2 3 --config_name gpt2.json "${galore[@]}"
compare galore_w1 galore_w2 1e-5

# --total_batch_size counts every rank's sequences: 12 = 3 per rank x 2 ranks x 2 accumulation steps.
next_port
"$trainer" launch --nproc_per_node 2 --master_port "$port" train "${common[@]}" \
  --config_name gpt2.json --per_device_train_batch_size 3 --total_batch_size 12 --output_dir total_w2 >total_w2.log 2>&1 ||
  { tail total_w2.log; fail "--total_batch_size under DDP"; }
compare gpt2_w2 total_w2 0
# average_tokens_across_devices false: each rank normalizes by its own label tokens and the gradients are
# averaged - the single process's numbers when every rank holds as many tokens (drop_last keeps the epoch's
# end even; an uneven last step weighs each rank's mean equally, as HF does).
one avg_w1 6 --config_name gpt2.json --average_tokens_across_devices false --dataloader_drop_last
many avg_w3 3 2 --config_name gpt2.json --average_tokens_across_devices false --dataloader_drop_last
compare avg_w1 avg_w3 1e-5

# Gradient checkpointing (leaves reported from the recomputed regions' own backward) and torch_compile
# (buckets after the replayed backward) give world 2's bits.
many ckpt_w2 2 3 --config_name gpt2.json --gradient_checkpointing
compare gpt2_w2 ckpt_w2 0
many compile_w2 2 3 --config_name gpt2.json --torch_compile
compare gpt2_w2 compile_w2 0

# `trainer eval` under a launch: the batches split across 3 ranks, rank 0 writes the one result.
ev=(eval --model_name_or_path gpt2_w1 --validation_file "$text" --block_size 16 --per_device_eval_batch_size 2 --use_cpu)
"$trainer" "${ev[@]}" --output_dir eval_w1 >eval_w1.log 2>&1 || { cat eval_w1.log; fail "eval"; }
next_port
"$trainer" launch --nproc_per_node 3 --master_port "$port" "${ev[@]}" --output_dir eval_w3 >eval_w3.log 2>&1 ||
  { cat eval_w3.log; fail "eval under a launch"; }
python3 - <<'PY' || fail "eval_w3 differs from eval_w1"
import json
a, b = (json.load(open(f"{d}/eval_results.json")) for d in ("eval_w1", "eval_w3"))
assert a["eval_samples"] == b["eval_samples"] and a["eval_tokens"] == b["eval_tokens"], (a, b)
assert abs(a["eval_loss"] - b["eval_loss"]) <= 1e-6 * abs(a["eval_loss"]), (a, b)
print(f"ddp_runs: eval split over 3 ranks: eval_loss {b['eval_loss']:.8f} vs {a['eval_loss']:.8f}")
PY
[[ $(grep -c "^eval_loss" eval_w3.log) == 1 ]] || fail "more than rank 0 reported the evaluation"

# 2. Bit-identical reruns; two launchers as two nodes equal one node.
many gpt2_w2b 2 3 --config_name gpt2.json
compare gpt2_w2 gpt2_w2b 0
next_port
node() {  # one process per node: OMP_NUM_THREADS as the one-node launch split it (GEMM sums follow threads)
  OMP_NUM_THREADS=1 "$trainer" launch --nnodes 2 --node_rank "$1" --nproc_per_node 1 --master_addr 127.0.0.1 --master_port "$port" \
    train "${common[@]}" --config_name gpt2.json --per_device_train_batch_size 3 --output_dir "nodes$1" \
    >"nodes$1.log" 2>&1
}
node 1 & node1=$!
node 0 || { tail nodes0.log; fail "node 0"; }
wait $node1 || { tail nodes1.log; fail "node 1"; }
compare gpt2_w2 nodes0 0
[[ ! -e nodes1/metrics.jsonl ]] || fail "node 1's rank wrote metrics.jsonl"

# 3. Resume the world-2 run's checkpoint-4 at world sizes 2 (bit-exact), 1 and 3.
many resume_w2 2 3 --config_name gpt2.json --resume_from_checkpoint gpt2_w2/checkpoint-4
compare gpt2_w2 resume_w2 0 5
one resume_w1 6 --config_name gpt2.json --resume_from_checkpoint gpt2_w2/checkpoint-4
compare gpt2_w2 resume_w1 1e-5 5
many resume_w3 3 2 --config_name gpt2.json --resume_from_checkpoint gpt2_w2/checkpoint-4
compare gpt2_w2 resume_w3 1e-5 5
"$trainer" train "${common[@]}" --config_name gpt2.json --per_device_train_batch_size 4 --output_dir bad_resume \
  --resume_from_checkpoint gpt2_w2/checkpoint-4 >bad_resume.log 2>&1 && fail "a different global batch resumed"
grep -q "checkpoint-4/trainer_state.json: saved with per_device_train_batch_size 3 x 2 process(es)" bad_resume.log ||
  { cat bad_resume.log; fail "incompatible resume message"; }

# 4. SIGTERM to the launcher of a long run: the same step everywhere, one checkpoint, exit 0, resumable.
long=(--tokenizer_name "$tok" --train_file "$text" --block_size 16 --learning_rate 0.01 --use_cpu --max_steps 100000
      --logging_steps 10 --save_steps 100000 --config_name gpt2.json --per_device_train_batch_size 2)
launch_and_terminate term 2 "${long[@]}"
ckpt=$(ls -d term/checkpoint-* | head -1)
[[ $(ls -d term/checkpoint-* | wc -l) == 1 ]] || fail "expected one checkpoint after SIGTERM"
grep -q "interrupted after step ${ckpt##*-}; saved" term.log || fail "rank 0 did not report the stop"
python3 -c "import json,sys; s=json.load(open('$ckpt/trainer_state.json')); sys.exit(s['world_size']!=2)" ||
  fail "the checkpoint does not record world_size 2"
next_port
"$trainer" launch --nproc_per_node 2 --master_port "$port" train "${long[@]}" --max_steps $((${ckpt##*-} + 3)) \
  --output_dir term --resume_from_checkpoint true >term2.log 2>&1 || { tail term2.log; fail "resume after SIGTERM"; }
grep -q "resumed from $ckpt" term2.log || fail "the resumed run does not say where from"

# 5. A rank killed with SIGKILL: the launcher fails naming it, quickly, and nothing is left running.
next_port
"$trainer" launch --nproc_per_node 3 --master_port "$port" train "${long[@]}" --output_dir killed >killed.log 2>&1 &
launcher=$!
wait_for_step killed.log $launcher
victim=$(pgrep -f "output_dir killed" | grep -v "^$launcher\$" | sort -n | tail -1)
start=$(date +%s.%N)
kill -KILL "$victim"
rc=0; wait $launcher || rc=$?
took=$(python3 -c "import time; print(f'{time.time() - $start:.2f}')")
[[ $rc == 1 ]] || fail "the launcher exited $rc after a rank was killed"
grep -q "trainer launch: failed: rank 2 (local rank 2, pid $victim) ended with killed by SIGKILL" killed.log ||
  { tail killed.log; fail "the failed rank is not named"; }
python3 -c "import sys; sys.exit(not $took < 20)" || fail "the launcher took $took s to fail"
sleep 0.2
pgrep -f "output_dir killed" >/dev/null && fail "processes left behind"
echo "ddp_runs: rank killed -> launcher exit 1 after $took s, no process left"

# 5b. --max_restarts across two nodes: node 1's rank is killed once checkpoints exist; node 0's launcher (the
# rendezvous store's host) sees node 1 open round 1, both groups restart together, the new ranks resume from
# the newest checkpoint in output_dir, and the run ends with an uninterrupted run's losses, bit for bit.
el=(--tokenizer_name "$tok" --train_file "$text" --block_size 16 --learning_rate 0.01 --use_cpu --max_steps 60
    --logging_steps 1 --save_steps 2 --save_total_limit 2 --config_name gpt2.json --per_device_train_batch_size 2
    --ddp_timeout 60)
elastic_node() {  # NAME NODE_RANK
  OMP_NUM_THREADS=1 "$trainer" launch --nnodes 2 --node_rank "$2" --nproc_per_node 1 --master_addr 127.0.0.1 \
    --master_port "$port" --max_restarts 1 train "${el[@]}" --output_dir "$1" >"$1.node$2.log" 2>&1
}
next_port
elastic_node straight 1 & n1=$!
elastic_node straight 0 || { tail straight.node0.log; fail "the uninterrupted two-node run"; }
wait $n1 || { tail straight.node1.log; fail "the uninterrupted run's node 1"; }
next_port
elastic_node elastic 1 & n1=$!
elastic_node elastic 0 & n0=$!
for _ in $(seq 1200); do
  tr '\r' '\n' <elastic.node0.log | grep -q "step \(1[0-9]\|[5-9]\)/60" && break
  sleep 0.1
done
victim=$(pgrep -P "$(pgrep -f "launch --nnodes 2 --node_rank 1 .*--output_dir elastic\$")")
kill -KILL "$victim" || fail "no rank of node 1 to kill (the run ended before step 5?)"
wait $n0 || { tail elastic.node0.log; fail "node 0 did not finish after the restart"; }
wait $n1 || { tail elastic.node1.log; fail "node 1 did not finish after the restart"; }
grep -q "ended with killed by SIGKILL (9); stopping the other ranks" elastic.node1.log || fail "node 1: no failure"
# node 0 hears of round 1 from the store, or its rank loses its peer first: either way it restarts with node 1
grep -q -e "another node restarts its ranks (round 1); stopping the local ranks" -e "rank 0 .* ended with exit status" \
  elastic.node0.log || { tail elastic.node0.log; fail "node 0 did not stop for node 1's restart"; }
for n in 0 1; do
  grep -q "restarting the local group (restart 1 of 1, every node together)" "elastic.node$n.log" ||
    fail "node $n did not restart"
done
grep -q "train: restart 1 of the group: resuming from elastic/checkpoint-" elastic.node0.log || fail "no resume"
compare straight elastic 0
pgrep -f "output_dir elastic" >/dev/null && fail "processes left behind after the restart"
echo "ddp_runs: two nodes restarted together and resumed: $(grep -o 'resuming from [^ ]*' elastic.node0.log)"

# 6. Bad input: one message each, non-zero exit, no hang.
next_port
rc=0; WORLD_SIZE=2 RANK=1 MASTER_PORT=$port timeout 60 "$trainer" train "${common[@]}" --config_name gpt2.json \
  --per_device_train_batch_size 3 --output_dir lonely --ddp_timeout 2 >lonely.log 2>&1 || rc=$?
[[ $rc == 1 ]] || fail "a rank without rank 0 exited $rc"
grep -q "could not reach the rendezvous store at 127.0.0.1:$port within 2 s" lonely.log || { cat lonely.log; fail "lonely"; }
next_port
WORLD_SIZE=2 RANK=0 MASTER_PORT=$port timeout 60 "$trainer" train "${common[@]}" --config_name gpt2.json \
  --per_device_train_batch_size 3 --output_dir mismatch --ddp_timeout 5 >mismatch0.log 2>&1 & r0=$!
rc=0; WORLD_SIZE=3 RANK=1 MASTER_PORT=$port timeout 60 "$trainer" train "${common[@]}" --config_name gpt2.json \
  --per_device_train_batch_size 3 --output_dir mismatch --ddp_timeout 5 >mismatch1.log 2>&1 || rc=$?
wait $r0 || true
[[ $rc == 1 ]] || fail "disagreeing world sizes exited $rc"
grep -q "was started with WORLD_SIZE" mismatch0.log mismatch1.log || { cat mismatch*.log; fail "mismatch"; }
next_port
rc=0; "$trainer" launch --nproc_per_node 2 --master_port "$port" train "${common[@]}" --config_name gpt2.json \
  --per_device_train_batch_size 3 --output_dir fsdp --fsdp "offload auto_wrap" >fsdp.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "error: --fsdp offload auto_wrap: offload moves a sharded optimizer's shard to host memory, so it needs a sharding strategy" fsdp.log ||
  { cat fsdp.log; fail "--fsdp under a launch"; }
next_port
rc=0; "$trainer" launch --nproc_per_node 2 --master_port "$port" train "${common[@]}" --config_name gpt2.json \
  --per_device_train_batch_size 3 --output_dir fsdp_sf --fsdp shard_grad_op --optim schedule_free_sgd >fsdp_sf.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "error: --fsdp shard_grad_op with --optim schedule_free_sgd: the schedule-free optimizers move whole parameters" fsdp_sf.log ||
  { cat fsdp_sf.log; fail "--fsdp with a schedule-free optimizer"; }
next_port
rc=0; "$trainer" launch --nproc_per_node 2 --master_port "$port" train "${common[@]}" --config_name gpt2.json \
  --per_device_train_batch_size 3 --output_dir lomo_w2 --optim lomo >lomo_w2.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "error: --optim lomo in a run of 2 processes: it updates each parameter during backward" lomo_w2.log ||
  { cat lomo_w2.log; fail "an in-backward optimizer under a launch"; }
rc=0; "$trainer" train "${common[@]}" --config_name gpt2.json --output_dir fsdp1 --fsdp full_shrad >fsdp1.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "fsdp 'full_shrad' is not one of .*did you mean 'full_shard'" fsdp1.log || { cat fsdp1.log; fail "--fsdp typo"; }
rc=0; "$trainer" launch --nprocs 2 train >launch_bad.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "unknown flag --nprocs" launch_bad.log || { cat launch_bad.log; fail "launch flag"; }
rc=0; "$trainer" launch --nproc_per_node 2 >launch_none.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "no subcommand given" launch_none.log || { cat launch_none.log; fail "launch without subcommand"; }
# A single process accepts and ignores the DDP flags, as HF does.
one ignored 6 --config_name gpt2.json --ddp_backend gloo --ddp_bucket_cap_mb 1 --ddp_find_unused_parameters \
  --fsdp "full_shard" --max_steps 2
echo "ddp_runs: OK"
