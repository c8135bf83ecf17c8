#!/usr/bin/env python3
# Reference values for the GaLore tests (tests/test_optim_galore.cpp): galore_torch 1.0's GaLoreAdamW,
# GaLoreAdafactor and GaLoreAdamW8bit (small tensors: bitsandbytes' 32-bit kernel) as HF's Trainer builds them
# (the learning rate alone; galore_torch's defaults otherwise), and apollo_torch 1.0's APOLLOAdamW as HF builds
# it (its groups: the other parameters with the class defaults, the targets with the projection arguments and
# HF's betas and epsilon), transcribed line by line in torch (galore_torch, apollo_torch and bitsandbytes are
# not in Debian): 5 steps on fixed gradients, the parameters after each config.
#
#   /usr/bin/python3 tools/make_galore_golden.py tests/golden/optim
import math, os, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import st_save  # noqa: E402
from make_optim_golden import Bnb32  # noqa: E402  (bitsandbytes' 32-bit Adam kernel, transcribed)

STEPS = 5
# A tall and a wide linear weight (projected), an embedding, a bias and a norm weight (not projected).
PARAMS = [("h.0.attn.c_attn.weight", (8, 6)), ("h.0.mlp.c_fc.weight", (4, 10)), ("wte.weight", (10, 6)),
          ("h.0.attn.c_attn.bias", (6,)), ("h.0.ln_1.weight", (6,))]
PROJECTED = ("h.0.attn.c_attn.weight", "h.0.mlp.c_fc.weight")


class Projector:
    """galore_torch's GaLoreProjector (2-D)."""

    def __init__(self, rank, update_proj_gap, scale, proj_type):
        self.rank, self.gap, self.scale, self.proj_type = rank, update_proj_gap, scale, proj_type
        self.ortho = None

    def basis(self, g, side):
        u, s, vh = torch.linalg.svd(g, full_matrices=False)
        if side == "right":
            return vh[:self.rank, :]
        if side == "left":
            return u[:, :self.rank]
        return [u[:, :self.rank], vh[:self.rank, :]]

    def side(self, g):
        tall = g.shape[0] >= g.shape[1]
        if self.proj_type == "std":
            return "right" if tall else "left"
        if self.proj_type == "reverse_std":
            return "left" if tall else "right"
        return self.proj_type

    def project(self, g, it):
        side = self.side(g)
        if self.ortho is None or it % self.gap == 0:
            self.ortho = self.basis(g, side)
        self.last_side = side
        if side == "right":
            return torch.matmul(g, self.ortho.t())
        if side == "left":
            return torch.matmul(self.ortho.t(), g)
        return torch.matmul(self.ortho[0].t(), g) @ self.ortho[1].t()

    def project_back(self, low):
        if self.last_side == "right":
            full = torch.matmul(low, self.ortho)
        elif self.last_side == "left":
            full = torch.matmul(self.ortho, low)
        else:
            full = torch.matmul(self.ortho[0], low) @ self.ortho[1]
        return full * self.scale


class GaloreAdamW:
    """galore_torch.GaLoreAdamW.step (betas (0.9, 0.999), eps 1e-6, weight_decay 0, correct_bias)."""

    def __init__(self, params, lr, galore, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        self.params, self.lr, self.galore = params, lr, galore
        self.betas, self.eps, self.wd = betas, eps, weight_decay
        self.state = {n: {"step": 0} for n in params}

    @torch.no_grad()
    def step(self):
        for n, p in self.params.items():
            grad, st = p.grad, self.state[n]
            if n in PROJECTED:
                st.setdefault("projector", Projector(**self.galore))
                grad = st["projector"].project(grad, st["step"])
            if "exp_avg" not in st:
                st["exp_avg"], st["exp_avg_sq"] = torch.zeros_like(grad), torch.zeros_like(grad)
            m, v = st["exp_avg"], st["exp_avg_sq"]
            b1, b2 = self.betas
            st["step"] += 1
            m.mul_(b1).add_(grad, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(grad, grad, value=1.0 - b2)
            denom = v.sqrt().add_(self.eps)
            step_size = self.lr * math.sqrt(1.0 - b2 ** st["step"]) / (1.0 - b1 ** st["step"])
            norm_grad = m / denom
            if n in PROJECTED:
                norm_grad = st["projector"].project_back(norm_grad)
            p.add_(norm_grad, alpha=-step_size)
            if self.wd > 0.0:
                p.add_(p, alpha=-self.lr * self.wd)


class GaloreAdafactor:
    """galore_torch.GaLoreAdafactor.step as HF builds it (scale_parameter/relative_step False, beta1 None)."""

    def __init__(self, params, lr, galore, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8):
        self.params, self.lr, self.galore = params, lr, galore
        self.eps, self.clip, self.decay_rate = eps, clip_threshold, decay_rate
        self.state = {n: {"step": 0} for n in params}

    @staticmethod
    def rms(t):
        return t.norm(2) / (t.numel() ** 0.5)

    @torch.no_grad()
    def step(self):
        for n, p in self.params.items():
            grad, st = p.grad, self.state[n]
            if n in PROJECTED:
                st.setdefault("projector", Projector(**self.galore))
                grad = st["projector"].project(grad, st["step"])
            factored = grad.dim() >= 2
            if "init" not in st:
                st["init"] = True
                if factored:
                    st["row"] = torch.zeros(grad.shape[:-1])
                    st["col"] = torch.zeros(grad.shape[:-2] + grad.shape[-1:])
                else:
                    st["sq"] = torch.zeros_like(grad)
            st["step"] += 1
            lr = self.lr
            beta2t = 1.0 - math.pow(st["step"], self.decay_rate)
            update = grad ** 2 + self.eps[0]
            if factored:
                row, col = st["row"], st["col"]
                row.mul_(beta2t).add_(update.mean(dim=-1), alpha=1.0 - beta2t)
                col.mul_(beta2t).add_(update.mean(dim=-2), alpha=1.0 - beta2t)
                r = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
                c = col.unsqueeze(-2).rsqrt()
                update = torch.mul(r, c)
                update.mul_(grad)
            else:
                sq = st["sq"]
                sq.mul_(beta2t).add_(update, alpha=1.0 - beta2t)
                update = sq.rsqrt().mul_(grad)
            update.div_((self.rms(update) / self.clip).clamp_(min=1.0))
            update.mul_(lr)
            if n in PROJECTED:
                update = st["projector"].project_back(update)
            p.add_(-update)


class GaloreAdamW8bit:
    """galore_torch.GaLoreAdamW8bit.step on tensors below bitsandbytes' min_8bit_size (its 32-bit kernel): the
    low-rank update taken on a zeroed stand-in, projected back and added, then the saved weight decay."""

    def __init__(self, params, lr, galore, weight_decay=1e-2):
        self.params, self.lr, self.wd = params, lr, weight_decay
        self.projectors = {n: Projector(**galore) for n in PROJECTED}
        self.standins = {}
        self.inner = {}
        self.step_count = 0
        for n, p in params.items():
            if n not in PROJECTED:
                self.inner[n] = Bnb32([{"params": [p], "weight_decay": weight_decay}], "adam", lr=lr)

    @torch.no_grad()
    def step(self):
        for n, p in self.params.items():
            if n not in PROJECTED:
                self.inner[n].step()
                continue
            low = self.projectors[n].project(p.grad, self.step_count)
            if n not in self.standins:
                self.standins[n] = torch.zeros_like(low).requires_grad_(True)
                self.inner[n] = Bnb32([{"params": [self.standins[n]], "weight_decay": 0.0}], "adam", lr=self.lr)
            z = self.standins[n]
            z.zero_()
            z.grad = low
            self.inner[n].step()
            p.add_(self.projectors[n].project_back(z))
            p.add_(p, alpha=-self.lr * self.wd)
        self.step_count += 1


def stable_randn(shape, seed):
    """apollo_torch's stable_randn on the CPU."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def next_seed(seed, adv=0xF):
    """apollo_torch's next_seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, torch.iinfo(torch.int64).max, (adv,), generator=g).tolist()[-1]


class RandomProjector(Projector):
    """apollo_torch's GradientProjector: a Gaussian basis / sqrt(rank) drawn from the weight's seed."""

    def __init__(self, rank, update_proj_gap, scale, proj_type, seed):
        super().__init__(rank, update_proj_gap, scale, proj_type)
        self.seed = seed

    def basis(self, g, side):
        shape = (self.rank, g.shape[1]) if side == "right" else (g.shape[0], self.rank)
        proj = stable_randn(shape, self.seed) / math.sqrt(self.rank)
        self.seed = next_seed(self.seed)
        return proj


class ApolloAdamW:
    """apollo_torch.APOLLOAdamW.step (scale_front False, disable_nl False) over HF's two groups: the others
    (betas (0.9, 0.999), eps 1e-6) numbered first, then the targets (HF's betas and eps); no weight decay."""

    def __init__(self, params, lr, apollo, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.apollo, self.betas, self.eps = params, lr, apollo, betas, eps
        order = [n for n in params if n not in PROJECTED] + [n for n in params if n in PROJECTED]
        self.state = {n: {"seed": i + 1} for i, n in enumerate(order)}
        self.order = order

    @torch.no_grad()
    def step(self):
        for n in self.order:
            p = self.params[n]
            grad, st = p.grad, self.state[n]
            if "step" not in st:
                st["step"] = 0
            target = n in PROJECTED
            b1, b2 = self.betas if target else (0.9, 0.999)
            eps = self.eps if target else 1e-6
            if target:
                norm_dim = 0 if grad.shape[0] < grad.shape[1] else 1
                if "projector" not in st:
                    a = self.apollo
                    st["projector"] = (RandomProjector(a["rank"], a["update_proj_gap"], a["scale"], a["proj_type"],
                                                       st["seed"]) if a["proj"] == "random" else
                                       Projector(a["rank"], a["update_proj_gap"], a["scale"], a["proj_type"]))
                grad = st["projector"].project(grad, st["step"])
            if "exp_avg" not in st:
                st["exp_avg"], st["exp_avg_sq"] = torch.zeros_like(grad), torch.zeros_like(grad)
            m, v = st["exp_avg"], st["exp_avg_sq"]
            st["step"] += 1
            m.mul_(b1).add_(grad, alpha=(1.0 - b1))
            v.mul_(b2).addcmul_(grad, grad, value=1.0 - b2)
            denom = v.sqrt().add_(eps)
            step_size = self.lr * math.sqrt(1.0 - b2 ** st["step"]) / (1.0 - b1 ** st["step"])
            norm_grad = m / denom
            if target:
                if self.apollo["scale_type"] == "channel":
                    factor = torch.norm(norm_grad, dim=norm_dim) / (torch.norm(grad, dim=norm_dim) + 1e-8)
                    if norm_dim == 1:
                        factor = factor.unsqueeze(1)
                else:
                    factor = torch.norm(norm_grad) / (torch.norm(grad) + 1e-8)
                scaled_grad = p.grad * factor
                if "scaled_grad" in st:
                    scaled_grad_norm = torch.norm(scaled_grad)
                    limiter = max(scaled_grad_norm / (st["scaled_grad"] + 1e-8), 1.01) / 1.01
                    scaled_grad = scaled_grad / limiter
                    st["scaled_grad"] = scaled_grad_norm / limiter
                else:
                    st["scaled_grad"] = torch.norm(scaled_grad)
                norm_grad = scaled_grad
                norm_grad *= math.sqrt(self.apollo["scale"])
            p.add_(norm_grad, alpha=-step_size)


GALORE = dict(rank=3, update_proj_gap=2, scale=0.25, proj_type="std")
APOLLO = dict(rank=3, update_proj_gap=2, scale=1.0, proj_type="std", proj="random", scale_type="channel")
CONFIGS = {
    "galore_adamw": lambda ps: GaloreAdamW(ps, 1e-2, GALORE),
    "galore_adamw_full": lambda ps: GaloreAdamW(ps, 1e-2, dict(GALORE, proj_type="full", update_proj_gap=3)),
    "galore_adamw_reverse": lambda ps: GaloreAdamW(ps, 1e-2, dict(GALORE, proj_type="reverse_std", rank=2,
                                                                   scale=1.0, update_proj_gap=1)),
    "galore_adafactor": lambda ps: GaloreAdafactor(ps, 1e-2, GALORE),
    "galore_adamw_8bit": lambda ps: GaloreAdamW8bit(ps, 1e-2, GALORE),
    "apollo_adamw": lambda ps: ApolloAdamW(ps, 1e-2, APOLLO),
    "apollo_adamw_tensor": lambda ps: ApolloAdamW(ps, 1e-2, dict(APOLLO, scale_type="tensor", rank=8, scale=4.0,
                                                                 proj_type="reverse_std", update_proj_gap=3),
                                                  betas=(0.8, 0.99), eps=1e-6),
    "apollo_adamw_svd": lambda ps: ApolloAdamW(ps, 1e-2, dict(APOLLO, proj="svd", update_proj_gap=1)),
}


def main(out_dir):
    torch.manual_seed(4321)
    init = {n: torch.randn(s) for n, s in PARAMS}
    grads = [{n: torch.randn(s) for n, s in PARAMS} for _ in range(STEPS)]
    out = {f"init.{n}": t for n, t in init.items()}
    for k, g in enumerate(grads):
        out.update({f"grad{k + 1}.{n}": t for n, t in g.items()})
    for cfg, make in CONFIGS.items():
        params = {n: t.clone().requires_grad_(True) for n, t in init.items()}
        opt = make(params)
        for k in range(STEPS):
            for n, p in params.items():
                p.grad = grads[k][n].clone()
            opt.step()
        out.update({f"{cfg}.{n}": p.detach().clone() for n, p in params.items()})
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "galore_golden.safetensors")
    st_save(path, out)
    print(f"wrote {path}: {len(out)} tensors, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/optim")
