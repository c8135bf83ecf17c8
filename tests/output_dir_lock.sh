#!/usr/bin/env bash
# Two trainers on one output_dir: while the first trains, the second is refused with the first's pid and
# changes nothing; after the first stops (SIGTERM, then SIGKILL of a third) the folder is free again - the
# lock never outlives its process. Usage: output_dir_lock.sh TRAINER TOKENIZER CORPUS WORKDIR
set -uo pipefail
trainer=$1 tok=$2 corpus=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
echo '{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32}' >"$work/config.json"
head -c 30000 "$corpus" >"$work/corpus.txt"
args=(train --config_name "$work/config.json" --tokenizer_name "$tok" --train_file "$work/corpus.txt"
  --output_dir "$work/run" --block_size 32 --per_device_train_batch_size 4 --max_steps 100000 --save_steps 5
  --logging_steps 1 --use_cpu)
# A run is under way once its progress line shows a step.
started() { for _ in $(seq 1 1000); do grep -qE "\] step [0-9]+/" "$1" && return 0; sleep 0.02; done; return 1; }
trap 'kill -9 $(jobs -p) 2>/dev/null' EXIT
"$trainer" "${args[@]}" >"$work/first.txt" 2>&1 &
first=$!
started "$work/first.txt" || { tail -c 2000 "$work/first.txt"; echo "FAIL: the first run did not start"; exit 1; }
"$trainer" "${args[@]}" --overwrite_output_dir >"$work/second.txt" 2>&1
rc=$?
((rc != 0)) || { echo "FAIL: the second trainer was not refused"; exit 1; }
grep -q "is in use by another trainer (pid $first" "$work/second.txt" ||
  { tail -c 2000 "$work/second.txt"; echo "FAIL: the refusal does not name the first run's pid"; exit 1; }
kill -0 "$first" || { echo "FAIL: the first run died"; exit 1; }
echo "second trainer refused: $(head -n 1 "$work/second.txt")"
kill -TERM "$first"
wait "$first" || { echo "FAIL: the first run did not exit 0 on SIGTERM"; exit 1; }
"$trainer" "${args[@]}" --resume_from_checkpoint true --max_steps 1000 >"$work/third.txt" 2>&1 &
third=$!
started "$work/third.txt" || { tail -c 2000 "$work/third.txt"; echo "FAIL: the folder stayed locked after a clean exit"; exit 1; }
kill -KILL "$third"
wait "$third" 2>/dev/null
"$trainer" "${args[@]}" --resume_from_checkpoint true --max_steps 1 --overwrite_output_dir >"$work/fourth.txt" 2>&1
grep -q "in use" "$work/fourth.txt" && { echo "FAIL: a killed run left its lock behind"; exit 1; }
echo "PASS: second trainer refused; the lock is released by SIGTERM and by SIGKILL"
rm -rf "$work"
