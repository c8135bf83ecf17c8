#!/usr/bin/env bash
# One GPU check run (under ~8 minutes) on the device machine: unpack the CUDA build made by
# scripts/package_device.sh, print the GPU and library versions, run every test (the CUDA parity tests run
# instead of skipping), then the transformer-block benchmark on the GPU against PyTorch, table last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
work=/tmp/trainer_device && rm -rf "$work" && mkdir -p "$work" && tar -C "$work" -xJf .device/pkg.tar.xz
wheel_libs=$(python3 -c "import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))" 2>/dev/null)
extra=$(find "$wheel_libs/nvidia" -name 'lib' -type d 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="$work/lib:${extra}${LD_LIBRARY_PATH:-}"
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell} TRAINER_TORCH_PYTHON=python3 TRAINER_BENCH_DIR="$PWD/bench"
echo "== machine"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
echo "== tests"
"$work/bin/trainer_tests" --gtest_brief=1 2>&1 | tee "$OUT/tests.log" | grep -vE "^\[ +(OK|RUN) +\]" | tail -n 40
tests_rc=${PIPESTATUS[0]}
echo "== benchmark"
"$work/bin/bench_block" 20 cuda 2>&1 | tee "$OUT/bench_cuda.log"
OMP_NUM_THREADS=16 "$work/bin/bench_block" 5 cpu 2>&1 | tee "$OUT/bench_cpu16.log"
echo "== summary"
printf "%-34s %s\n" "tests (exit code)" "$tests_rc" "$(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/tests.log" | head -n 3 | tr '\n' ' ')" ""
grep -hE "trainer.cpp|pytorch|ratio" "$OUT"/bench_*.log
exit "$tests_rc"
