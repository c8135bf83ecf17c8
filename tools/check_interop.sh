#!/usr/bin/env bash
# Interop check: models written by our save_pretrained are read back by tools/make_golden.py's own
# safetensors reader (Python + torch) with tensors identical to the original HF-layout checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
TRAINER_INTEROP_DIR="$out" build/release/tests/trainer_tests --gtest_also_run_disabled_tests \
  --gtest_filter='Interop.DISABLED_WriteSavedModels' >/dev/null
for m in gpt2_tied llama_gqa_llama3rope qwen2_tied_linearrope qwen3_qknorm_untied; do
  for v in "$m" "${m}_sharded"; do
    printf "%-32s " "$v"; /usr/bin/python3 tools/make_golden.py --verify "$out/$v" "tests/golden/$m"
  done
done
rm -rf "$out"
