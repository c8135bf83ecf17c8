#!/usr/bin/env bash
# Soak: a long run of a tiny GPT-2 with evaluation and a save every 200 steps (save_total_limit 2), sampling
# the process's resident memory and open file descriptors every few seconds. Passes when both are flat after
# the warm-up: RSS of the last tenth of the run within 1% of the second tenth's, the same descriptors.
# Usage: bench/soak.sh TRAINER TOKENIZER CORPUS [STEPS=20000] [WORKDIR=/tmp/trainer-soak]
set -euo pipefail
trainer=$1 tok=$2 corpus=$3 steps=${4:-20000} work=${5:-/tmp/trainer-soak}
rm -rf "$work" && mkdir -p "$work"
cat >"$work/config.json" <<'JSON'
{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32}
JSON
head -c 200000 "$corpus" >"$work/corpus.txt"
"$trainer" train --config_name "$work/config.json" --tokenizer_name "$tok" --train_file "$work/corpus.txt" \
  --output_dir "$work/run" --block_size 32 --per_device_train_batch_size 4 --max_steps "$steps" \
  --eval_strategy steps --eval_steps 200 --save_steps 200 --save_total_limit 2 --validation_split_percentage 5 \
  --logging_steps 50 --dataloader_num_workers 2 --use_cpu >"$work/log.txt" 2>&1 &
pid=$!
echo "seconds,step,rss_kib,fds,threads" >"$work/samples.csv"
t0=$(date +%s)
while kill -0 "$pid" 2>/dev/null; do
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  thr=$(awk '/^Threads:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
  step=$(tail -n 1 "$work/run/metrics.jsonl" 2>/dev/null | grep -oE '"step":[0-9]+' | grep -oE '[0-9]+' || true)
  [[ -n $rss && -n $step ]] && echo "$(($(date +%s) - t0)),$step,$rss,$fds,$thr" >>"$work/samples.csv"
  sleep 2
done
wait "$pid" || { tail -n 20 "$work/log.txt"; echo "FAIL: the run failed"; exit 1; }
tail -n 3 "$work/log.txt"
# Windows by step: warm = second tenth of the run, end = last tenth. Medians, to ignore a sample taken mid-save.
awk -F, -v steps="$steps" 'NR > 1 {
    if ($2 >= steps * 0.1 && $2 < steps * 0.2) { w[++nw] = $3; wf[nw] = $4 }
    if ($2 >= steps * 0.9) { e[++ne] = $3; ef[ne] = $4 }
    if ($3 > peak) peak = $3
  }
  function median(a, n,   i, j, t) {
    for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    if (nw == 0 || ne == 0) { print "FAIL: too few samples"; exit 1 }
    mw = median(w, nw); me = median(e, ne); g = (me - mw) / mw * 100
    fw = median(wf, nw); fe = median(ef, ne)  # medians: a save holds one more descriptor for a moment
    printf "samples %d + %d; RSS warm %.1f MiB, end %.1f MiB (growth %+.2f%%), peak %.1f MiB; open fds (median) warm %d, end %d\n",
      nw, ne, mw / 1024, me / 1024, g, peak / 1024, fw, fe
    if (g >= 1 || fe > fw) { print "FAIL: resident memory or descriptors grow"; exit 1 }
    print "PASS: flat after warm-up"
  }' "$work/samples.csv"
echo "samples: $work/samples.csv"
