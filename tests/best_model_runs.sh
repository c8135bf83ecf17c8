#!/usr/bin/env bash
# HF's evaluation-driven arguments end to end: load_best_model_at_end (the final model and evaluation are the
# best checkpoint's, save_total_limit keeps it and 1 leaves it alone at the end), save_strategy best,
# reduce_lr_on_plateau (the rate falls after evaluations without improvement; its state survives a resume
# bit-exactly), logging_strategy, eval_on_start, eval_delay, save_only_model (no resume from it), and the
# messages for the combinations HF refuses.
# Usage: best_model_runs.sh TRAINER TOKENIZER CORPUS WORKDIR
set -uo pipefail
trainer=$1 tok=$2 corpus=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
echo '{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64}' >"$work/config.json"
head -c 60000 "$corpus" >"$work/corpus.txt"
args=(train --config_name "$work/config.json" --tokenizer_name "$tok" --train_file "$work/corpus.txt"
  --block_size 64 --per_device_train_batch_size 8 --max_steps 12 --validation_split_percentage 20
  --learning_rate 0.05 --lr_scheduler_type constant --logging_steps 2 --use_cpu)
# The eval losses of the runs below (lr 0.05, constant): each run evaluates the same weights at a step.
evals() { python3 -c "import json,sys; print(' '.join('%d:%.6f' % (e['step'], e['eval_loss']) for e in json.load(open(sys.argv[1]))['log_history'] if 'eval_loss' in e))" "$1"; }
state() { python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(s['best_global_step'], s['best_model_checkpoint'])" "$1"; }

# load_best_model_at_end: with greater_is_better the "best" loss is the highest, so the best checkpoint is
# not the last one. The final model is its bytes, the final evaluation its evaluation, and save_total_limit 1
# leaves that checkpoint alone.
"$trainer" "${args[@]}" --output_dir "$work/best" --eval_strategy steps --eval_steps 2 --save_steps 2 \
  --save_total_limit 1 --load_best_model_at_end --greater_is_better true >"$work/best.txt" 2>&1 ||
  { tail -c 2000 "$work/best.txt"; fail "the load_best_model_at_end run"; }
read -r best_step best_dir <<<"$(state "$work/best/trainer_state.json")"
highest=$(evals "$work/best/trainer_state.json" | tr ' ' '\n' | head -6 | sort -t: -k2 -g | tail -1 | cut -d: -f1)
[[ $best_step == "$highest" && $best_step != 12 ]] ||
  fail "best_global_step $best_step, expected the step of the highest eval_loss ($highest, not 12): $(evals "$work/best/trainer_state.json")"
[[ $best_dir == "$work/best/checkpoint-$best_step" ]] || fail "best_model_checkpoint $best_dir"
cmp -s "$work/best/model.safetensors" "$work/best/checkpoint-$best_step/model.safetensors" ||
  fail "the final model is not checkpoint-$best_step's"
[[ $(ls -d "$work/best"/checkpoint-* | wc -l) == 1 ]] || fail "save_total_limit 1 left $(ls -d "$work/best"/checkpoint-*)"
grep -q "load_best_model_at_end: the final model is $work/best/checkpoint-$best_step's" "$work/best.txt" ||
  fail "no load_best_model_at_end line"
# The final evaluation is the best checkpoint's, and evaluating the saved model gives it again, bit for bit.
final=$(python3 -c "import json; print(repr(json.load(open('$work/best/eval_results.json'))['eval_loss']))")
at_best=$(python3 -c "import json; print(repr([e['eval_loss'] for e in json.load(open('$work/best/trainer_state.json'))['log_history'] if e.get('step') == $best_step and 'eval_loss' in e][0]))")
[[ $final == "$at_best" ]] || fail "eval_results.json eval_loss $final, the best step's $at_best"
"$trainer" eval --model_name_or_path "$work/best" --train_file "$work/corpus.txt" --validation_split_percentage 20 \
  --block_size 64 --output_dir "$work/best_eval" --use_cpu >"$work/best_eval.txt" 2>&1 || fail "trainer eval of the best model"
again=$(python3 -c "import json; print(repr(json.load(open('$work/best_eval/eval_results.json'))['eval_loss']))")
[[ $again == "$final" ]] || fail "the saved best model evaluates to $again, not $final"
echo "load_best_model_at_end: checkpoint-$best_step kept and saved as the model; eval_loss $final reproduced"

# save_strategy best: a checkpoint exactly at the evaluations that improved the metric (with greater_is_better
# the higher loss: some evaluations do not improve it, and get no checkpoint).
"$trainer" "${args[@]}" --output_dir "$work/sbest" --eval_strategy steps --eval_steps 2 --save_strategy best \
  --metric_for_best_model loss --greater_is_better true >"$work/sbest.txt" 2>&1 ||
  { tail -c 2000 "$work/sbest.txt"; fail "save_strategy best"; }
expected=$(evals "$work/sbest/trainer_state.json" | tr ' ' '\n' | awk -F: 'NR==1 || $2 > max {print $1; max=$2}' | tr '\n' ' ')
saved=$(ls -d "$work/sbest"/checkpoint-* | sed 's/.*checkpoint-//' | sort -n | tr '\n' ' ')
[[ $saved == "$expected" ]] || fail "save_strategy best saved at steps $saved; the new bests were at $expected"
[[ $(echo "$saved" | wc -w) -lt 6 ]] || fail "save_strategy best saved at every evaluation ($saved): nothing tested"
echo "save_strategy best: checkpoints at $saved"

# A resumed run whose output_dir moved: best_model_checkpoint is this folder's checkpoint of that step, and
# with save_total_limit 1 that checkpoint alone stays (the stale path deleted nothing).
"$trainer" "${args[@]}" --output_dir "$work/moved" --max_steps 8 --eval_strategy steps --eval_steps 2 --save_steps 2 \
  --save_total_limit 2 --metric_for_best_model loss --greater_is_better true >"$work/moved.txt" 2>&1 ||
  fail "the run to move"
mv "$work/moved" "$work/moved2"
"$trainer" "${args[@]}" --output_dir "$work/moved2" --eval_strategy steps --eval_steps 2 --save_steps 2 \
  --save_total_limit 1 --load_best_model_at_end --greater_is_better true --resume_from_checkpoint true \
  >"$work/moved2.txt" 2>&1 || { tail -c 2000 "$work/moved2.txt"; fail "the resumed run in the moved folder"; }
[[ $(ls -d "$work/moved2"/checkpoint-*) == "$work/moved2/checkpoint-$best_step" ]] ||
  fail "after the moved resume: $(ls -d "$work/moved2"/checkpoint-*), expected checkpoint-$best_step alone"
cmp -s "$work/moved2/model.safetensors" "$work/moved2/checkpoint-$best_step/model.safetensors" ||
  fail "the moved resume's final model is not checkpoint-$best_step's"
echo "moved output_dir: checkpoint-$best_step found, kept and saved as the model"

# reduce_lr_on_plateau: the rate falls after evaluations without improvement (patience 0), and a run stopped
# at step 6 and resumed ends with the same weights as one that was not stopped.
plateau=(--eval_strategy steps --eval_steps 2 --save_steps 2 --lr_scheduler_type reduce_lr_on_plateau
  --lr_scheduler_kwargs '{"patience": 0, "factor": 0.5}')
"$trainer" "${args[@]}" --output_dir "$work/plateau" "${plateau[@]}" >"$work/plateau.txt" 2>&1 ||
  { tail -c 2000 "$work/plateau.txt"; fail "reduce_lr_on_plateau"; }
grep -q "reduce_lr_on_plateau: learning rate 0.05 -> 0.025" "$work/plateau.txt" ||
  fail "no reduction logged: $(grep -E 'eval:|reduce' "$work/plateau.txt")"
rates=$(python3 -c "import json; print(sorted({e['learning_rate'] for e in map(json.loads, open('$work/plateau/metrics.jsonl')) if 'learning_rate' in e}))")
[[ $rates == *0.025* ]] || fail "metrics.jsonl's learning rates $rates"
"$trainer" "${args[@]}" --output_dir "$work/plateau2" "${plateau[@]}" --max_steps 6 >"$work/plateau2.txt" 2>&1 ||
  fail "the first half of the plateau run"
"$trainer" "${args[@]}" --output_dir "$work/plateau2" "${plateau[@]}" --resume_from_checkpoint true >"$work/plateau3.txt" 2>&1 ||
  { tail -c 2000 "$work/plateau3.txt"; fail "the resumed plateau run"; }
cmp -s "$work/plateau/model.safetensors" "$work/plateau2/model.safetensors" ||
  fail "a resumed reduce_lr_on_plateau run ends with other weights (its state was not restored)"
echo "reduce_lr_on_plateau: rates $rates; resumed at step 6 to the same weights"

# logging_strategy epoch / no, eval_on_start, eval_delay.
"$trainer" "${args[@]}" --output_dir "$work/logs" --num_train_epochs 2 --max_steps -1 --logging_strategy epoch \
  --eval_strategy steps --eval_steps 2 --eval_delay 5 --eval_on_start --save_strategy no >"$work/logs.txt" 2>&1 ||
  { tail -c 2000 "$work/logs.txt"; fail "logging_strategy epoch"; }
logged=$(python3 -c "import json; print(' '.join(str(e['step']) for e in map(json.loads, open('$work/logs/metrics.jsonl')) if 'loss' in e))")
evald=$(python3 -c "import json; print(' '.join(str(e['step']) for e in map(json.loads, open('$work/logs/metrics.jsonl')) if 'eval_loss' in e))")
per_epoch=$(python3 -c "import json; print(json.load(open('$work/logs/trainer_state.json'))['max_steps'] // 2)")
[[ $logged == "$per_epoch $((2 * per_epoch))" ]] || fail "logging_strategy epoch logged steps $logged (epochs of $per_epoch steps)"
first_eval=${evald%% *}
second=$(echo "$evald" | cut -d' ' -f2)
[[ $first_eval == 0 && $second == 6 ]] || fail "eval_on_start and eval_delay 5: evaluations at $evald"
"$trainer" "${args[@]}" --output_dir "$work/nolog" --logging_strategy no --save_strategy no >"$work/nolog.txt" 2>&1 ||
  fail "logging_strategy no"
[[ -f $work/nolog/metrics.jsonl ]] || fail "logging_strategy no: no metrics.jsonl"
! grep -q '"loss"' "$work/nolog/metrics.jsonl" || fail "logging_strategy no logged a loss"
echo "logging_strategy epoch: steps $logged; evaluations at $evald"

# save_only_model: checkpoints without optimizer, scheduler or RNG state; a resume from one is refused.
"$trainer" "${args[@]}" --output_dir "$work/only" --max_steps 2 --save_steps 1 --save_only_model >"$work/only.txt" 2>&1 ||
  fail "save_only_model"
[[ -f $work/only/checkpoint-2/model.safetensors && ! -e $work/only/checkpoint-2/optimizer.safetensors &&
  ! -e $work/only/checkpoint-2/rng_state.json ]] || fail "save_only_model wrote $(ls "$work/only/checkpoint-2")"
"$trainer" "${args[@]}" --output_dir "$work/only" --max_steps 4 --resume_from_checkpoint true >"$work/only2.txt" 2>&1 &&
  fail "a resume from a save_only_model checkpoint was accepted"
grep -q "saved with --save_only_model" "$work/only2.txt" || fail "no message: $(tail -c 300 "$work/only2.txt")"

# The combinations HF refuses, refused before any work with its reason.
refused() { # expected message, flags...
  local want=$1
  shift
  "$trainer" "${args[@]}" --output_dir "$work/refused" "$@" >"$work/refused.txt" 2>&1 && fail "accepted: $*"
  grep -qF -- "$want" "$work/refused.txt" || fail "for $*: expected '$want', got: $(tail -c 300 "$work/refused.txt")"
  [[ ! -e $work/refused ]] || fail "a refused run made its output_dir"
}
refused "requires the save and eval strategies to match" --load_best_model_at_end --eval_strategy steps --save_strategy epoch
refused "is not a multiple of --eval_steps 4" --load_best_model_at_end --eval_strategy steps --eval_steps 4 --save_steps 6
refused "mixing a ratio and a step count" --load_best_model_at_end --eval_strategy steps --eval_steps 0.4 --save_steps 6
refused "reduce_lr_on_plateau is stepped by evaluations" --lr_scheduler_type reduce_lr_on_plateau
refused "--save_strategy best needs --metric_for_best_model" --save_strategy best --eval_strategy steps
refused "expected loss or perplexity" --metric_for_best_model runtime --eval_strategy steps
refused "'num_cycles' is not an argument of the linear schedule" --lr_scheduler_type linear --lr_scheduler_kwargs '{"num_cycles": 2}'
refused "--do_train false: trainer train always trains" --do_train false
refused "--do_predict: run_clm has no test split" --do_predict
echo "best_model_runs: OK"
