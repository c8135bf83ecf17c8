#!/usr/bin/python3
# PyTorch CPU side of bench/train_side_by_side.py: makes the shared initial GPT-2 (HF's init, HF folder) and
# trains it on the batches `trainer train` draws (written by bench_train_batches) the way HF's Trainer would.
# Run with Debian's python3-torch (/usr/bin/python3). The forward is tools/make_golden.py's gpt2_forward
# (HF's GPT-2 modeling code, eager attention, Conv1D weights [in, out]).
#
#   train_peer.py init  --out DIR --n_layer 4 --n_embd 256 --n_head 4 --n_positions 256 --seed 0
#   train_peer.py train --model DIR --batches batches.bin --max_steps 50 --learning_rate 1e-3 ... --out r.json
import argparse, json, math, os, resource, struct, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from make_golden import decays, gpt2_forward, load_folder, st_save  # noqa: E402


def init(a):
    # HF GPT2PreTrainedModel._init_weights: Conv1D / Embedding weights ~ N(0, initializer_range), biases 0,
    # LayerNorm 1 / 0, then every c_proj.weight ~ N(0, initializer_range / sqrt(2 n_layer)). Tied LM head.
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": a.vocab_size,
           "n_positions": a.n_positions, "n_embd": a.n_embd, "n_layer": a.n_layer, "n_head": a.n_head,
           "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
           # no dropout: both sides must compute the same function
           "embd_pdrop": 0.0, "resid_pdrop": 0.0, "attn_pdrop": 0.0,
           "tie_word_embeddings": True, "bos_token_id": 50256, "eos_token_id": 50256,
           "torch_dtype": "float32"}
    g = torch.Generator().manual_seed(a.seed)
    std, D, L = cfg["initializer_range"], a.n_embd, a.n_layer
    p = {"transformer.wte.weight": torch.randn(a.vocab_size, D, generator=g) * std,
         "transformer.wpe.weight": torch.randn(a.n_positions, D, generator=g) * std}
    for i in range(L):
        pre = f"transformer.h.{i}."
        for n in ("ln_1", "ln_2"):
            p[pre + n + ".weight"], p[pre + n + ".bias"] = torch.ones(D), torch.zeros(D)
        for n, (i_, o_) in {"attn.c_attn": (D, 3 * D), "attn.c_proj": (D, D), "mlp.c_fc": (D, 4 * D),
                            "mlp.c_proj": (4 * D, D)}.items():
            s = std / math.sqrt(2 * L) if n.endswith("c_proj") else std
            p[pre + n + ".weight"] = torch.randn(i_, o_, generator=g) * s  # Conv1D layout [in, out]
            p[pre + n + ".bias"] = torch.zeros(o_)
    p["transformer.ln_f.weight"], p["transformer.ln_f.bias"] = torch.ones(D), torch.zeros(D)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    st_save(os.path.join(a.out, "model.safetensors"), p)
    print(f"init: {sum(t.numel() for t in p.values()) / 1e6:.2f}M parameters in {a.out}")


def read_batches(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"trbatch1", f"{path}: not a bench_train_batches file"
    n, B, T, stream_tokens, samples = struct.unpack("<5q", data[8:48])
    ids = torch.frombuffer(bytearray(data[48:]), dtype=torch.int32)
    assert ids.numel() == n * B * T, f"{path}: {ids.numel()} ids, header says {n} x {B} x {T}"
    return ids.view(n, B, T).long(), {"stream_tokens": stream_tokens, "num_samples": samples}


def lr_at(kind, base, step, warmup, total):
    # HF's get_{linear,cosine,constant...}_schedule_with_warmup lambdas, times the base rate
    if kind == "constant":
        return base
    if step < warmup:
        return base * step / max(1, warmup)
    if kind == "constant_with_warmup":
        return base
    progress = (step - warmup) / max(1, total - warmup)
    if kind == "cosine":
        return base * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return base * max(0.0, (total - step) / max(1, total - warmup))


def train(a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    batches, meta = read_batches(a.batches)
    need = a.max_steps * a.gradient_accumulation_steps
    assert batches.size(0) >= need, f"{a.batches}: {batches.size(0)} batches, {need} needed"
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    assert cfg["model_type"] == "gpt2" and cfg.get("tie_word_embeddings", True)
    params = {k: v.float().requires_grad_(True) for k, v in load_folder(a.model).items()}
    # HF Trainer.create_optimizer: two groups, no decay for biases and LayerNorm weights
    groups = [{"params": [v for k, v in params.items() if decays(k)], "weight_decay": a.weight_decay},
              {"params": [v for k, v in params.items() if not decays(k)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.learning_rate, betas=(0.9, 0.999), eps=1e-8)
    V = cfg["vocab_size"]
    losses, norms, lrs, seconds = [], [], [], []
    tokens_per_step = a.gradient_accumulation_steps * batches.size(1) * batches.size(2)
    for step in range(a.max_steps):
        t0 = time.perf_counter()
        ga = a.gradient_accumulation_steps
        micro = [batches[step * ga + m] for m in range(ga)]
        # num_items_in_batch: every predicted token of the step, so accumulation does not change the loss
        items = sum(b.size(0) * (b.size(1) - 1) for b in micro)
        step_loss = 0.0
        for ids in micro:
            # --bf16: HF Trainer's CPU mixed precision, torch.autocast(bfloat16) around forward and loss
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                logits = gpt2_forward(params, cfg, ids)
                # HF ForCausalLMLoss: upcast, labels shifted left with -100 padding, sum / num_items_in_batch
                labels = F.pad(ids, (0, 1), value=-100)[..., 1:]
                loss = F.cross_entropy(logits.float().view(-1, V), labels.reshape(-1), ignore_index=-100,
                                       reduction="sum") / items
            loss.backward()
            step_loss += loss.item()
            del logits, loss
        norm = torch.nn.utils.clip_grad_norm_(params.values(), a.max_grad_norm)
        lr = lr_at(a.lr_scheduler_type, a.learning_rate, step, a.warmup_steps, a.max_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - t0)
        losses.append(step_loss)
        norms.append(float(norm))
        lrs.append(lr)
        print(f"step {step + 1:3d}  loss {step_loss:.6f}  lr {lr:.3g}  grad_norm {float(norm):.4f}  "
              f"{tokens_per_step / seconds[-1]:.0f} tok/s", flush=True)
    timed = seconds[a.timing_warmup:]
    result = {"losses": losses, "grad_norms": norms, "learning_rates": lrs, "step_seconds": seconds,
              "tokens_per_step": tokens_per_step, "timing_warmup": a.timing_warmup,
              "tokens_per_second": tokens_per_step * len(timed) / sum(timed) if timed else None,
              "threads": torch.get_num_threads(), "torch": torch.__version__,
              "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, **meta}
    with open(a.out, "w") as f:
        json.dump(result, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init")
    i.add_argument("--out", required=True)
    i.add_argument("--n_layer", type=int, default=4)
    i.add_argument("--n_embd", type=int, default=256)
    i.add_argument("--n_head", type=int, default=4)
    i.add_argument("--n_positions", type=int, default=256)
    i.add_argument("--vocab_size", type=int, default=50257)
    i.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train")
    t.add_argument("--model", required=True)
    t.add_argument("--batches", required=True)
    t.add_argument("--out", required=True, help="JSON results")
    t.add_argument("--max_steps", type=int, default=50)
    t.add_argument("--gradient_accumulation_steps", type=int, default=1)
    t.add_argument("--learning_rate", type=float, default=1e-3)
    t.add_argument("--weight_decay", type=float, default=0.0)
    t.add_argument("--max_grad_norm", type=float, default=1.0)
    t.add_argument("--lr_scheduler_type", default="linear")
    t.add_argument("--warmup_steps", type=int, default=0)
    t.add_argument("--threads", type=int, default=os.cpu_count())
    t.add_argument("--timing_warmup", type=int, default=2, help="first steps left out of tokens/s")
    t.add_argument("--bf16", action="store_true", help="torch.autocast(bfloat16), as HF Trainer's --bf16")
    a = ap.parse_args()
    init(a) if a.cmd == "init" else train(a)


if __name__ == "__main__":
    main()
