# The shared part of the distributed end-to-end scripts (ddp_runs.sh, zero_runs.sh, zero3_runs.sh), sourced after they
# set `suite` (the name their lines start with) with their arguments TRAINER TOKENIZER_DIR TEXT WORK_DIR:
# the tiny models, the common flags, one-process and launched runs, the per-step comparison, and the
# estimate-equals-measured check of a sharded run.
trainer=$1 tok=$2 text=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
fail() { echo "$suite: FAIL: $*"; exit 1; }
# Below the kernel's ephemeral range (32768+), where a connection of another test could hold the port.
port=$((20000 + ($$ * 13) % 12000))
# The next port nothing listens on (the other distributed script may run beside this one under ctest -j).
next_port() {
  port=$((port + 1))
  while ! python3 -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])))" "$port" 2>/dev/null; do
    port=$((port + 1))
  done
}
echo '{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64,
  "resid_pdrop": 0, "embd_pdrop": 0, "attn_pdrop": 0}' >gpt2.json
echo '{"model_type": "llama", "vocab_size": 50257, "hidden_size": 32, "intermediate_size": 64,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
  "tie_word_embeddings": false}' >llama.json
# 499 training tokens = 31 blocks of 16: global batches of 6 leave 1 sample at each epoch's end (ranks 1, 2
# get an empty micro-batch there); 3 optimizer steps per epoch, so 8 steps cross two epoch boundaries.
common=(--tokenizer_name "$tok" --train_file "$text" --block_size 16 --learning_rate 0.01 --use_cpu
        --max_steps 8 --logging_steps 1 --gradient_accumulation_steps 2 --validation_split_percentage 20
        --do_eval --eval_strategy steps --eval_steps 4 --per_device_eval_batch_size 2 --save_steps 4
        --ddp_timeout 60)
one() {  # one process: NAME GLOBAL_BATCH ARGS...
  local name=$1 batch=$2; shift 2
  "$trainer" train "${common[@]}" --per_device_train_batch_size "$batch" --output_dir "$name" "$@" >"$name.log" 2>&1 ||
    { tail -20 "$name.log"; fail "run $name"; }
}
many() {  # a launched world: NAME NPROC BATCH ARGS...
  local name=$1 n=$2 batch=$3; shift 3
  next_port
  "$trainer" launch --nproc_per_node "$n" --master_port "$port" train "${common[@]}" \
    --per_device_train_batch_size "$batch" --output_dir "$name" "$@" >"$name.log" 2>&1 ||
    { tail -20 "$name.log"; fail "run $name"; }
}
# compare A B TOLERANCE [FIRST_STEP [KEYS]]: loss, grad_norm and eval_loss (or KEYS, comma-separated) of every
# logged step from FIRST_STEP on (tolerance 0: bitwise).
compare() {
  python3 - "$suite" "$@" <<'PY' || fail "compare $*"
import json, sys
suite = sys.argv.pop(1)
a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
first = int(sys.argv[4]) if len(sys.argv) > 4 else 1
keys = sys.argv[5].split(",") if len(sys.argv) > 5 else ["loss", "grad_norm", "eval_loss"]
def rows(d):
    out = {}
    for line in open(d + "/metrics.jsonl"):
        j = json.loads(line)
        for k in keys:
            if k in j and j["step"] >= first:
                out[(j["step"], k)] = j[k]
    return out
ra, rb = rows(a), rows(b)
assert ra.keys() == rb.keys() and ra, f"{a} and {b} logged different steps: {sorted(ra)} vs {sorted(rb)}"
worst = max(abs(ra[k] - rb[k]) / max(abs(ra[k]), 1e-12) for k in ra)
print(f"{suite}: {a} vs {b}: {len(ra)} values, worst relative difference {worst:.3g} (bound {tol:g})")
assert worst <= tol, f"{a} vs {b}: {worst} > {tol}"
PY
}

# Waits until LOG shows a training step (up to 120 s: under ctest -j2 beside another distributed suite the
# ranks' start-up can take many seconds; a signal sent before the first step would test something else).
wait_for_step() {
  local log=$1 pid=$2
  for _ in $(seq 1200); do
    grep -q "step [0-9]*/100000" "$log" && return 0
    kill -0 "$pid" 2>/dev/null || { tail "$log"; fail "the run of $log ended before its first step"; }
    sleep 0.1
  done
  tail "$log"; fail "no training step in $log after 120 s"
}

# A long run launched on NPROC ranks, SIGTERMed once its first step shows, required to exit 0 (every rank
# finishes the step and the checkpoint is written): NAME NPROC TRAIN_ARGS... (log in NAME.log).
launch_and_terminate() {
  local name=$1 n=$2; shift 2
  next_port
  "$trainer" launch --nproc_per_node "$n" --master_port "$port" train "$@" --output_dir "$name" >"$name.log" 2>&1 &
  local launcher=$!
  wait_for_step "$name.log" $launcher
  kill -TERM $launcher
  wait $launcher || { tail "$name.log"; fail "the launcher did not exit 0 after SIGTERM"; }
}

# `trainer estimate --world_size N --fsdp STRATEGY` must predict rank 0's measured peak to the byte:
# STRATEGY RUN WORLD BATCH CONFIG [FLAGS...] (the run made with `many` and the common flags).
predict() {
  local fsdp=$1 run=$2 w=$3 b=$4 c=$5; shift 5
  local want; want=$(python3 -c "import json; r = json.load(open('$run/train_results.json')); print(*(round(r[k + '_peak_memory_gib_per_rank'][0] * 2**30) for k in ('train', 'setup', 'save')))")
  local got; got=$("$trainer" estimate --config_name "$c" --block_size 16 --per_device_train_batch_size "$b" \
    --gradient_accumulation_steps 2 --do_eval --eval_strategy steps --eval_steps 4 --per_device_eval_batch_size 2 \
    --use_cpu --world_size "$w" --fsdp "$fsdp" "$@" --json | python3 -c "import json,sys; e = json.load(sys.stdin); print(e['peak_bytes'], e['setup_peak_bytes'], e['save_peak_bytes'])")
  [[ $got == "$want" ]] || fail "estimate of $run: $got bytes (step, set-up, save), measured $want"
  echo "$suite: estimate of $run's rank 0: $got bytes (step, set-up, save), measured $want"
}
