#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/fuzz_*.cpp; clang, ASan + UBSan; preset "fuzz" in build/fuzz) and runs
# each in turn over its seed corpus (fuzz/corpus/<target>) and past findings (fuzz/regressions/<target>).
# Usage: scripts/fuzz.sh [seconds per target=600] [target...]   (long runs; new inputs kept in
#          build/fuzz/corpus/<target>, crashes in build/fuzz/artifacts/<target>/, stats in build/fuzz/stats.txt)
#        scripts/fuzz.sh --smoke [target...]   (ctest's fuzz_smoke: FUZZ_SMOKE_SECONDS=5 each, starting from the
#          seeds and regressions only, files under build/fuzz/smoke/; exit 77 = skipped without clang/libFuzzer)
# FUZZ_NO_BUILD=1 runs the binaries as they are (to continue a long run on the code it started with).
# Exits 1 if a regression input fails again or any target crashed, leaked, timed out or threw anything but
# tr::Error.
set -uo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"

smoke=0
if [[ "${1:-}" == "--smoke" ]]; then smoke=1; shift; fi
secs=600
if ((!smoke)) && [[ "${1:-}" =~ ^[0-9]+$ ]]; then secs=$1; shift; fi
((smoke)) && secs=${FUZZ_SMOKE_SECONDS:-5}
all_targets=(safetensors_header config_json tokenizer_json checkpoint_state optimizer_state args_file token_shard
             metrics_jsonl documents fsdp_config rank_files device_memory allocation_trace lr_schedule
             config_overrides deepspeed_config)
targets=("$@")
((${#targets[@]})) || targets=("${all_targets[@]}")

# Inputs longer than max_len are cut, so each must hold the largest seed; JSON targets get the dictionary.
declare -A max_len=([safetensors_header]=4096 [config_json]=4096 [tokenizer_json]=8192 [checkpoint_state]=4096
                    [optimizer_state]=4096 [args_file]=4096 [token_shard]=4096 [metrics_jsonl]=4096
                    [documents]=4096 [fsdp_config]=4096 [rank_files]=4096 [device_memory]=256
                    [allocation_trace]=4096 [lr_schedule]=1024 [config_overrides]=1024
                    [deepspeed_config]=4096)
declare -A dict=([config_json]=1 [tokenizer_json]=1 [checkpoint_state]=1 [args_file]=1 [metrics_jsonl]=1
                 [documents]=1 [fsdp_config]=1 [lr_schedule]=1 [deepspeed_config]=1)

# No clang or no libFuzzer runtime: skip, loudly (ctest SKIP_RETURN_CODE 77); scripts/setup.sh installs both.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
# The libraries use OpenMP, which under clang is LLVM's libomp.
echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' >"$probe/p.cpp"
if ! command -v clang++ >/dev/null || ! clang++ -fopenmp -fsanitize=fuzzer,address,undefined "$probe/p.cpp" \
    -o "$probe/p" 2>"$probe/err"; then
  echo "************************************************************************************************"
  echo "fuzz: SKIPPED - clang++ with libFuzzer (and libomp) is not available ($(command -v clang++ || echo 'no clang++'))."
  head -n 3 "$probe/err" 2>/dev/null
  echo "fuzz: install it with scripts/setup.sh (Debian: clang libclang-rt-14-dev libomp-dev)."
  echo "************************************************************************************************"
  exit 77
fi

out=build/fuzz
build_targets=()
for t in "${targets[@]}"; do
  [[ -n "${max_len[$t]:-}" ]] || { echo "fuzz: unknown target '$t' (${all_targets[*]})"; exit 2; }
  build_targets+=("fuzz_$t")
done
# Configure once; ninja reconfigures by itself when a CMakeLists.txt changes, so reruns only rebuild. The lock
# serializes builds of concurrent runs (a long run and ctest's smoke run, say) in the one build folder.
mkdir -p "$out"
(
  flock 9
  # FUZZ_NO_BUILD=1: run the targets as built (a long run continued on the binaries of its first part).
  if [[ -n "${FUZZ_NO_BUILD:-}" ]]; then
    for t in "${build_targets[@]}"; do [[ -x $out/$t ]] || { echo "fuzz: $out/$t is not built"; exit 1; }; done
    exit 0
  fi
  if [[ ! -f $out/build.ninja ]]; then
    cmake --preset fuzz >"$probe/cmake.log" 2>&1 || { cat "$probe/cmake.log"; exit 1; }
  fi
  cmake --build "$out" --target "${build_targets[@]}" -j "${FUZZ_BUILD_JOBS:-2}"
) 9>"$out/.build.lock" || exit 1

# Smoke and long runs keep their corpora, logs and artifacts apart; runs of one kind take turns on a target
# (two long runs of different targets may share the machine, one core each).
run_dir=$out
((smoke)) && run_dir=$out/smoke
mkdir -p "$run_dir/logs"

# libFuzzer's default error exit code is 77, the skip code above: make every finding exit 1. Sanitizers stop
# at the first report; OpenMP stays on one thread (nothing here is parallel work).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0}"
export OMP_NUM_THREADS=1
failed=()
summary=()
# Runs a fuzzer ($1: log, then the command) and returns its status. libFuzzer ends with _Exit, so the process
# leaves its scratch folder and libomp's registration file in /dev/shm behind: they go here, by its pid. It
# runs in the background to know that pid, where it ignores SIGINT: an interrupted script passes on SIGTERM.
cur=""
tidy() { rm -rf "/dev/shm/trainer-fuzz-$cur" "${TMPDIR:-/tmp}/trainer-fuzz-$cur" /dev/shm/__KMP_REGISTERED_LIB_"$cur"_*; }
trap 'if [[ -n $cur ]]; then kill -TERM "$cur" 2>/dev/null; wait "$cur"; tidy; fi; exit 130' INT TERM
run() {
  local log=$1 rc
  shift
  "$@" >"$log" 2>&1 &
  cur=$!
  wait "$cur"
  rc=$?
  tidy
  cur=""
  return "$rc"
}
# The lines of a failed run's log that say what failed and where.
report() { grep -aE 'ERROR|runtime error|terminate called|what\(\)|SUMMARY|Test unit written|^    #[0-9] ' "$1" | head -n "$2"; }
# CPU seconds of the children this shell has waited for (utime + stime, in clock ticks, fields 16 and 17 of
# /proc/PID/stat): libFuzzer's -max_total_time is wall time, the runs are reported in CPU time.
tick=$(getconf CLK_TCK)
children_cpu() { local f; read -ra f <"/proc/$$/stat"; echo $(((f[15] + f[16]) / tick)); }
for t in "${targets[@]}"; do
  exec 8>"$run_dir/.run.lock.$t"
  flock -n 8 || { echo "fuzz: waiting for another $( ((smoke)) && echo smoke || echo long) run of $t"; flock 8; }
  corpus="$run_dir/corpus/$t"
  ((smoke)) && rm -rf "$corpus"  # the smoke run starts from the seeds each time: its length stays fixed
  mkdir -p "$corpus" "$run_dir/artifacts/$t"
  bin="$out/fuzz_$t"
  # Past findings one by one, so each that fails again is named; those that pass join the seeds (a failing
  # one would stop the fuzzing below at its first input; libFuzzer takes folders only, hence the copies).
  passed="$run_dir/regressions_passed/$t" && rm -rf "$passed" && mkdir -p "$passed"
  regress_failed=()
  for f in fuzz/regressions/"$t"/*; do
    [[ -f $f ]] || continue
    if run "$run_dir/logs/$t.regression.log" "$bin" -error_exitcode=1 -timeout=5 -rss_limit_mb=4096 "$f"; then
      cp "$f" "$passed/"
    else
      regress_failed+=("$f")
      echo "---- $t: regression $f fails again ----"
      report "$run_dir/logs/$t.regression.log" 12
    fi
  done
  opts=(-max_total_time="$secs" -max_len="${max_len[$t]}" -timeout=5 -rss_limit_mb=4096 -error_exitcode=1
        -timeout_exitcode=1 -print_final_stats=1 -artifact_prefix="$run_dir/artifacts/$t/")
  [[ -n "${dict[$t]:-}" ]] && opts+=(-dict=fuzz/json.dict)
  log="$run_dir/logs/$t.log"
  echo "fuzz: $t for ${secs}s"
  # The first corpus folder receives new inputs; the seeds and the passing regressions are read only.
  cpu0=$(children_cpu)
  run "$log" "$bin" "${opts[@]}" "$corpus" fuzz/corpus/"$t" "$passed"
  rc=$?
  cpu=$(($(children_cpu) - cpu0))
  done_line=$(grep -aE '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  cov=$(sed -nE 's/.* cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+).*/cov \1 ft \2 corpus \3/p' <<<"$done_line")
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -n 1)
  line=$(printf '%-20s cpu %5s s execs %-10s exec/s %-7s %s rss %s MB' "$t" "$cpu" "${execs:-?}" "${rate:-?}" \
    "${cov:-cov ?}" "${rss:-?}")
  if ((${#regress_failed[@]})); then
    failed+=("$t")
    line+="  REGRESSIONS FAIL: ${regress_failed[*]}"
  fi
  if ((rc != 0)); then
    ((${#regress_failed[@]})) || failed+=("$t")
    line+="  FINDING (rc $rc, log $log)"
    echo "---- $t: finding (from $log) ----"
    report "$log" 30
  fi
  echo "$line"
  summary+=("$line")
done

echo "==== fuzz summary ($( ((smoke)) && echo smoke || echo long) run, ${secs}s per target, $(date -u +%FT%TZ)) ===="
printf '%s\n' "${summary[@]}"
((smoke)) || { echo "# $(date -u +%FT%TZ) ${secs}s per target"; printf '%s\n' "${summary[@]}"; } >>"$out/stats.txt"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (reproduce: $out/fuzz_<target> <file>; new findings in $run_dir/artifacts/)"
  exit 1
fi
echo "fuzz: PASS"
