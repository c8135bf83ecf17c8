#!/usr/bin/env bash
# The default run's precision (issue 18): bf16 mixed precision, announced, where `trainer version` says the
# CPU's bf16 matmuls run natively (AMX tiles, or AMD's AVX512_BF16); fp32 and no announcement elsewhere;
# --bf16 false always fp32.
# Two optimizer steps each. Usage: default_run_precision.sh TRAINER WORKDIR
set -euo pipefail
trainer=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
run() { "$trainer" train --max_steps 2 --eval_steps 1000 --save_steps 1000 --report_to none --use_cpu \
  --output_dir "$work/run" --overwrite_output_dir "$@" 2>&1; }
native=0
[[ $("$trainer" version) == *"bf16 matmuls run natively on this CPU"* ]] && native=1
out=$(run) || { echo "FAIL: the default run failed"; echo "$out"; exit 1; }
if ((native)); then
  grep -q "trainer: the default run trains in bf16 mixed precision" <<<"$out" ||
    { echo "FAIL: native bf16 CPU, but the default run did not announce bf16"; echo "$out"; exit 1; }
  grep -q "^train: gpt2, .*, bfloat16" <<<"$out" || { echo "FAIL: default run not in bf16"; echo "$out"; exit 1; }
else
  grep -q "the default run trains in bf16" <<<"$out" && { echo "FAIL: bf16 chosen without native bf16"; exit 1; }
  grep -q "^train: gpt2, .*, float32" <<<"$out" || { echo "FAIL: default run not in fp32"; echo "$out"; exit 1; }
fi
out=$(run --bf16 false) || { echo "FAIL: --bf16 false failed"; echo "$out"; exit 1; }
grep -q "the default run trains in bf16" <<<"$out" && { echo "FAIL: --bf16 false was overridden"; exit 1; }
grep -q "^train: gpt2, .*, float32" <<<"$out" || { echo "FAIL: --bf16 false did not train fp32"; echo "$out"; exit 1; }
echo "PASS: default run precision (native bf16: $native)"
