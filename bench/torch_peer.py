# PyTorch peer (CPU, or the GPU for block and kernels) for the benchmarks: times the same work as bench/*.cpp and prints one JSON line.
# Run by the C++ benchmarks with Debian's python3-torch (scripts/setup.sh --bench).
import json, math, sys, time

import torch


def timeit(fn, iters, warmup=2, sync=lambda: None):
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def block(B, T, d, H, iters, device):
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on both sides
    g = torch.Generator().manual_seed(0)
    p = {
        "ln1_w": torch.ones(d), "ln1_b": torch.zeros(d),
        "w_qkv": torch.randn(3 * d, d, generator=g) * 0.02, "b_qkv": torch.zeros(3 * d),
        "w_proj": torch.randn(d, d, generator=g) * 0.02, "b_proj": torch.zeros(d),
        "ln2_w": torch.ones(d), "ln2_b": torch.zeros(d),
        "w_fc": torch.randn(4 * d, d, generator=g) * 0.02, "b_fc": torch.zeros(4 * d),
        "w_fc2": torch.randn(d, 4 * d, generator=g) * 0.02, "b_fc2": torch.zeros(d),
    }
    p = {k: t.to(device).requires_grad_(True) for k, t in p.items()}
    x = torch.randn(B, T, d, generator=g).to(device).requires_grad_(True)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), 1)
    F = torch.nn.functional
    hd = d // H

    def fwd_bwd():
        h = F.layer_norm(x, (d,), p["ln1_w"], p["ln1_b"], 1e-5)
        q, k, v = F.linear(h, p["w_qkv"], p["b_qkv"]).split(d, dim=-1)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, d)
        x1 = x + F.linear(y, p["w_proj"], p["b_proj"])
        m = F.linear(F.gelu(F.linear(F.layer_norm(x1, (d,), p["ln2_w"], p["ln2_b"], 1e-5), p["w_fc"], p["b_fc"]),
                            approximate="tanh"), p["w_fc2"], p["b_fc2"])
        (x1 + m).mean().backward()
        for t in list(p.values()) + [x]:
            t.grad = None

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    return {"seconds": timeit(fwd_bwd, iters, sync=sync), "torch": torch.__version__}


def ops(iters):
    out = {}
    for n in (512, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        out[f"matmul_{n}"] = timeit(lambda: a @ b, iters)
    x = torch.randn(8192, 1024)
    w, bb = torch.ones(1024), torch.zeros(1024)
    out["layer_norm"] = timeit(lambda: torch.nn.functional.layer_norm(x, (1024,), w, bb), iters)
    out["softmax"] = timeit(lambda: torch.softmax(x, -1), iters)
    logits = torch.randn(512, 50257)
    labels = torch.randint(0, 50257, (512,))
    out["cross_entropy"] = timeit(lambda: torch.nn.functional.cross_entropy(logits, labels), iters)
    for m, n in ((1024, 1024), (768, 3072)):  # GaLore's basis refresh: torch.linalg.svd(full_matrices=False)
        g = torch.randn(m, n)
        out[f"svd_{m}x{n}"] = timeit(lambda: torch.linalg.svd(g, full_matrices=False), max(1, iters // 5))
    return out


def kernels(iters, device, N):
    """bench_kernels.cpp's ops, bf16, at the same shapes: torch's eager kernels on the same device."""
    F = torch.nn.functional
    dev = torch.device(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    bf = torch.bfloat16
    d, V, ldv = 768, 50257, 50304  # ldv: the head GEMM's padded vocabulary

    def t(fn, reps=5):
        def many():
            for _ in range(reps):
                fn()
        return timeit(many, iters, sync=sync) / reps

    def rnd(*shape, dtype=bf):
        return torch.randn(*shape, device=dev).to(dtype)

    out = {"torch": torch.__version__}
    src, dst = rnd(N, 4 * d), torch.empty(N, 4 * d, device=dev, dtype=bf)
    out["copy"] = t(lambda: dst.copy_(src))
    x, r, w, b = rnd(N, d), rnd(N, d), rnd(d), rnd(d)
    out["add_layer_norm"] = t(lambda: F.layer_norm(x + r, (d,), w, b, 1e-5))
    s = x + r
    _, mean, rstd = torch.ops.aten.native_layer_norm(s, (d,), w, b, 1e-5)
    gy, ga = rnd(N, d), rnd(N, d)
    out["layer_norm_backward_gx"] = t(
        lambda: torch.ops.aten.native_layer_norm_backward(gy, s, (d,), mean, rstd, w, b, [True, False, False])[0] + ga)
    out["layer_norm_backward"] = t(
        lambda: torch.ops.aten.native_layer_norm_backward(gy, s, (d,), mean, rstd, w, b, [True, True, True])[0] + ga)
    gb = rnd(N, 4 * d)
    out["bias_grad"] = t(lambda: gb.sum(0))
    # (on a GPU torch's native_dropout also writes a 1-byte mask: 5 bytes an element against our 4)
    out["dropout"] = t(lambda: F.dropout(x, 0.1, training=True))
    if hasattr(F, "rms_norm"):
        lx, lw = rnd(N // 2, 4096), rnd(4096)
        out["rms_norm"] = t(lambda: F.rms_norm(lx, (4096,), lw, 1e-5))
    labels = (torch.arange(N, device=dev) * 97) % V
    logits = rnd(N, V)  # torch's own layout: dense rows (a padded view would cost its softmax a copy)
    out["cross_entropy"] = t(lambda: F.cross_entropy(logits, labels, reduction="none"))
    lg = logits.detach().clone().requires_grad_(True)

    def fwd_bwd():
        F.cross_entropy(lg, labels, reduction="mean").backward()
        lg.grad = None
    out["cross_entropy_fwd_bwd"] = t(fwd_bwd)
    hx, hw = rnd(N, d), rnd(ldv, d)
    out["head_matmul"] = t(lambda: hx @ hw.t(), reps=2)
    a, w1 = rnd(N, d), rnd(4 * d, d)
    out["mlp_matmul"] = t(lambda: a @ w1.t())
    sm = rnd(N, 1024)
    out["softmax"] = t(lambda: torch.softmax(sm, -1))
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0: its flash kernels on a GPU
        T = min(N, 1024)
        B, H, D = max(1, N // T), 12, 64
        qkv = rnd(B, T, 3 * H * D).requires_grad_(True)
        dout = rnd(B, T, H, D).transpose(1, 2)
        for key, pd in (("attention", 0.0), ("attention_dropout", 0.1)):
            def attention_fwd_bwd(pd=pd):
                q, k, v = (u.view(B, T, H, D).transpose(1, 2) for u in qkv.split(H * D, dim=-1))
                F.scaled_dot_product_attention(q, k, v, dropout_p=pd, is_causal=True).backward(dout)
                qkv.grad = None
            out[key] = t(attention_fwd_bwd, reps=1)
    n = 124_000_000 * N // 16384
    p = torch.nn.Parameter(torch.randn(n, device=dev))
    p.grad = torch.randn(n, device=dev)
    fused = {"fused": True} if device == "cuda" else {}  # (torch 1.13's AdamW has no fused flag)
    opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, **fused)
    out["adamw"] = t(opt.step, reps=2)
    return out


if __name__ == "__main__":
    torch.set_num_threads(int(sys.argv[2]))
    if sys.argv[1] == "block":
        B, T, d, H, iters = map(int, sys.argv[3:8])
        device = sys.argv[8] if len(sys.argv) > 8 else "cpu"
        print(json.dumps(block(B, T, d, H, iters, device)))
    elif sys.argv[1] == "kernels":
        print(json.dumps(kernels(int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))))
    else:
        print(json.dumps(ops(int(sys.argv[3]))))
