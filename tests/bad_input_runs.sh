#!/usr/bin/env bash
# Bad input loses nothing and crashes nothing (from a robustness sweep of the CLI): a run that fails to
# start keeps the earlier run's checkpoints under --overwrite_output_dir; a too-short --validation_file is
# refused before the first step; thread counts past any machine's are refused with the flag's name (they
# aborted or crashed inside the thread pools); a re-tokenization leaves no shard of the earlier one behind.
# Usage: bad_input_runs.sh TRAINER TOKENIZER CORPUS WORKDIR
set -uo pipefail
trainer=$1 tok=$2 corpus=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
echo '{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32}' >"$work/config.json"
head -c 30000 "$corpus" >"$work/corpus.txt"
args=(train --config_name "$work/config.json" --tokenizer_name "$tok" --train_file "$work/corpus.txt"
  --output_dir "$work/run" --block_size 32 --per_device_train_batch_size 2 --max_steps 2 --save_steps 1
  --report_to none --use_cpu)
"$trainer" "${args[@]}" >"$work/first.txt" 2>&1 || { tail -c 2000 "$work/first.txt"; fail "the first run"; }
[[ -d $work/run/checkpoint-1 && -d $work/run/checkpoint-2 ]] || fail "the first run wrote no checkpoints"

# --overwrite_output_dir with a data file that cannot be read: refused, the old checkpoints stay.
head -c 4096 /dev/urandom >"$work/garbage.txt"
"$trainer" "${args[@]}" --overwrite_output_dir --train_file "$work/garbage.txt" >"$work/bad.txt" 2>&1 &&
  fail "a binary --train_file was accepted"
[[ -d $work/run/checkpoint-1 && -d $work/run/checkpoint-2 ]] ||
  fail "a run that failed to start deleted the earlier run's checkpoints: $(tail -c 300 "$work/bad.txt")"
# ... and once a run does start, the stale checkpoints go (they would mix with its own).
"$trainer" "${args[@]}" --overwrite_output_dir --save_strategy no >"$work/over.txt" 2>&1 ||
  { tail -c 2000 "$work/over.txt"; fail "the overwriting run"; }
[[ ! -d $work/run/checkpoint-1 ]] || fail "the overwriting run kept the earlier run's checkpoints"
[[ -z $(ls -A "$work/run" | grep overwritten) ]] || fail "set-aside checkpoints left behind: $(ls -A "$work/run")"

# HF's boolean words (string_to_bool) are accepted; words that are not booleans are refused by name.
"$trainer" estimate --config_name "$work/config.json" --bf16 t --do_eval y --gradient_checkpointing yes \
  --block_size 32 --json >"$work/bools.txt" 2>&1 || fail "HF's boolean words refused: $(tail -c 300 "$work/bools.txt")"
"$trainer" estimate --config_name "$work/config.json" --bf16 maybe >"$work/bools.txt" 2>&1 &&
  fail "--bf16 maybe was accepted"
grep -q -- "--bf16: 'maybe': expected true or false" "$work/bools.txt" || fail "no message for --bf16 maybe"

# A --validation_file shorter than a block: refused before any step.
echo hi >"$work/tiny.txt"
"$trainer" "${args[@]}" --output_dir "$work/run2" --validation_file "$work/tiny.txt" --do_eval >"$work/tiny_out.txt" 2>&1 &&
  fail "a --validation_file shorter than a block was accepted"
grep -q -- "--validation_file $work/tiny.txt: .* fewer than one block" "$work/tiny_out.txt" ||
  fail "no message naming --validation_file: $(tail -c 300 "$work/tiny_out.txt")"
grep -qE "\] step [0-9]+/" "$work/tiny_out.txt" && fail "the run trained before refusing its --validation_file"

# Thread counts: one message naming the flag or variable, exit status 1, no abort or crash.
expect_refusal() {  # expect_refusal PATTERN COMMAND...
  local pattern=$1
  shift
  "$@" >"$work/threads.txt" 2>&1
  local rc=$?
  ((rc == 1)) || fail "exit status $rc (expected 1) for: $* ($(tail -c 300 "$work/threads.txt"))"
  grep -q -- "$pattern" "$work/threads.txt" || fail "no '$pattern' in: $(cat "$work/threads.txt")"
}
expect_refusal "--dataloader_num_workers 100000: expected 0" "$trainer" "${args[@]}" --output_dir "$work/run3" \
  --dataloader_num_workers 100000
expect_refusal "--num_proc 100000: expected 0" "$trainer" tokenize --tokenizer_name_or_path "$tok" \
  --input "$work/corpus.txt" --output_dir "$work/shards" --num_proc 100000
expect_refusal "OMP_NUM_THREADS=100000" env OMP_NUM_THREADS=100000 "$trainer" "${args[@]}" --output_dir "$work/run3"

# Re-tokenizing into a folder: the earlier shards this run does not replace are removed.
"$trainer" tokenize --tokenizer_name_or_path "$tok" --input "$work/corpus.txt" --output_dir "$work/shards" \
  --shard_size 1000 --validation_split_percentage 10 >/dev/null 2>&1 || fail "the first tokenization"
n=$(ls "$work/shards" | wc -l)
((n > 3)) || fail "the first tokenization wrote $n shards"
head -c 2000 "$work/corpus.txt" >"$work/small.txt"
"$trainer" tokenize --tokenizer_name_or_path "$tok" --input "$work/small.txt" --output_dir "$work/shards" \
  --shard_size 1000 >"$work/retok.txt" 2>&1 || fail "the second tokenization"
grep -q "removed .* shard(s) of an earlier tokenization" "$work/retok.txt" || fail "no notice of the removed shards"
left=$(ls -A "$work/shards" | tr '\n' ' ')
[[ $left == "train_000000.bin " ]] || fail "the folder holds $left after re-tokenizing ~500 tokens into 1000-token shards"
echo "bad_input_runs: OK"
rm -rf "$work"
