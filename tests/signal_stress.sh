#!/usr/bin/env bash
# Sends SIGINT or SIGTERM to `trainer train` at chosen and random moments - start-up (model, tokenizer,
# loader workers starting), training steps, a checkpoint save, evaluation, the last step and shutdown - with
# 0-4 DataLoader workers, RUNS times. Every run must exit 0 and leave a checkpoint that `trainer info` loads
# and that --resume_from_checkpoint continues; no abort, no sanitizer report. Also checks that every thread
# but the signal thread blocks the stop signals.
# Usage: signal_stress.sh TRAINER TOKENIZER CORPUS WORKDIR [RUNS=100] [SEED=1]
set -uo pipefail
trainer=$1 tok=$2 corpus=$3 work=$4 runs=${5:-100}
RANDOM=${6:-1}
rm -rf "$work" && mkdir -p "$work"
cat >"$work/config.json" <<'JSON'
{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64}
JSON
head -c 60000 "$corpus" >"$work/corpus.txt"
# Evaluation every 4 steps on a 25% split and a save every 3 steps: evals and saves fill much of the run.
common=(train --config_name "$work/config.json" --tokenizer_name "$tok" --train_file "$work/corpus.txt"
  --block_size 64 --per_device_train_batch_size 8 --per_device_eval_batch_size 4 --max_steps 16
  --eval_strategy steps --eval_steps 4 --validation_split_percentage 25 --save_steps 3 --save_total_limit 2
  --logging_steps 1 --learning_rate 1e-3 --use_cpu)
fail() {
  echo "FAIL: run $1: $2"
  [[ -f $3 ]] && tail -n 20 "$3"
  exit 1
}
# Mask bits of SIGHUP (1), SIGINT (2), SIGTERM (15) in /proc's SigBlk.
readonly stop_bits=$(((1 << 0) | (1 << 1) | (1 << 14)))
blocks_stop_signals() { # pid/task status file -> true when all three are blocked
  local m
  m=$(awk '/^SigBlk:/ {print $2}' "$1" 2>/dev/null) || return 1
  [[ -n $m ]] && (((0x$m & stop_bits) == stop_bits))
}
wait_until_masked() { # the process has run its preinit: a signal from now on is ours to handle
  for _ in $(seq 1 500); do
    blocks_stop_signals "/proc/$1/status" && return 0
    sleep 0.01
  done
  return 1
}
wait_for() { # pid, test command...: polls until the command succeeds or the process ends
  local pid=$1
  shift
  while kill -0 "$pid" 2>/dev/null; do
    "$@" && return 0
    sleep 0.01
  done
  return 1
}
has_tmp_checkpoint() { compgen -G "$1/.tmp-checkpoint-*" >/dev/null; }
# The thread masks while training runs: only the signal thread (tr-signals, in sigwait) may take them.
check_thread_masks() {
  local pid=$1 open=0 t
  for t in /proc/"$pid"/task/*; do
    blocks_stop_signals "$t/status" && continue
    [[ $(cat "$t/comm" 2>/dev/null) == tr-signals ]] || { echo "thread $(cat "$t/comm") takes stop signals"; return 1; }
    open=$((open + 1))
  done
  ((open <= 1))
}
masks_checked=0 phases=(start-up steps save eval last-step)
declare -A by_phase
for i in $(seq 1 "$runs"); do
  # Every phase meets every worker count: phase i mod 5, workers (i + i/5) mod 5.
  workers=$(((i + i / 5) % 5)) phase=${phases[$((i % 5))]} sig=TERM
  ((RANDOM % 2)) && sig=INT
  out="$work/run$i" log="$work/log$i.txt"
  "$trainer" "${common[@]}" --output_dir "$out" --dataloader_num_workers "$workers" >"$log" 2>&1 &
  pid=$!
  wait_until_masked "$pid" || fail "$i" "the stop signals were never blocked" "$log"
  case $phase in
    start-up) sleep "0.$((RANDOM % 60))" ;;
    steps) wait_for "$pid" grep -q "step 1/" "$log" && sleep "0.$((RANDOM % 100))" ;;
    save) wait_for "$pid" has_tmp_checkpoint "$out" ;;
    eval) wait_for "$pid" grep -q "step $((4 * (1 + RANDOM % 3)))/" "$log" ;;
    last-step) wait_for "$pid" grep -q "step 16/16" "$log" && sleep "0.0$((RANDOM % 10))" ;;
  esac
  if ((masks_checked < 5)) && [[ $phase == steps ]] && kill -0 "$pid" 2>/dev/null; then
    check_thread_masks "$pid" || fail "$i" "a compute thread can receive SIGINT/SIGTERM/SIGHUP" "$log"
    masks_checked=$((masks_checked + 1))
  fi
  kill -s "$sig" "$pid" 2>/dev/null
  wait "$pid"
  rc=$?
  ((rc == 0)) || fail "$i" "exit status $rc after SIG$sig ($phase, $workers workers)" "$log"
  if grep -qE "AddressSanitizer|ThreadSanitizer|LeakSanitizer|runtime error:|corrupted|double free" "$log"; then
    fail "$i" "sanitizer or allocator report ($phase)" "$log"
  fi
  last=$(cd "$out" && ls -d checkpoint-* 2>/dev/null | sed 's/checkpoint-//' | sort -n | tail -1)
  [[ -n $last ]] || fail "$i" "no checkpoint after SIG$sig ($phase, $workers workers)" "$log"
  "$trainer" info "$out/checkpoint-$last" >/dev/null 2>"$work/info$i.txt" || fail "$i" "checkpoint-$last does not load" "$work/info$i.txt"
  "$trainer" "${common[@]}" --output_dir "$out" --dataloader_num_workers "$workers" --resume_from_checkpoint true \
    --max_steps $((last + 1)) >"$work/resume$i.txt" 2>&1 || fail "$i" "resume from checkpoint-$last failed" "$work/resume$i.txt"
  grep -q "resumed from .*checkpoint-$last at step $last" "$work/resume$i.txt" ||
    fail "$i" "resume did not start at step $last" "$work/resume$i.txt"
  grep -qE "AddressSanitizer|ThreadSanitizer|runtime error:" "$work/resume$i.txt" && fail "$i" "sanitizer report on resume" "$work/resume$i.txt"
  stopped=$(grep -oE "interrupted after step [0-9]+" "$log" | grep -oE "[0-9]+$" || echo "end")
  by_phase[$phase]="${by_phase[$phase]:-} $stopped"
  echo "run $i: SIG$sig during $phase, $workers workers -> exit 0, stopped at ${stopped}, checkpoint-$last resumes"
  rm -rf "$out"
done
((masks_checked > 0)) || { echo "FAIL: the thread masks were never checked"; exit 1; }
for p in "${phases[@]}"; do echo "phase $p: stopped at${by_phase[$p]:-}"; done
echo "PASS: $runs signals, $runs exits with status 0, $runs checkpoints resumed; thread masks checked in $masks_checked runs"
rm -rf "$work"
