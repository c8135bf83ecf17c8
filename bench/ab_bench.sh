#!/usr/bin/env bash
# Two trainer binaries against each other on a host whose speed drifts: the runs alternate A B, B A, A B, ...
# (each model in turn), ROUNDS rounds, so a drift hits both alike, and the best of each is kept. Models (bench_models.sh): the tiny one
# eager and --torch_compile (STEPS_TINY steps), the side-by-side one in fp32 and --bf16 (STEPS_SIDE steps,
# dropout on). Prints tokens/s (train_results.json's) and B / A per row, and checks both binaries logged the
# same losses and gradient norms (a speed change that moved a bit says so).
# Usage: bench/ab_bench.sh TRAINER_A TRAINER_B GPT2_TOKENIZER CORPUS [ROUNDS=3] [STEPS_TINY=3000] [STEPS_SIDE=40]
#        [WORKDIR=/tmp/trainer-ab-bench]
set -euo pipefail
a=$1 b=$2 tok=$3 corpus=$4 rounds=${5:-3} steps_tiny=${6:-3000} steps_side=${7:-40} work=${8:-/tmp/trainer-ab-bench}
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/bench_models.sh"
write_bench_models "$work" "$corpus"
tiny=(--config_name "$work/tiny.json" --tokenizer_name "$work/bytes.json" --block_size 64
  --per_device_train_batch_size 4 --max_steps "$steps_tiny" --logging_steps 500)
side=(--config_name "$work/side.json" --tokenizer_name "$tok" --block_size 128 --per_device_train_batch_size 8
  --max_steps "$steps_side" --logging_steps 10)
declare -A best
run() { # which name args...
  local which=$1 name=$2 bin out
  shift 2
  bin=$a && [[ $which == B ]] && bin=$b
  out="$work/$name-$which"
  rm -rf "$out"
  "$bin" train --train_file "$work/corpus.txt" --output_dir "$out" --save_strategy no --use_cpu "$@" \
    >"$out.log" 2>&1 || { tail -n 5 "$out.log"; exit 1; }
  local tps
  tps=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['train_tokens_per_second'])" \
    "$out/train_results.json")
  best[$name-$which]=$(python3 -c "print(max(float('${best[$name-$which]:-0}'), $tps))")
}
echo "ab_bench: A=$a B=$b, best of $rounds alternating rounds, $(nproc) cores, $(date -u +%FT%TZ)"
for r in $(seq 1 "$rounds"); do
  order=(A B) && ((r % 2 == 0)) && order=(B A)
  for which in "${order[@]}"; do run "$which" tiny_eager "${tiny[@]}"; done
  for which in "${order[@]}"; do run "$which" tiny_compiled "${tiny[@]}" --torch_compile; done
  for which in "${order[@]}"; do run "$which" side_fp32 "${side[@]}"; done
  for which in "${order[@]}"; do run "$which" side_bf16 "${side[@]}" --bf16; done
done
curve() { python3 -c "
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    if 'loss' in j: print(j['loss'], j.get('grad_norm'))" "$1"; }
for name in tiny_eager tiny_compiled side_fp32 side_bf16; do
  same="same losses and gradient norms"
  [[ "$(curve "$work/$name-A/metrics.jsonl")" == "$(curve "$work/$name-B/metrics.jsonl")" ]] || same="LOSSES DIFFER"
  python3 -c "
a, b = ${best[$name-A]}, ${best[$name-B]}
print(f'$name: A {a:,.0f} tok/s, B {b:,.0f} tok/s, B / A {b / a:.2f}x; $same')"
done
