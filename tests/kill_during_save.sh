#!/usr/bin/env bash
# Kills `trainer train` with SIGKILL at random moments while it saves a checkpoint every step, six times, and
# checks after each kill that every checkpoint-N folder is complete and loadable, then that
# --resume_from_checkpoint true continues. Usage: kill_during_save.sh TRAINER TOKENIZER CORPUS WORKDIR
set -euo pipefail
trainer=$1 tok=$2 corpus=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
cat >"$work/config.json" <<'JSON'
{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64}
JSON
head -c 30000 "$corpus" >"$work/corpus.txt"
common=(train --config_name "$work/config.json" --tokenizer_name "$tok" --train_file "$work/corpus.txt"
  --output_dir "$work/run" --block_size 32 --per_device_train_batch_size 4 --max_steps 100000 --save_steps 1
  --save_total_limit 2 --logging_steps 1000 --use_cpu)
check() {
  local n=0
  for d in "$work"/run/checkpoint-*; do
    [[ -d $d ]] || continue
    for f in config.json model.safetensors optimizer.safetensors scheduler.json rng_state.json trainer_state.json \
      training_args.json tokenizer.json; do
      [[ -s $d/$f ]] || { echo "FAIL: $d lacks $f"; exit 1; }
    done
    "$trainer" info "$d" >/dev/null || { echo "FAIL: $d does not load"; exit 1; }
    n=$((n + 1))
  done
  echo "after kill $1: $n complete checkpoint(s): $(cd "$work/run" && ls -d checkpoint-* 2>/dev/null | tr '\n' ' ')"
}
RANDOM=7
for i in 1 2 3 4 5 6; do
  resume=()
  compgen -G "$work/run/checkpoint-*" >/dev/null && resume=(--resume_from_checkpoint true)
  "$trainer" "${common[@]}" "${resume[@]}" --overwrite_output_dir >"$work/log$i.txt" 2>&1 &
  pid=$!
  # Kill at a random moment after set-up (the line before the first step; every step saves): a fixed delay
  # from launch killed loaded machines' runs before their first step.
  for _ in $(seq 1 1500); do
    grep -q "^train: gpt2" "$work/log$i.txt" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.04
  done
  sleep "$((1 + RANDOM % 2)).$((RANDOM % 10))"
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  check "$i"
done
last=$(cd "$work/run" && ls -d checkpoint-* | sed 's/checkpoint-//' | sort -n | tail -1)
[[ -n $last ]] || { echo "FAIL: no checkpoint survived"; exit 1; }
"$trainer" train "${common[@]:1}" --resume_from_checkpoint true --max_steps $((last + 2)) >"$work/final.txt" 2>&1 ||
  { cat "$work/final.txt"; echo "FAIL: resume"; exit 1; }
grep -q "resumed from .*checkpoint-$last at step $last" "$work/final.txt" || { echo "FAIL: wrong resume"; exit 1; }
echo "PASS: resumed from checkpoint-$last after 6 kills"
rm -rf "$work"
