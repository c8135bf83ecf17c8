#!/usr/bin/env bash
# A save into a full filesystem: a 40 MB tmpfs holds one checkpoint of the run but not two. The run must stop
# with one message saying "No space left on device" and naming the path, exit non-zero, leave no temporary
# folder behind, and keep the previous checkpoint intact: it loads, and resumes elsewhere. Needs mount
# rights (root in CI); without them it exits 77 (skipped; tests/test_reliability.cpp simulates the failure).
# Usage: disk_full.sh TRAINER TOKENIZER CORPUS WORKDIR
set -uo pipefail
trainer=$1 tok=$2 corpus=$3 work=$4
umount "$work/disk" 2>/dev/null
rm -rf "$work" && mkdir -p "$work/disk"
if ! mount -t tmpfs -o size=40m tmpfs "$work/disk" 2>/dev/null; then
  echo "SKIP: cannot mount a tmpfs here (not root?): the full-disk case is simulated in the gtest suite only"
  exit 77
fi
trap 'umount "$work/disk" 2>/dev/null' EXIT
echo '{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32}' >"$work/config.json"
head -c 30000 "$corpus" >"$work/corpus.txt"
args=(train --config_name "$work/config.json" --tokenizer_name "$tok" --train_file "$work/corpus.txt"
  --block_size 32 --per_device_train_batch_size 4 --max_steps 8 --save_steps 2 --logging_steps 1 --use_cpu)
"$trainer" "${args[@]}" --output_dir "$work/disk/run" >"$work/log.txt" 2>&1
rc=$?
((rc != 0)) || { echo "FAIL: the run succeeded on a full disk"; exit 1; }
((rc < 128)) || { tail -c 1500 "$work/log.txt"; echo "FAIL: killed by a signal ($rc)"; exit 1; }
msg=$(grep "error:" "$work/log.txt" | head -n 1)
echo "message: $msg"
grep -qi "no space left on device" <<<"$msg" || { tail -c 1500 "$work/log.txt"; echo "FAIL: the message does not say no space left"; exit 1; }
grep -q "$work/disk/run" <<<"$msg" || { echo "FAIL: the message does not name the path"; exit 1; }
compgen -G "$work/disk/run/.tmp-*" >/dev/null && { ls -la "$work/disk/run"; echo "FAIL: a temporary folder was left on the full disk"; exit 1; }
last=$(cd "$work/disk/run" && ls -d checkpoint-* 2>/dev/null | sed 's/checkpoint-//' | sort -n | tail -1)
[[ -n $last ]] || { echo "FAIL: no checkpoint survived"; exit 1; }
grep -q "checkpoint-$last" <<<"$msg" || { echo "FAIL: the message does not name the intact checkpoint-$last"; exit 1; }
"$trainer" info "$work/disk/run/checkpoint-$last" >/dev/null || { echo "FAIL: checkpoint-$last does not load"; exit 1; }
cp -r "$work/disk/run" "$work/moved"
"$trainer" "${args[@]}" --output_dir "$work/moved" --resume_from_checkpoint true >"$work/resume.txt" 2>&1 ||
  { tail -c 1500 "$work/resume.txt"; echo "FAIL: resume from checkpoint-$last"; exit 1; }
grep -q "resumed from .*checkpoint-$last at step $last" "$work/resume.txt" || { echo "FAIL: wrong resume"; exit 1; }
echo "PASS: full disk reported, checkpoint-$last intact and resumed"
umount "$work/disk" && rm -rf "$work"
