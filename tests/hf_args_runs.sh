#!/usr/bin/env bash
# A run_clm.py command line runs as it is: run_clm's and HF's arguments beside the guide's knobs (do_train,
# disable_tqdm, run_name, include_num_input_tokens_seen, gradient_checkpointing_kwargs, prefetch, sample
# limits, the flags whose value is what we always do); an HF TrainingArguments dump of every field trains;
# a field we do not have gets its reason, not "unknown flag".
# Usage: hf_args_runs.sh TRAINER TOKENIZER CORPUS WORKDIR
set -uo pipefail
trainer=$1 tok=$2 corpus=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
echo '{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}' >"$work/config.json"
head -c 40000 "$corpus" >"$work/corpus.txt"
common=(--config_name "$work/config.json" --tokenizer_name "$tok" --train_file "$work/corpus.txt" --block_size 64
  --use_cpu)

"$trainer" train "${common[@]}" --output_dir "$work/clm" --do_train --do_eval --per_device_train_batch_size 4 \
  --max_steps 4 --logging_steps 1 --report_to none --disable_tqdm --run_name clm-run \
  --include_num_input_tokens_seen true --gradient_checkpointing --gradient_checkpointing_kwargs '{"use_reentrant": false}' \
  --dataloader_num_workers 1 --dataloader_prefetch_factor 4 --max_eval_samples 3 --overwrite_cache \
  --preprocessing_num_workers 4 --save_safetensors --low_cpu_mem_usage --skip_memory_metrics true \
  --full_determinism --log_level info --remove_unused_columns --group_by_length --label_smoothing_factor 0.1 \
  --neftune_noise_alpha 5 >"$work/clm.txt" 2>&1 ||
  { tail -c 2000 "$work/clm.txt"; fail "the run_clm-style command line"; }
grep -q "train: clm-run: gpt2" "$work/clm.txt" || fail "run_name not in the banner: $(head -c 600 "$work/clm.txt")"
[[ $(grep -c "^step [1-4]/4  loss" "$work/clm.txt") == 4 ]] || fail "disable_tqdm: expected 4 log lines: $(cat "$work/clm.txt")"
! grep -q $'\r\\[' "$work/clm.txt" || fail "disable_tqdm still drew the progress bar"
python3 - "$work/clm" <<'PY' || fail "the run's files"
import json, sys
out = sys.argv[1]
ev = json.load(open(out + "/eval_results.json"))
assert ev["eval_samples"] == 3, ev
logs = [json.loads(l) for l in open(out + "/metrics.jsonl")]
seen = [e["num_input_tokens_seen"] for e in logs if "loss" in e]
assert seen == [256, 512, 768, 1024], seen
args = json.load(open(out + "/training_args.json"))
assert args["run_name"] == "clm-run" and args["gradient_checkpointing_kwargs"] == {"use_reentrant": False}, args
assert args["label_smoothing_factor"] == 0.1 and args["neftune_noise_alpha"] == 5, args
PY
echo "run_clm's flags: trained, 4 log lines, eval_samples 3, num_input_tokens_seen 256..1024"

# run_clm's from-scratch path: --model_type with --config_overrides; the saved config.json is the edited one.
"$trainer" train --model_type gpt2 --config_overrides "n_embd=32,n_layer=2,n_head=2,n_positions=64" \
  --tokenizer_name "$tok" --train_file "$work/corpus.txt" --block_size 64 --use_cpu --output_dir "$work/scratch" \
  --max_steps 2 >"$work/scratch.txt" 2>&1 || { tail -c 2000 "$work/scratch.txt"; fail "--model_type gpt2"; }
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); assert (c['n_embd'], c['n_layer'], c['resid_pdrop']) == (32, 2, 0.1), c" \
  "$work/scratch/config.json" || fail "the saved config is not GPT2Config() with the overrides"
echo "--model_type gpt2 --config_overrides: trained, config.json edited"

# HF's dump of every TrainingArguments field (and run_clm's), at HF's defaults, then our flags.
"$trainer" train "$here/data/hf_training_args_5_2.json" "${common[@]}" --output_dir "$work/dump" --max_steps 2 \
  --optim adamw_torch >"$work/dump.txt" 2>&1 || { tail -c 2000 "$work/dump.txt"; fail "HF's full arguments dump"; }
echo "HF's TrainingArguments dump: trained"

# --deepspeed with HF's ZeRO-2 example config (every value "auto"): DeepSpeed's WarmupDecayLR (the first two
# steps at warmup_min_lr, then DeepSpeed's log warmup and linear decay) and its fp16 loss scaler (2^16,
# hysteresis 2) in the checkpoint; an arguments file's dict form trains the same.
cat >"$work/ds_zero2.json" <<'JSON'
{"fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16, "hysteresis": 2,
          "min_loss_scale": 1},
 "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
 "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_min_lr": "auto",
               "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}, "overlap_comm": true,
                       "reduce_bucket_size": "auto", "contiguous_gradients": true},
 "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
 "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false}
JSON
ds=("${common[@]}" --per_device_train_batch_size 2 --max_steps 6 --logging_steps 1 --learning_rate 1e-3
  --warmup_steps 3 --save_steps 3 --fp16 --disable_tqdm)
"$trainer" train "${ds[@]}" --output_dir "$work/ds" --deepspeed "$work/ds_zero2.json" >"$work/ds.txt" 2>&1 ||
  { tail -c 2000 "$work/ds.txt"; fail "--deepspeed with HF's ZeRO-2 example"; }
python3 - "$work/ds" "$work/ds_zero2.json" >"$work/ds_args.json" <<'PY' || fail "--deepspeed: the run's rates or scaler"
import json, math, sys
out = sys.argv[1]
lrs = [json.loads(l)["learning_rate"] for l in open(out + "/metrics.jsonl") if '"loss"' in l]
# WarmupDecayLR(total 6, warmup 3, min 0, max 1e-3), stepped after each applied step from iteration -1: step k
# runs at iteration k - 2 and logs, as HF under DeepSpeed, iteration k - 1's rate (the engine has stepped it).
want = [1e-3 * (math.log(i + 1) / math.log(3) if i < 3 else (6 - i) / 3) for i in range(6)]
assert len(lrs) == 6 and all(abs(a - b) < 1e-15 for a, b in zip(lrs, want)), (lrs, want)
sc = json.load(open(out + "/checkpoint-3/scaler.json"))
assert sc["delayed_shift"] == 2 and sc["scale_window"] == 1000 and sc["cur_iter"] == 3, sc
args = json.load(open(out + "/training_args.json"))
assert args["fsdp"] == "shard_grad_op offload" and args["deepspeed"].endswith("ds_zero2.json"), args
args["deepspeed"] = json.load(open(sys.argv[2]))  # HF's dict form, in an arguments file
for k in ("output_dir", "logging_dir"):
    del args[k]
print(json.dumps(args))
PY
"$trainer" train "$work/ds_args.json" --output_dir "$work/ds_dict" >"$work/ds_dict.txt" 2>&1 ||
  { tail -c 2000 "$work/ds_dict.txt"; fail "--deepspeed as an arguments file's dict"; }
cmp <(grep -o '"loss": [^,]*' "$work/ds/metrics.jsonl") <(grep -o '"loss": [^,]*' "$work/ds_dict/metrics.jsonl") ||
  fail "the dict form trained other numbers"
# DeepSpeed's optimizer gets every parameter in one group (HF hands it model.parameters()): biases and norm
# weights decay too, so with weight decay the second step differs from --optim adamw_torch's (HF's groups).
echo '{"optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}, "gradient_clipping": "auto"}' \
  >"$work/ds_opt.json"
wd=("${common[@]}" --per_device_train_batch_size 2 --max_steps 2 --logging_steps 1 --learning_rate 1e-2
  --weight_decay 0.5 --disable_tqdm)
"$trainer" train "${wd[@]}" --output_dir "$work/wd_hf" >"$work/wd_hf.txt" 2>&1 || fail "weight decay, HF's groups"
"$trainer" train "${wd[@]}" --output_dir "$work/wd_ds" --deepspeed "$work/ds_opt.json" >"$work/wd_ds.txt" 2>&1 ||
  fail "weight decay, DeepSpeed's optimizer"
python3 - "$work/wd_hf" "$work/wd_ds" <<'PY' || fail "DeepSpeed's optimizer decays like HF's groups"
import json, sys
hf, ds = ([json.loads(l)["loss"] for l in open(d + "/metrics.jsonl") if '"loss"' in l] for d in sys.argv[1:])
assert hf[0] == ds[0] and hf[1] != ds[1], (hf, ds)
PY
# DeepSpeed's ZeRO optimizers update the fp16 scale before unscaling: the clean step that doubles it
# (loss_scale_window 3: the third) applies half its gradient - with SGD the fourth loss moves - and ZeRO-3
# reports that step's norm halved too. (HF's optimizer, --optim sgd, under the config's scaler.)
for w in 3 1000; do
  for st in 2 3; do
    echo "{\"fp16\": {\"enabled\": \"auto\", \"loss_scale_window\": $w}, \"zero_optimization\": {\"stage\": $st}}" \
      >"$work/ds_w${w}_s$st.json"
    "$trainer" train "${common[@]}" --per_device_train_batch_size 2 --max_steps 4 --logging_steps 1 --fp16 \
      --optim sgd --learning_rate 0.5 --disable_tqdm --output_dir "$work/grow_w${w}_s$st" \
      --deepspeed "$work/ds_w${w}_s$st.json" >"$work/grow_w${w}_s$st.txt" 2>&1 || fail "fp16 window $w stage $st"
  done
done
python3 - "$work" <<'PY' || fail "DeepSpeed's growth step"
import json, sys
def log(name):
    return [json.loads(l) for l in open(f"{sys.argv[1]}/{name}/metrics.jsonl") if '"loss"' in l]
grow, steady, grow3 = log("grow_w3_s2"), log("grow_w1000_s2"), log("grow_w3_s3")
assert [e["loss_scale"] for e in grow] == [65536, 65536, 131072, 131072], grow  # after each step
assert [e["loss"] for e in grow[:3]] == [e["loss"] for e in steady[:3]], (grow, steady)
assert grow[3]["loss"] != steady[3]["loss"], (grow, steady)
assert [e["loss"] for e in grow3] == [e["loss"] for e in grow], (grow3, grow)
norms, norms3 = [e["grad_norm"] for e in grow], [e["grad_norm"] for e in grow3]
assert norms3[:2] == norms[:2] and norms3[2] == norms[2] / 2 and norms3[3] == norms[3], (norms3, norms)
PY
# `trainer estimate` reads the config's stage and offload as the run does.
est=("$trainer" estimate "${common[@]}" --per_device_train_batch_size 2 --world_size 2)
cmp <("${est[@]}" --deepspeed "$work/ds_zero2.json" 2>&1) <("${est[@]}" --fsdp "shard_grad_op offload" 2>&1) ||
  fail "trainer estimate --deepspeed differs from --fsdp \"shard_grad_op offload\""
echo "--deepspeed: HF's ZeRO-2 example trained with WarmupDecayLR's rates and DeepSpeed's fp16 scaler"

# What we do not have: the reason, before any work.
refused() { # expected message, flags...
  local want=$1
  shift
  "$trainer" train "${common[@]}" --output_dir "$work/refused" "$@" >"$work/refused.txt" 2>&1 && fail "accepted: $*"
  grep -qF -- "$want" "$work/refused.txt" || fail "for $*: expected '$want', got: $(tail -c 300 "$work/refused.txt")"
  [[ ! -e $work/refused ]] || fail "a refused run made its output_dir"
}
refused "--push_to_hub: HF's argument is not supported here: the Hugging Face Hub needs the network" --push_to_hub
refused "--deepspeed $work/missing.json: cannot open" --deepspeed "$work/missing.json"
echo '{"optimizer": {"type": "AdamW", "params": {"lr": 3e-5}}}' >"$work/ds_lr.json"
refused "- ds optimizer.params.lr=3e-05 vs hf learning_rate=5e-05" --deepspeed "$work/ds_lr.json"
refused "--dataset_name: HF's argument is not supported here: datasets from the Hub" --dataset_name wikitext
refused "--config_overrides can't be used in combination with --config_name" --config_overrides n_layer=1
refused "--save_safetensors false: weights are saved as safetensors only" --save_safetensors false
refused "--label_smoothing_factor 1.5: expected 0 to 1 (0: no smoothing)" --label_smoothing_factor 1.5
refused "--dataloader_prefetch_factor can only be set when data is loaded in a different process" --dataloader_prefetch_factor 2
echo '{"push_to_hub": true}' >"$work/hub.json"
refused "'push_to_hub': true is not supported here" "$work/hub.json"
echo "hf_args_runs: OK"
