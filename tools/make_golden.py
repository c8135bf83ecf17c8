#!/usr/bin/env python3
# Golden-value generator for the model parity tests. Builds tiny GPT-2 and Llama-family models in plain
# PyTorch following Hugging Face's modeling code (eager attention), writes each as config.json +
# model.safetensors (HF layout) and golden.safetensors (inputs, logits, loss, every parameter's gradient, and
# the losses of 10 AdamW steps). Needs only python3 + Debian's python3-torch (no transformers, no
# safetensors package: the safetensors reader/writer below is our own).
#
#   python3 tools/make_golden.py tests/golden [NAME...]   # regenerate the committed goldens (or those NAMEs)
#   python3 tools/make_golden.py --verify SAVED REF      # check SAVED/model*.safetensors == REF's tensors
import json, math, os, struct, sys

import torch
import torch.nn.functional as F

DT = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
      torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}
TD = {v: k for k, v in DT.items()}


def st_save(path, tensors):
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        b = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": DT[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def st_load(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        b, e = v["data_offsets"]
        raw = bytearray(data[8 + n + b:8 + n + e])
        dt = TD[v["dtype"]]
        if dt == torch.bfloat16:
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16) if raw else torch.empty(0, dtype=dt)
        else:
            t = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
        out[name] = t.reshape(v["shape"]).clone()
    return out


def load_folder(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        out = {}
        for f in sorted(set(json.load(open(idx))["weight_map"].values())):
            out.update(st_load(os.path.join(d, f)))
        return out
    return st_load(os.path.join(d, "model.safetensors"))


# ---------------------------------------------------------------- models (HF modeling code, eager attention)
def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def causal_additive(T, dtype):
    m = torch.full((T, T), torch.finfo(dtype).min, dtype=dtype)
    return torch.triu(m, 1)[None, None]


def gpt2_forward(p, cfg, ids):
    B, T = ids.shape
    D, H = cfg["n_embd"], cfg["n_head"]
    hd = D // H
    h = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][torch.arange(T)]
    mask = causal_additive(T, h.dtype)
    for i in range(cfg["n_layer"]):
        pre = f"transformer.h.{i}."
        a = F.layer_norm(h, (D,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], cfg["layer_norm_epsilon"])
        qkv = torch.addmm(p[pre + "attn.c_attn.bias"], a.view(-1, D), p[pre + "attn.c_attn.weight"]).view(B, T, 3 * D)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in qkv.split(D, dim=2))
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
        w = torch.softmax(w + mask, dim=-1)
        o = torch.matmul(w, v).transpose(1, 2).reshape(B, T, D)
        o = torch.addmm(p[pre + "attn.c_proj.bias"], o.view(-1, D), p[pre + "attn.c_proj.weight"]).view(B, T, D)
        h = h + o
        m = F.layer_norm(h, (D,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], cfg["layer_norm_epsilon"])
        m = gelu_new(torch.addmm(p[pre + "mlp.c_fc.bias"], m.view(-1, D), p[pre + "mlp.c_fc.weight"]))
        m = torch.addmm(p[pre + "mlp.c_proj.bias"], m, p[pre + "mlp.c_proj.weight"]).view(B, T, D)
        h = h + m
    h = F.layer_norm(h, (D,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], cfg["layer_norm_epsilon"])
    head = p["transformer.wte.weight"] if cfg.get("tie_word_embeddings", True) else p["lm_head.weight"]
    return F.linear(h, head)


def llama_inv_freq(cfg):
    hd = cfg.get("head_dim", 128 if cfg["model_type"] == "qwen3" else cfg["hidden_size"] // cfg["num_attention_heads"])
    base = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        inv = inv / rs["factor"]
    elif kind == "llama3":
        factor, lo, hi, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv = torch.where(medium, smoothed, inv_l)
    return inv, hd


def rms(x, w, eps):
    dt = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dt)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def llama_forward(p, cfg, ids):
    B, T = ids.shape
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    inv, hd = llama_inv_freq(cfg)
    pos = torch.arange(T)[None].expand(B, T)
    freqs = (inv[None, :, None].float().expand(B, -1, 1) @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    eps = cfg.get("rms_norm_eps", 1e-6)
    h = p["model.embed_tokens.weight"][ids]
    mask = causal_additive(T, h.dtype)

    def lin(x, name):
        return F.linear(x, p[name + ".weight"], p.get(name + ".bias"))

    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        x = rms(h, p[pre + "input_layernorm.weight"], eps)
        q = lin(x, pre + "self_attn.q_proj").view(B, T, H, hd)
        k = lin(x, pre + "self_attn.k_proj").view(B, T, KV, hd)
        if cfg["model_type"] == "qwen3":  # Qwen3Attention: RMSNorm over head_dim on q and k, before rotary
            q, k = rms(q, p[pre + "self_attn.q_norm.weight"], eps), rms(k, p[pre + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = lin(x, pre + "self_attn.v_proj").view(B, T, KV, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k[:, :, None].expand(B, KV, H // KV, T, hd).reshape(B, H, T, hd)
        v = v[:, :, None].expand(B, KV, H // KV, T, hd).reshape(B, H, T, hd)
        w = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5 + mask
        w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(w, v).transpose(1, 2).reshape(B, T, H * hd)
        h = h + lin(o, pre + "self_attn.o_proj")
        x = rms(h, p[pre + "post_attention_layernorm.weight"], eps)
        h = h + lin(F.silu(lin(x, pre + "mlp.gate_proj")) * lin(x, pre + "mlp.up_proj"), pre + "mlp.down_proj")
    h = rms(h, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else p["lm_head.weight"]
    return F.linear(h, head)


def loss_of(logits, labels):
    # HF ForCausalLMLoss: upcast, shift labels left (pad -100), sum / number of real labels
    shift = F.pad(labels, (0, 1), value=-100)[..., 1:]
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), shift.reshape(-1), ignore_index=-100)


def init_params(cfg, g):
    std = cfg.get("initializer_range", 0.02)
    p = {}
    if cfg["model_type"] == "gpt2":
        D, V, L, I = cfg["n_embd"], cfg["vocab_size"], cfg["n_layer"], 4 * cfg["n_embd"]
        p["transformer.wte.weight"] = torch.randn(V, D, generator=g) * std
        p["transformer.wpe.weight"] = torch.randn(cfg["n_positions"], D, generator=g) * std
        for i in range(L):
            pre = f"transformer.h.{i}."
            for n in ("ln_1", "ln_2"):
                p[pre + n + ".weight"] = 1.0 + 0.1 * torch.randn(D, generator=g)
                p[pre + n + ".bias"] = 0.1 * torch.randn(D, generator=g)
            for n, (i_, o_) in {"attn.c_attn": (D, 3 * D), "attn.c_proj": (D, D), "mlp.c_fc": (D, I), "mlp.c_proj": (I, D)}.items():
                p[pre + n + ".weight"] = torch.randn(i_, o_, generator=g) * std * 5  # Conv1D layout [in, out]
                p[pre + n + ".bias"] = 0.1 * torch.randn(o_, generator=g)
        p["transformer.ln_f.weight"] = 1.0 + 0.1 * torch.randn(D, generator=g)
        p["transformer.ln_f.bias"] = 0.1 * torch.randn(D, generator=g)
        if not cfg.get("tie_word_embeddings", True):
            p["lm_head.weight"] = torch.randn(V, D, generator=g) * std
    else:
        D, V, L, I = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
        H = cfg["num_attention_heads"]
        KV = cfg.get("num_key_value_heads", H)
        hd = cfg.get("head_dim", 128 if cfg["model_type"] == "qwen3" else D // H)
        qb = cfg.get("attention_bias", False) or cfg["model_type"] == "qwen2"
        ob = cfg.get("attention_bias", False) and cfg["model_type"] != "qwen2"
        p["model.embed_tokens.weight"] = torch.randn(V, D, generator=g) * std * 10
        for i in range(L):
            pre = f"model.layers.{i}."
            p[pre + "input_layernorm.weight"] = 1.0 + 0.1 * torch.randn(D, generator=g)
            for n, (i_, o_, b) in {"self_attn.q_proj": (D, H * hd, qb), "self_attn.k_proj": (D, KV * hd, qb),
                                   "self_attn.v_proj": (D, KV * hd, qb), "self_attn.o_proj": (H * hd, D, ob),
                                   "mlp.gate_proj": (D, I, False), "mlp.up_proj": (D, I, False),
                                   "mlp.down_proj": (I, D, False)}.items():
                p[pre + n + ".weight"] = torch.randn(o_, i_, generator=g) * std * 5
                if b:
                    p[pre + n + ".bias"] = 0.1 * torch.randn(o_, generator=g)
            if cfg["model_type"] == "qwen3":
                for n in ("self_attn.q_norm", "self_attn.k_norm"):
                    p[pre + n + ".weight"] = 1.0 + 0.1 * torch.randn(hd, generator=g)
            p[pre + "post_attention_layernorm.weight"] = 1.0 + 0.1 * torch.randn(D, generator=g)
        p["model.norm.weight"] = 1.0 + 0.1 * torch.randn(D, generator=g)
        if not cfg.get("tie_word_embeddings", False):
            p["lm_head.weight"] = torch.randn(V, D, generator=g) * std * 5
    return p


def decays(name):
    # HF's weight-decay groups: no decay for biases and norm weights
    return not (name.endswith(".bias") or "norm" in name or ".ln_" in name)


CONFIGS = {
    "gpt2_tied": {"model_type": "gpt2", "vocab_size": 96, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 16,
                  "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "tie_word_embeddings": True,
                  "embd_pdrop": 0.0, "resid_pdrop": 0.0, "attn_pdrop": 0.0, "architectures": ["GPT2LMHeadModel"]},
    "llama_gqa_llama3rope": {"model_type": "llama", "vocab_size": 80, "hidden_size": 32, "intermediate_size": 48,
                             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
                             "tie_word_embeddings": False, "architectures": ["LlamaForCausalLM"]},
    "qwen2_tied_linearrope": {"model_type": "qwen2", "vocab_size": 72, "hidden_size": 24, "intermediate_size": 40,
                              "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
                              "head_dim": 8, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
                              "rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0},
                              "tie_word_embeddings": True, "architectures": ["Qwen2ForCausalLM"]},
    "qwen3_qknorm_untied": {"model_type": "qwen3", "vocab_size": 88, "hidden_size": 32, "intermediate_size": 48,
                            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                            "head_dim": 12, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
                            "rope_theta": 1000000.0, "attention_bias": False, "tie_word_embeddings": False,
                            "architectures": ["Qwen3ForCausalLM"]},
}


def make(out_dir, name, cfg, seed):
    g = torch.Generator().manual_seed(seed)
    p = init_params(cfg, g)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    st_save(os.path.join(d, "model.safetensors"), p)
    B, T = 2, 8
    V = cfg["vocab_size"]
    ids = torch.randint(0, V, (B, T), generator=g)
    labels = ids.clone()
    labels[1, :3] = -100  # ignored positions, as padding would be
    fwd = gpt2_forward if cfg["model_type"] == "gpt2" else llama_forward
    params = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    logits = fwd(params, cfg, ids)
    loss = loss_of(logits, labels)
    loss.backward()
    golden = {"input_ids": ids, "labels": labels, "logits": logits.detach(), "loss": loss.detach().reshape([])}
    for k, v in params.items():
        golden["grad." + k] = v.grad
    # 10 AdamW steps on the same batch, HF weight-decay groups
    params = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    groups = [{"params": [v for k, v in params.items() if decays(k)], "weight_decay": 0.01},
              {"params": [v for k, v in params.items() if not decays(k)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.999), eps=1e-8)
    losses = []
    for _ in range(10):
        opt.zero_grad()
        l = loss_of(fwd(params, cfg, ids), labels)
        l.backward()
        opt.step()
        losses.append(l.item())
    golden["adamw_losses"] = torch.tensor(losses, dtype=torch.float64)
    st_save(os.path.join(d, "golden.safetensors"), golden)
    print(f"{name}: loss {loss.item():.6f}, 10 AdamW steps {losses[0]:.4f} -> {losses[-1]:.4f}")


def verify(saved, ref):
    a, b = load_folder(saved), load_folder(ref)
    assert set(a) == set(b), f"tensor names differ: {sorted(set(a) ^ set(b))}"
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), f"tensor {k} differs"
    print(f"verify: {len(a)} tensors identical")


if __name__ == "__main__":
    torch.manual_seed(0)
    if sys.argv[1] == "--verify":
        verify(sys.argv[2], sys.argv[3])
    else:
        for i, (n, c) in enumerate(CONFIGS.items()):
            if len(sys.argv) <= 2 or n in sys.argv[2:]:
                make(sys.argv[1], n, c, 1000 + i)
