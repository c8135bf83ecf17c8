#!/usr/bin/env bash
# torch_compile against eager in one run, alternating (eager, compiled) ROUNDS times per model, on the CPU:
# (a) an overhead-bound tiny GPT-2 (n_embd 64, 2 layers, no dropout, a 257-token byte-level vocabulary, block 64,
# batch 4), (b) the side-by-side model (n_embd 256, 4 layers, GPT-2's vocabulary, block 128, batch 8).
# Prints tokens/s (train_results.json's, evaluation excluded), peak memory and the compiled / eager ratio, and
# checks the two runs ended on the same weights.
# Usage: bench/compile_bench.sh TRAINER GPT2_TOKENIZER CORPUS [STEPS=60] [ROUNDS=2] [WORKDIR=/tmp/trainer-compile-bench]
set -euo pipefail
trainer=$1 tok=$2 corpus=$3 steps=${4:-60} rounds=${5:-2} work=${6:-/tmp/trainer-compile-bench}
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/bench_models.sh"
write_bench_models "$work" "$corpus"
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
bench() { # name config tokenizer block batch
  local name=$1 cfg=$2 tk=$3 block=$4 batch=$5 e=0 c=0 em=0 cm=0
  for r in $(seq 1 "$rounds"); do
    for mode in eager compiled; do
      local out="$work/$name-$mode" extra=()
      [[ $mode == compiled ]] && extra=(--torch_compile)
      rm -rf "$out"
      "$trainer" train --config_name "$cfg" --tokenizer_name "$tk" --train_file "$work/corpus.txt" \
        --output_dir "$out" --block_size "$block" --per_device_train_batch_size "$batch" --max_steps "$steps" \
        --logging_steps 20 --save_strategy no --use_cpu "${extra[@]}" >"$out.log" 2>&1 ||
        { tail -n 5 "$out.log"; exit 1; }
      local tps mem
      tps=$(field "$out/train_results.json" train_tokens_per_second)
      mem=$(field "$out/train_results.json" train_peak_memory_gib)
      if [[ $mode == eager ]]; then e=$(python3 -c "print(max($e, $tps))"); em=$mem; else
        c=$(python3 -c "print(max($c, $tps))"); cm=$mem; fi
    done
    cmp -s "$work/$name-eager/model.safetensors" "$work/$name-compiled/model.safetensors" ||
      { echo "FAIL: $name: compiled and eager weights differ"; exit 1; }
  done
  python3 -c "
e, c, em, cm = $e, $c, $em, $cm
print(f'$name: eager {e:,.0f} tok/s, compiled {c:,.0f} tok/s, ratio {c / e:.2f}x; peak memory eager {em * 1024:.1f} MiB, compiled {cm * 1024:.1f} MiB; weights identical')"
  python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
p, m = r['compiled_planned_peak_memory_gib'] * 1024, r['compiled_replayed_peak_memory_gib'] * 1024
print(f'$name: replayed steps planned at {p:.3f} MiB, measured {m:.3f} MiB')" "$work/$name-compiled/train_results.json"
  grep -h "torch_compile: captured" "$work/$name-compiled.log" | head -n 1
}
echo "compile_bench: $steps steps, best of $rounds alternating rounds, $(nproc) cores, $(date -u +%FT%TZ)"
bench tiny "$work/tiny.json" "$work/bytes.json" 64 4
bench side_by_side "$work/side.json" "$tok" 128 8
