# The HF Trainer peer of the GPU training benchmark (scripts/device_check.sh): GPT-2 124M (or the model of a
# config.json, e.g. bench/configs' Llama shapes) from scratch in bf16 with fused AdamW (or --optim) and sdpa
# attention on random token blocks, through transformers.Trainer, eager or with torch_compile; prints one JSON
# line with tokens/s (steps after the warm-up), MFU and peak memory.
import argparse, json, time

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                          TrainingArguments)

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--block", type=int, default=1024)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--compile", action="store_true")
p.add_argument("--out", default="/tmp/hf_peer")
p.add_argument("--peak_tflops", type=float, default=989.0)  # H100/H200 SXM dense bf16
p.add_argument("--config", help="a config.json (random init) instead of GPT-2 124M")
p.add_argument("--optim", default="adamw_torch_fused")
p.add_argument("--gradient_checkpointing", action="store_true")
p.add_argument("--name", default="", help="appended to the peer's name in the JSON line")
a = p.parse_args()


class Blocks(torch.utils.data.Dataset):
    def __init__(self, n, block, vocab):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, block), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Timer(TrainerCallback):
    def __init__(self):
        self.t = []

    def on_step_end(self, args, state, control, **kw):
        torch.cuda.synchronize()
        self.t.append(time.perf_counter())


if a.config:
    cfg = AutoConfig.from_pretrained(a.config)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", torch_dtype=torch.float32)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    L, d = cfg.num_hidden_layers, cfg.num_attention_heads * head_dim
else:
    cfg = GPT2Config(n_positions=a.block, attn_implementation="sdpa")
    model = GPT2LMHeadModel(cfg)
    L, d = cfg.n_layer, cfg.n_embd
n_params = sum(t.numel() for t in model.parameters())
args = TrainingArguments(output_dir=a.out, per_device_train_batch_size=a.batch, max_steps=a.steps, bf16=True,
                         optim=a.optim, learning_rate=6e-4, logging_steps=10, save_strategy="no",
                         gradient_checkpointing=a.gradient_checkpointing, report_to=[], torch_compile=a.compile,
                         dataloader_num_workers=2, disable_tqdm=True)
timer = Timer()
torch.cuda.reset_peak_memory_stats()
Trainer(model=model, args=args, train_dataset=Blocks(a.batch * a.steps, a.block, cfg.vocab_size),
        callbacks=[timer]).train()
span = timer.t[-1] - timer.t[a.warmup - 1]
tps = a.batch * a.block * (a.steps - a.warmup) / span
T = a.block
flops_per_token = 6 * n_params + 12 * L * d * T  # weights (fwd + bwd) + attention scores and values
print(json.dumps({"peer": "hf_trainer" + ("_compile" if a.compile else "_eager") + a.name, "batch": a.batch,
                  "tokens_per_second": tps, "mfu": tps * flops_per_token / (a.peak_tflops * 1e12),
                  "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30, "params": n_params}))
