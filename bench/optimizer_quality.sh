#!/usr/bin/env bash
# Where the optimizers end, not how fast they step: the guide table's model (GPT-2 n_embd 256, 4 layers, no
# dropout, block 128, batch 8) trained for STEPS steps with each optimizer setting below, warm-up 30, weight
# decay 0.1 (GaLore: galore_torch ignores HF's), evaluated every STEPS/3 steps; prints eval_loss, train_loss and
# tokens/s per row.
# Usage: bench/optimizer_quality.sh TRAINER GPT2_TOKENIZER CORPUS [STEPS=300] [WORKDIR=/tmp/trainer-optim-quality]
# ONLY=REGEX runs the rows whose names match it.
set -euo pipefail
trainer=$1 tok=$2 corpus=$3 steps=${4:-300} work=${5:-/tmp/trainer-optim-quality}
rm -rf "$work" && mkdir -p "$work"
echo '{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 256, "n_layer": 4, "n_head": 4, "n_positions": 256, "embd_pdrop": 0, "resid_pdrop": 0, "attn_pdrop": 0}' \
  >"$work/config.json"
run() {
  local name=$1
  shift
  [[ -z ${ONLY:-} || $name =~ $ONLY ]] || return 0
  "$trainer" train --use_cpu --overwrite_output_dir --config_name "$work/config.json" --tokenizer_name "$tok" \
    --train_file "$corpus" --block_size 128 --per_device_train_batch_size 8 --max_steps "$steps" \
    --warmup_steps 30 --weight_decay 0.1 --do_eval --eval_strategy steps --eval_steps $((steps / 3)) \
    --save_strategy no --seed 42 --report_to none --disable_tqdm true --output_dir "$work/$name" "$@" \
    >"$work/$name.log" 2>&1
  python3 - "$work/$name/all_results.json" "$name" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | {d['eval_loss']:.4f} | {d['train_loss']:.4f} | {d['train_tokens_per_second']:.0f} |")
PY
}
echo "| row | eval_loss | train_loss | tokens/s |"
echo "|---|---|---|---|"
run adamw_cosine_1e-3 --optim adamw_torch --learning_rate 1e-3 --lr_scheduler_type cosine
# Precision of the weights themselves: fp32 masters under bf16 compute, and bf16 weights with bf16 moments
# (--torch_dtype bfloat16: small updates round away).
run adamw_bf16_cosine_1e-3 --optim adamw_torch --learning_rate 1e-3 --lr_scheduler_type cosine --bf16
run adamw_bf16_weights_cosine_1e-3 --optim adamw_torch --learning_rate 1e-3 --lr_scheduler_type cosine --torch_dtype bfloat16
run adafactor_bf16_weights_cosine_1e-3 --optim adafactor --learning_rate 1e-3 --lr_scheduler_type cosine --torch_dtype bfloat16
# torchdistx's AnyPrecisionAdamW over bf16 weights: bf16 moments and a bf16 Kahan buffer (its pure-bf16 recipe)
run anyprecision_kahan_bf16_weights_cosine_1e-3 --optim adamw_anyprecision --learning_rate 1e-3 --lr_scheduler_type cosine \
  --torch_dtype bfloat16 --optim_args use_kahan_summation=true,momentum_dtype=bfloat16,variance_dtype=bfloat16
run stable_adamw_cosine_1e-3 --optim stable_adamw --learning_rate 1e-3 --lr_scheduler_type cosine
run schedule_free_adamw_1e-3 --optim schedule_free_adamw --learning_rate 1e-3 --lr_scheduler_type constant
run schedule_free_adamw_3e-3 --optim schedule_free_adamw --learning_rate 3e-3 --lr_scheduler_type constant
run schedule_free_sgd_1 --optim schedule_free_sgd --learning_rate 1.0 --lr_scheduler_type constant
run grokadamw_cosine_1e-3 --optim grokadamw --learning_rate 1e-3 --lr_scheduler_type cosine
# GaLore (rank 64 of n_embd 256, a basis refresh every 100 steps, galore_torch's scale 0.25): the linear
# layers' state at a quarter of their size; the embeddings take the inner optimizer at full rank.
galore=(--optim_target_modules all-linear --optim_args rank=64,update_proj_gap=100 --lr_scheduler_type cosine)
run galore_adamw_cosine_1e-3 --optim galore_adamw --learning_rate 1e-3 "${galore[@]}"
run galore_adamw_cosine_4e-3 --optim galore_adamw --learning_rate 4e-3 "${galore[@]}"
run galore_adafactor_cosine_4e-3 --optim galore_adafactor --learning_rate 4e-3 "${galore[@]}"
run galore_adamw_layerwise_cosine_4e-3 --optim galore_adamw_layerwise --learning_rate 4e-3 "${galore[@]}"
# APOLLO (rank 64, random bases, channel scaling): the update is the full gradient scaled, AdamW-like rates
run apollo_adamw_cosine_1e-3 --optim apollo_adamw --learning_rate 1e-3 "${galore[@]}"
run apollo_adamw_cosine_4e-3 --optim apollo_adamw --learning_rate 4e-3 "${galore[@]}"
# lomo_optim's: updated during backward, no clipping (HF's); LOMO is plain SGD, AdaLomo scales its step by
# each weight's RMS (so its rate is relative).
run lomo_cosine_1e-1 --optim lomo --learning_rate 1e-1 --lr_scheduler_type cosine
run adalomo_cosine_1e-2 --optim adalomo --learning_rate 1e-2 --lr_scheduler_type cosine
run adalomo_cosine_3e-2 --optim adalomo --learning_rate 3e-2 --lr_scheduler_type cosine
