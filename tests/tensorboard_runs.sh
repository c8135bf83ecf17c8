#!/usr/bin/env bash
# TensorBoard files and pictures of real runs, read back by independent readers (tests/read_tfevents.py:
# Python protobuf + crc32c; Python's XML parser for the SVG):
#  1. a run with evaluation: every record's CRCs, file_version, tags and values equal metrics.jsonl;
#  2. a resume from an earlier checkpoint: a second file in the same logging_dir whose SessionLog START makes
#     TensorBoard's view equal the resumed metrics.jsonl (the repeated steps replaced, not doubled);
#  3. a run killed with SIGKILL mid-training: its files still read, up to the last flushed step;
#  4. `trainer plot` of two runs as SVG (one stroked path per run and panel) and the bad inputs' messages.
# Usage: tensorboard_runs.sh TRAINER TOKENIZER_DIR TEXT WORK_DIR
set -euo pipefail
trainer=$1 tok=$2 text=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3  # Debian's, where python3-protobuf and python3-crc32c are installed
rm -rf "$work" && mkdir -p "$work"
echo '{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}' \
  >"$work/tiny.json"
common=(--config_name "$work/tiny.json" --tokenizer_name "$tok" --train_file "$text" --block_size 16
        --per_device_train_batch_size 2 --learning_rate 0.01 --use_cpu)
tb=(--report_to tensorboard)
fail() { echo "tensorboard_runs: FAIL: $*"; exit 1; }

# 1. A fresh run with evaluation.
"$trainer" train "${common[@]}" "${tb[@]}" --output_dir "$work/a" --max_steps 10 --logging_steps 2 --eval_strategy steps \
  --eval_steps 5 --do_eval --validation_split_percentage 10 --save_steps 5 >"$work/a.log" 2>&1 ||
  { cat "$work/a.log"; fail "run a"; }
logdir=$(ls -d "$work"/a/runs/*)
[[ $(basename "$logdir") =~ ^[A-Z][a-z]{2}[0-9]{2}_[0-9]{2}-[0-9]{2}-[0-9]{2}_ ]] || fail "logging_dir name $logdir"
"$py" "$here/read_tfevents.py" "$logdir" "$work/a" --files 1 --session-starts "" \
  --require train/loss,train/learning_rate,train/grad_norm,train/epoch,train/tokens_per_second,train/peak_memory_gib,eval/loss,eval/perplexity,eval/runtime,args/text_summary
grep -q "tensorboard  $logdir" "$work/a.log" || fail "the summary does not name the logging_dir"
[[ -s "$work/a/training_curves.png" ]] || fail "no training_curves.png"

# 2. Resumed from checkpoint-5 to step 14: steps 6-10 run again; TensorBoard must show them once.
"$trainer" train "${common[@]}" "${tb[@]}" --output_dir "$work/a" --max_steps 14 --logging_steps 2 --eval_strategy steps \
  --eval_steps 5 --do_eval --validation_split_percentage 10 --save_steps 5 \
  --resume_from_checkpoint "$work/a/checkpoint-5" >"$work/a2.log" 2>&1 || { cat "$work/a2.log"; fail "resume"; }
[[ $(ls -d "$work"/a/runs/* | wc -l) == 1 ]] || fail "the resumed run made a second logging_dir"
"$py" "$here/read_tfevents.py" "$logdir" "$work/a" --files 2 --require train/loss,eval/loss --session-starts 6

# 3. Killed mid-run: whatever was flushed reads back.
"$trainer" train "${common[@]}" "${tb[@]}" --output_dir "$work/k" --max_steps 100000 --logging_steps 1 --save_steps 100000 \
  --logging_dir "$work/k_tb" >"$work/k.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [[ -f "$work/k/metrics.jsonl" ]] && (($(wc -l <"$work/k/metrics.jsonl") >= 6)) && break
  sleep 0.1
done
(($(wc -l <"$work/k/metrics.jsonl" 2>/dev/null || echo 0) >= 6)) || { cat "$work/k.log"; fail "6 logged steps never came"; }
kill -9 "$pid" 2>/dev/null || fail "the run ended before it was killed"
wait "$pid" 2>/dev/null || true
"$py" "$here/read_tfevents.py" "$work/k_tb" "$work/k" --files 1 --truncated-ok --require train/loss

# 4. Pictures: two runs in one SVG, and the bad inputs.
"$trainer" plot "$work/a" "$work/k" --output "$work/both.svg" --metrics loss,learning_rate,eval_loss --log_scale
"$py" - "$work/both.svg" <<'PY'
import re, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
def stroke(e):  # a path's stroke colour as 0-255 RGB, or None
    m = re.search(r"(?:^|;)\s*stroke:\s*rgb\(([^)]*)\)", e.get("style", ""))
    return m and tuple(round(float(c.rstrip("%")) * 2.55) for c in m.group(1).split(","))
runs = {"a": (31, 119, 180), "k": (255, 127, 14)}
panels = {"a": 3, "k": 2}  # run k has no evaluation
for name, rgb in runs.items():
    n = sum(1 for e in root.iter("{http://www.w3.org/2000/svg}path") if stroke(e) == rgb)
    if n != panels[name]:
        sys.exit(f"svg: {n} stroked paths of run {name}'s colour, expected {panels[name]}")
print("svg: one stroked path per run and panel")
PY
expect_error() {  # a command that must fail with a message matching a pattern
  local pattern=$1; shift
  if "$@" >"$work/err.log" 2>&1; then fail "$* succeeded"; fi
  grep -Eq "$pattern" "$work/err.log" || { cat "$work/err.log"; fail "$* did not say: $pattern"; }
}
expect_error "no metrics.jsonl here" "$trainer" plot "$work/tiny.json.d" --output "$work/x.png"
mkdir -p "$work/empty" && expect_error "empty: no metrics.jsonl here" "$trainer" plot "$work/empty"
expect_error "metric 'perplexity' is in no run's metrics.jsonl; logged metrics: .*eval_loss" \
  "$trainer" plot "$work/a" --metrics perplexity --output "$work/x.png"
expect_error "expected a .png or .svg" "$trainer" plot "$work/a" --output "$work/x.jpg"
expect_error "output .*no_such_dir/x.png: .*cannot create: No such file" "$trainer" plot "$work/a" --output "$work/no_such_dir/x.png"
printf '{"step": 1, "loss": 2.0}\nnot json\n' >"$work/empty/metrics.jsonl"
expect_error "metrics.jsonl:2: not a JSON object" "$trainer" plot "$work/empty" --output "$work/x.png"
expect_error "report_to wandb: HF's wandb integration is a Python library" \
  "$trainer" train "${common[@]}" --output_dir "$work/w" --report_to wandb
expect_error "unknown integration 'tensorbord'.*tensorboard" \
  "$trainer" train "${common[@]}" --output_dir "$work/w" --report_to tensorbord
echo "tensorboard_runs: OK"
