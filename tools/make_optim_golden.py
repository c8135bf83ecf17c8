#!/usr/bin/env python3
# Reference values for the optimizer tests (tests/test_optim.cpp): a few small parameters, fixed gradients for
# 5 steps, and the parameters after the 5 steps under torch.optim's AdamW, SGD, Adagrad and RMSprop, a
# line-by-line transcription of transformers' Adafactor (transformers is not needed) and of bitsandbytes'
# 32-bit Lion, RMSprop, Adam and AdEMAMix kernels, schedulefree's AdamW, RAdam and SGD (their foreach steps),
# optimi's StableAdamW (its for-loop step), grokadamw's GrokAdamW, lomo_optim's Lomo and AdaLomo (their
# per-parameter update as the backward hook runs it), torchdistx's AnyPrecisionAdamW over f32 and bf16
# weights (its step rewritten op for op), plus bitsandbytes' dynamic 8-bit maps.
# Needs only Debian's python3-torch (the safetensors writer is make_golden.py's).
#
#   /usr/bin/python3 tools/make_optim_golden.py tests/golden/optim
import math, os, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import st_save  # noqa: E402  (the safetensors writer of the model goldens)

STEPS = 5
# (name, shape): a 2-D and a 3-D tensor that decay, a bias and a norm weight that do not (HF's groups).
PARAMS = [("h.0.attn.c_attn.weight", (4, 6)), ("h.0.attn.c_attn.bias", (6,)), ("h.0.ln_1.weight", (6,)),
          ("conv.weight", (2, 3, 4))]


def decays(name):
    return not (name.endswith(".bias") or ".ln_" in name)


class Adafactor(torch.optim.Optimizer):
    """transformers.optimization.Adafactor's step, same tensor operations in the same order (f32 params)."""

    def __init__(self, params, lr=None, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8, beta1=None,
                 weight_decay=0.0, scale_parameter=True, relative_step=True, warmup_init=False):
        super().__init__(params, dict(lr=lr, eps=eps, clip_threshold=clip_threshold, decay_rate=decay_rate,
                                      beta1=beta1, weight_decay=weight_decay, scale_parameter=scale_parameter,
                                      relative_step=relative_step, warmup_init=warmup_init))

    @staticmethod
    def rms(t):
        return t.norm(2) / (t.numel() ** 0.5)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                grad = p.grad
                state = self.state[p]
                factored = grad.dim() >= 2
                momentum = group["beta1"] is not None
                if not state:
                    state["step"] = 0
                    if momentum:
                        state["exp_avg"] = torch.zeros_like(grad)
                    if factored:
                        state["row"] = torch.zeros(grad.shape[:-1])
                        state["col"] = torch.zeros(grad.shape[:-2] + grad.shape[-1:])
                    else:
                        state["sq"] = torch.zeros_like(grad)
                state["step"] += 1
                t = state["step"]
                lr = group["lr"]
                if group["relative_step"]:
                    lr = min(1e-6 * t if group["warmup_init"] else 1e-2, 1.0 / math.sqrt(t))
                scale = max(group["eps"][1], self.rms(p)) if group["scale_parameter"] else 1.0
                lr = scale * lr
                beta2t = 1.0 - math.pow(t, group["decay_rate"])
                update = grad ** 2 + group["eps"][0]
                if factored:
                    row, col = state["row"], state["col"]
                    row.mul_(beta2t).add_(update.mean(dim=-1), alpha=1.0 - beta2t)
                    col.mul_(beta2t).add_(update.mean(dim=-2), alpha=1.0 - beta2t)
                    r = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
                    c = col.unsqueeze(-2).rsqrt()
                    update = torch.mul(r, c)
                    update.mul_(grad)
                else:
                    sq = state["sq"]
                    sq.mul_(beta2t).add_(update, alpha=1.0 - beta2t)
                    update = sq.rsqrt().mul_(grad)
                update.div_((self.rms(update) / group["clip_threshold"]).clamp_(min=1.0))
                update.mul_(lr)
                if momentum:
                    state["exp_avg"].mul_(group["beta1"]).add_(update, alpha=1 - group["beta1"])
                    update = state["exp_avg"]
                if group["weight_decay"] != 0:
                    p.add_(p, alpha=-group["weight_decay"] * lr)
                p.add_(-update)


def f32(x):
    """x rounded to f32 (bitsandbytes hands its kernels f32 arguments)."""
    return torch.tensor(x, dtype=torch.float32).item()


class Bnb32(torch.optim.Optimizer):
    """bitsandbytes' 32-bit kernels (kOptimizer32bit1State / 2State) for Lion, RMSprop and Adam, transcribed
    op for op in f32 tensor arithmetic (bitsandbytes needs a GPU; its CPU build is not in Debian)."""

    def __init__(self, params, kind, lr, betas=(0.9, 0.999), eps=1e-8, alpha=5.0, t_alpha=None, t_beta3=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        self.kind = kind
        self.alpha, self.t_alpha, self.t_beta3 = alpha, t_alpha, t_beta3

    def ademamix_scalars(self, b1, b3, t):
        """AdEMAMix.update_step's schedules, in Python floats (alpha, beta3 as handed to the kernel)."""
        alpha = self.alpha
        if self.t_alpha:
            alpha = min(t * alpha / self.t_alpha, alpha)
        if self.t_beta3:
            ln1, ln3, s = math.log(b1), math.log(b3), t / self.t_beta3
            b3 = min(math.exp((ln1 * ln3) / (((1 - s) * ln3) + (s * ln1))), b3)
        return f32(alpha), f32(b3)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd, eps = f32(group["lr"]), f32(group["weight_decay"]), f32(group["eps"])
            b1, b2 = f32(group["betas"][0]), f32(group["betas"][1])
            one_b1, one_b2 = f32(1.0 - b1), f32(1.0 - b2)  # exact in f32: b1, b2 in [0, 1)
            for p in group["params"]:
                g = p.grad.clone()
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["state1"] = torch.zeros_like(p)
                    if self.kind in ("adam", "ademamix"):
                        state["state2"] = torch.zeros_like(p)
                    if self.kind == "ademamix":
                        state["state3"] = torch.zeros_like(p)
                state["step"] += 1
                s1 = state["state1"]
                if self.kind == "lion":
                    if wd > 0:
                        p.mul_(f32(1.0 - f32(lr * wd)))
                    p.sub_(torch.sign(s1 * b1 + g * one_b1) * lr)
                    s1.copy_(s1 * b2 + g * one_b2)
                elif self.kind == "rmsprop":
                    if wd > 0:
                        g = g + p * wd
                    s1.copy_(s1 * b1 + (g * one_b1) * g)
                    p.sub_((g / (s1.sqrt() + eps)) * lr)
                elif self.kind == "ademamix":  # kOptimizer32bit2State<ADEMAMIX>
                    t = state["step"]
                    alpha, b3 = self.ademamix_scalars(group["betas"][0], group["betas"][2], t)
                    c1 = f32(1.0 - f32(b1 ** t))
                    c2 = f32(math.sqrt(f32(1.0 - f32(b2 ** t))))
                    s2, s3 = state["state2"], state["state3"]
                    s1.copy_(s1 * b1 + g * one_b1)
                    s3.copy_(s3 * b3 + g * f32(1.0 - b3))
                    s2.copy_(s2 * b2 + (g * one_b2) * g)
                    p.sub_(((s1 / c1 + s3 * alpha) / (s2.sqrt() / c2 + eps)) * lr)
                    if wd > 0:
                        p.mul_(f32(1.0 - f32(lr * wd)))
                else:  # adam
                    t = state["step"]
                    c1 = f32(1.0 - f32(b1 ** t))
                    c2 = f32(math.sqrt(f32(1.0 - f32(b2 ** t))))
                    step_size = f32(f32(-lr * c2) / c1)
                    s2 = state["state2"]
                    s1.copy_(s1 * b1 + g * one_b1)
                    s2.copy_(s2 * b2 + (g * g) * one_b2)
                    p.add_((s1 / (s2.sqrt() + f32(eps * c2))) * step_size)
                    if wd > 0:
                        p.mul_(f32(1.0 - f32(lr * wd)))


class GrokAdamW(torch.optim.Optimizer):
    """grokadamw 0.1's published GrokAdamW step (no grokking signal functions: the signal is 0), its
    per-parameter clip_grad_norm_ and torch ops in its order (its autocast does nothing on the CPU)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, alpha_init=0.98, lamb=2.0, gamma=0.1,
                 grokking_signal_decay_rate=0.1, gradient_clipping=1.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, alpha_init=alpha_init, lamb=lamb, gamma=gamma,
                                      grokking_signal_decay_rate=grokking_signal_decay_rate,
                                      gradient_clipping=gradient_clipping))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for i, p in enumerate(params):
                grad, state = p.grad, self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p),
                                 grok_ema=torch.zeros_like(p))
                exp_avg, exp_avg_sq, grok_ema = state["exp_avg"], state["exp_avg_sq"], state["grok_ema"]
                beta1, beta2 = group["betas"]
                state["step"] += 1
                if group["gradient_clipping"] > 0:
                    torch.nn.utils.clip_grad_norm_(p, group["gradient_clipping"])
                layer_beta1 = beta1 * (1 - group["gamma"]) ** i
                alpha = group["alpha_init"] * math.exp(-group["grokking_signal_decay_rate"] * 0.0)
                grok_ema.mul_(alpha).add_(grad, alpha=1 - alpha)
                grok_grad = grad + group["lamb"] * grok_ema
                exp_avg.mul_(layer_beta1).add_(grok_grad, alpha=1 - layer_beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grok_grad, grok_grad, value=1 - beta2)
                bias_correction1 = 1 - beta1 ** state["step"]
                bias_correction2 = 1 - beta2 ** state["step"]
                step_size = group["lr"] * math.sqrt(bias_correction2) / bias_correction1
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.addcdiv_(exp_avg, exp_avg_sq.sqrt().add_(group["eps"]), value=-step_size)


class ScheduleFree(torch.optim.Optimizer):
    """schedulefree 1.4's AdamWScheduleFree, RAdamScheduleFree (silent_sgd_phase) and SGDScheduleFree, their
    foreach steps re-expressed with the same torch._foreach_ ops in the same order (schedulefree is not in
    Debian). kind: "adamw", "radam" or "sgd" (betas[0] is SGD's momentum)."""

    def __init__(self, params, kind, lr, betas=(0.9, 0.999), eps=1e-8, warmup_steps=0, r=0.0,
                 weight_lr_power=2.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, warmup_steps=warmup_steps, r=r,
                                      weight_lr_power=weight_lr_power, k=0, weight_sum=0.0, lr_max=-1.0,
                                      train_mode=False))
        self.kind = kind

    @torch.no_grad()
    def switch(self, train):
        for group in self.param_groups:
            if group["train_mode"] != train:
                b1 = group["betas"][0]
                for p in group["params"]:
                    if "z" in self.state[p]:
                        p.lerp_(end=self.state[p]["z"], weight=1 - b1 if train else 1 - 1 / b1)
                group["train_mode"] = train

    @torch.no_grad()
    def step(self):
        assert self.param_groups[0]["train_mode"]
        for group in self.param_groups:
            b1, b2 = group["betas"]
            k = group["k"]
            lr, normalize, bc2 = group["lr"], True, 1.0
            if self.kind == "radam":
                step = k + 1
                beta2_t = b2 ** step
                bc2 = 1 - beta2_t
                rho_inf = 2 / (1 - b2) - 1
                rho_t = rho_inf - 2 * step * beta2_t / bc2
                rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5 \
                    if rho_t > 4.0 else 0.0
                normalize = rho_t > 4.0
                lr = lr * rect
            else:
                sched = (k + 1) / group["warmup_steps"] if k < group["warmup_steps"] else 1.0
                bc2 = 1 - b2 ** (k + 1)
                lr = lr * sched
            lr_max = group["lr_max"] = max(lr, group["lr_max"])
            weight = ((k + 1) ** group["r"]) * (lr_max ** group["weight_lr_power"])
            weight_sum = group["weight_sum"] = group["weight_sum"] + weight
            ckp1 = weight / weight_sum if weight_sum != 0 else 0
            active = [p for p in group["params"] if p.grad is not None]
            for p in active:
                if "z" not in self.state[p]:
                    self.state[p]["z"] = torch.clone(p)
                    self.state[p]["exp_avg_sq"] = torch.zeros_like(p)
            y = [p for p in active]
            grad = [p.grad for p in active]
            z = [self.state[p]["z"] for p in active]
            if self.kind != "sgd":
                v = [self.state[p]["exp_avg_sq"] for p in active]
                torch._foreach_mul_(v, b2)
                torch._foreach_addcmul_(v, grad, grad, value=1 - b2)
                if normalize:
                    denom = torch._foreach_div(v, bc2)
                    torch._foreach_sqrt_(denom)
                    torch._foreach_add_(denom, group["eps"])
                    torch._foreach_div_(grad, denom)
            if group["weight_decay"] != 0:
                torch._foreach_add_(grad, y, alpha=group["weight_decay"])
            for yi, zi in zip(y, z):  # torch._foreach_lerp_ (newer than torch 1.13): lerp_ per tensor on the CPU
                yi.lerp_(zi, ckp1)
            torch._foreach_add_(y, grad, alpha=lr * (b1 * (1 - ckp1) - 1))
            torch._foreach_sub_(z, grad, alpha=lr)
            group["k"] = k + 1


class StableAdamW(torch.optim.Optimizer):
    """optimi 0.3's StableAdamW, its for-loop step (_single_param_stableadamw, what it runs on the CPU) with the
    same tensor operations in the same order; f32/f64 parameters (no Kahan summation)."""

    def __init__(self, params, lr, betas=(0.9, 0.99), eps=1e-6, decouple_lr=False, max_lr=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, decouple_lr=decouple_lr,
                                      max_lr=lr if decouple_lr and max_lr is None else max_lr))
        self.step_count = 0

    @torch.no_grad()
    def step(self):
        self.step_count += 1
        t = self.step_count
        for group in self.param_groups:
            b1, b2 = group["betas"]
            b1_hat = (b1 ** t - b1) / (b1 ** t - 1)  # optimi's debias_beta
            b2_hat = (b2 ** t - b2) / (b2 ** t - 1)
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                    state["eps_sq"] = torch.tensor(group["eps"] ** 2, dtype=p.dtype)
                grad, m, v = p.grad, state["exp_avg"], state["exp_avg_sq"]
                m.lerp_(grad, weight=1 - b1_hat)
                v.mul_(b2_hat).addcmul_(grad, grad, value=1 - b2_hat)
                rms = grad.pow(2).div_(v.maximum(state["eps_sq"])).mean().sqrt()
                lr = group["lr"] / max(1, rms.item())
                wd = group["weight_decay"]
                if wd != 0:
                    p.mul_(1 - (lr / group["max_lr"]) * wd if group["decouple_lr"] else 1 - lr * wd)
                p.addcdiv_(m, v.sqrt().add_(group["eps"]), value=-lr)


# Schedule-free configs run SF_STEPS steps on the gradients in turn, the scheduler's rate lr * SF_LR(k), an
# evaluation (eval then train) after step SF_EVAL, and end in eval mode: "<cfg>.<name>" holds x, "<cfg>.y.<name>"
# the last step's y.
SF_STEPS, SF_EVAL = 8, 3


class LomoRef:
    """lomo_optim's Lomo / AdaLomo fuse_update (non-ZeRO), run on each parameter as its backward hook does once
    the gradient is final; one step() is one fused_backward. As HF builds them: lr alone (no clipping, no
    weight decay). AdaLomo's loss_scale (2^10 on the loss, divided out of the gradient) changes no bit and is
    left out; its row/column states take Adafactor's shapes (shape[:-1], shape[:-2] + shape[-1:]), which are
    lomo_optim's for the matrices it was written for and also cover the 3-D test tensor."""

    def __init__(self, params, ada, lr):
        self.params, self.ada, self.lr, self.step_num = params, ada, lr, 0
        self.eps, self.decay_rate, self.clip_threshold = (1e-30, 1e-3), -0.8, 1.0
        self.row, self.col, self.sq = {}, {}, {}
        for n, p in params.items():
            if p.dim() > 1:
                self.row[n] = torch.zeros(p.shape[:-1])
                self.col[n] = torch.zeros(p.shape[:-2] + p.shape[-1:])
            else:
                self.sq[n] = torch.zeros(p.shape)

    @staticmethod
    def rms(t):
        return t.norm(2) / (t.numel() ** 0.5)

    @torch.no_grad()
    def step(self):
        self.step_num += 1
        for n, p in self.params.items():
            grad_fp32 = p.grad.to(torch.float32)
            p.grad = None
            p_fp32 = p.data.to(torch.float32)
            if not self.ada:
                p_fp32.add_(grad_fp32, alpha=-self.lr)
                p.data.copy_(p_fp32)
                continue
            decay_rate = -self.decay_rate if self.step_num == 0 and self.decay_rate < 0 else self.decay_rate
            beta2t = 1.0 - math.pow(self.step_num, decay_rate)
            update = (grad_fp32 ** 2) + self.eps[0]
            if p.dim() > 1:
                self.row[n].mul_(beta2t).add_(update.mean(dim=-1), alpha=1.0 - beta2t)
                self.col[n].mul_(beta2t).add_(update.mean(dim=-2), alpha=1.0 - beta2t)
                r_factor = (self.row[n] / self.row[n].mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
                c_factor = self.col[n].unsqueeze(-2).rsqrt()
                update = torch.mul(r_factor, c_factor)
                update.mul_(grad_fp32)
            else:
                self.sq[n].mul_(beta2t).add_(update, alpha=1.0 - beta2t)
                update = self.sq[n].rsqrt().mul_(grad_fp32)
            update.div_((self.rms(update) / self.clip_threshold).clamp_(min=1.0))
            p_rms = torch.norm(p_fp32, 2.0) / math.sqrt(p.numel())
            lr = self.lr * max(self.eps[1], p_rms)
            p_fp32.add_(update, alpha=-lr)
            p.data.copy_(p_fp32)


class AnyPrecisionRef(torch.optim.Optimizer):
    """torchdistx's AnyPrecisionAdamW step (HF's adamw_anyprecision), rewritten op for op: an f32 0-dim step
    tensor, the decay, the two moment updates, the f32 bias corrections, the centered variance, and either the
    plain addcdiv or the Kahan-compensated update, each tensor in its own dtype."""

    def __init__(self, params, lr, betas, eps, weight_decay, kahan, m_dtype, v_dtype, c_dtype):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.kahan, self.m_dtype, self.v_dtype, self.c_dtype = kahan, m_dtype, v_dtype, c_dtype

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["step"] = torch.tensor(0.0)
                    st["m"] = torch.zeros_like(p, dtype=self.m_dtype)
                    st["v"] = torch.zeros_like(p, dtype=self.v_dtype)
                    if self.kahan:
                        st["c"] = torch.zeros_like(p, dtype=self.c_dtype)
                st["step"] += 1
                t, m, v, g = st["step"], st["m"], st["v"], p.grad
                if wd:
                    p.mul_(1 - lr * wd)
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                step_size = lr / (1 - b1 ** t)
                centered = (v.sqrt() / ((1 - b2 ** t) ** 0.5)).add_(eps, alpha=1)
                if self.kahan:
                    c = st["c"]
                    c.addcdiv_(m, centered, value=-step_size)
                    before = p.detach().clone()
                    p.add_(c)
                    c.add_(before.sub_(p))
                else:
                    p.addcdiv_(m, centered, value=-step_size)


# name -> (param dtype, kahan, momentum, variance, compensation dtype): HF's defaults (f32 states, no Kahan);
# the pure-bf16 recipe (bf16 everything, Kahan); bf16 weights and states without Kahan; f32 with an f32
# buffer. torch 1.13's CPU kernels refuse mixed dtypes within one addcdiv_ (torchdistx's own default, f32
# momentum beside bf16 variance, fails here as HF's comment in trainer.py says), so each config has one dtype.
ANYPRECISION_CONFIGS = {
    "anyprecision": (torch.float32, False, torch.float32, torch.float32, torch.float32),
    "anyprecision_bf16_kahan": (torch.bfloat16, True, torch.bfloat16, torch.bfloat16, torch.bfloat16),
    "anyprecision_bf16": (torch.bfloat16, False, torch.bfloat16, torch.bfloat16, torch.bfloat16),
    "anyprecision_f32_kahan": (torch.float32, True, torch.float32, torch.float32, torch.float32),
}


LOMO_CONFIGS = {
    "lomo": lambda params: LomoRef(params, False, 0.1),
    "adalomo": lambda params: LomoRef(params, True, 1e-2),
}


def SF_LR(k):
    return 1.0 - 0.05 * k  # a linear decay, as HF's default scheduler hands it over


def groups(params, wd):
    return [{"params": [p for n, p in params.items() if decays(n)], "weight_decay": wd},
            {"params": [p for n, p in params.items() if not decays(n)], "weight_decay": 0.0}]


# config name -> (constructor over param groups); the C++ test builds the same through make_optimizer.
CONFIGS = {
    "adamw": lambda g: torch.optim.AdamW(groups(g, 0.1), lr=1e-2, betas=(0.9, 0.999), eps=1e-8),
    "sgd": lambda g: torch.optim.SGD(groups(g, 0.0), lr=0.1),
    "sgd_momentum": lambda g: torch.optim.SGD(groups(g, 0.01), lr=0.1, momentum=0.9, dampening=0.1),
    "sgd_nesterov": lambda g: torch.optim.SGD(groups(g, 0.01), lr=0.1, momentum=0.9, nesterov=True),
    "adafactor": lambda g: Adafactor(groups(g, 0.01), lr=1e-2, scale_parameter=False, relative_step=False,
                                     warmup_init=False),
    "adafactor_beta1": lambda g: Adafactor(groups(g, 0.01), lr=1e-2, beta1=0.9, clip_threshold=0.5,
                                           scale_parameter=False, relative_step=False, warmup_init=False),
    "adafactor_scaled": lambda g: Adafactor(groups(g, 0.0), lr=1e-2, scale_parameter=True, relative_step=False,
                                            warmup_init=False),
    "adagrad": lambda g: torch.optim.Adagrad(groups(g, 0.01), lr=1e-2),
    "adagrad_args": lambda g: torch.optim.Adagrad(groups(g, 0.01), lr=0.1, lr_decay=0.01,
                                                  initial_accumulator_value=0.1, eps=1e-6),
    "rmsprop": lambda g: torch.optim.RMSprop(groups(g, 0.01), lr=1e-2),
    "rmsprop_momentum": lambda g: torch.optim.RMSprop(groups(g, 0.01), lr=1e-2, alpha=0.9, eps=1e-6,
                                                      momentum=0.9),
    "lion": lambda g: Bnb32(groups(g, 0.1), "lion", lr=1e-2, betas=(0.9, 0.99)),
    "rmsprop_bnb": lambda g: Bnb32(groups(g, 0.01), "rmsprop", lr=1e-2, betas=(0.99, 0.0), eps=1e-8),
    "adam_bnb32": lambda g: Bnb32(groups(g, 0.1), "adam", lr=1e-2, betas=(0.9, 0.999), eps=1e-8),
    "ademamix": lambda g: Bnb32(groups(g, 0.1), "ademamix", lr=1e-2, betas=(0.9, 0.999, 0.9999), eps=1e-8),
    "ademamix_sched": lambda g: Bnb32(groups(g, 0.01), "ademamix", lr=1e-2, betas=(0.8, 0.99, 0.999), eps=1e-6,
                                      alpha=8.0, t_alpha=3, t_beta3=4),
}

STABLE_CONFIGS = {
    "stable_adamw": lambda g: StableAdamW(groups(g, 0.1), lr=1e-2, betas=(0.9, 0.99), eps=1e-8),
    "stable_adamw_decoupled": lambda g: StableAdamW(groups(g, 1e-3), lr=1e-2, betas=(0.9, 0.999), eps=1e-8,
                                                    decouple_lr=True, max_lr=2e-2),
}

GROK_CONFIGS = {
    "grokadamw": lambda g: GrokAdamW(groups(g, 0.1), lr=1e-2),
    "grokadamw_noclip": lambda g: GrokAdamW(groups(g, 0.01), lr=1e-2, alpha_init=0.9, lamb=5.0, gamma=0.3,
                                            gradient_clipping=0.0),
}

SF_CONFIGS = {
    "sf_adamw": lambda g: ScheduleFree(groups(g, 0.1), "adamw", lr=1e-2, betas=(0.9, 0.999), eps=1e-8,
                                       warmup_steps=3),
    "sf_adamw_r": lambda g: ScheduleFree(groups(g, 0.01), "adamw", lr=1e-2, betas=(0.95, 0.99), eps=1e-6, r=1.0,
                                         weight_lr_power=1.5),
    "sf_radam": lambda g: ScheduleFree(groups(g, 0.1), "radam", lr=1e-2, betas=(0.9, 0.9), eps=1e-8),
    "sf_sgd": lambda g: ScheduleFree(groups(g, 0.01), "sgd", lr=0.1, betas=(0.9, 0.0), warmup_steps=2),
}


def dynamic_map(signed):
    """bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8), as its torch code runs."""
    data = []
    for i in range(7):
        items = 2 ** i + 1 if signed else 2 ** (i + 1) + 1
        bounds = torch.linspace(0.1, 1, items)
        means = (bounds[:-1] + bounds[1:]) / 2.0
        data += ((10 ** (-6 + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-6 + i)) * means).tolist()
    data += [0, 1.0]
    assert len(data) == 256
    return torch.tensor(sorted(data), dtype=torch.float32)


def main(out_dir):
    torch.manual_seed(1234)
    init = {n: torch.randn(s) for n, s in PARAMS}
    grads = [{n: torch.randn(s) for n, s in PARAMS} for _ in range(STEPS)]
    # A gradient entry of exactly zero and one large outlier, so clipping and rounding paths are exercised.
    grads[1]["h.0.attn.c_attn.weight"][0, 0] = 0.0
    grads[2]["conv.weight"][1, 2, 3] = 25.0
    out = {f"init.{n}": t for n, t in init.items()}
    for k, g in enumerate(grads):
        out.update({f"grad{k + 1}.{n}": t for n, t in g.items()})
    for cfg, make in list(CONFIGS.items()) + list(STABLE_CONFIGS.items()) + list(GROK_CONFIGS.items()):
        params = {n: t.clone().requires_grad_(True) for n, t in init.items()}
        opt = make(params)
        for k in range(STEPS):
            for n, p in params.items():
                p.grad = grads[k][n].clone()
            opt.step()
        out.update({f"{cfg}.{n}": p.detach().clone() for n, p in params.items()})
    for cfg, (pdt, kahan, mdt, vdt, cdt) in ANYPRECISION_CONFIGS.items():
        params = {n: t.clone().to(pdt) for n, t in init.items()}
        opt = AnyPrecisionRef(groups(params, 0.1), lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1,
                              kahan=kahan, m_dtype=mdt, v_dtype=vdt, c_dtype=cdt)
        for k in range(STEPS):
            for n, p in params.items():
                p.grad = grads[k][n].clone().to(pdt)
            opt.step()
        out.update({f"{cfg}.{n}": p.float() for n, p in params.items()})
    for cfg, make in LOMO_CONFIGS.items():
        params = {n: t.clone() for n, t in init.items()}
        opt = make(params)
        for k in range(STEPS):
            for n, p in params.items():
                p.grad = grads[k][n].clone()
            opt.step()
        out.update({f"{cfg}.{n}": p.clone() for n, p in params.items()})
    for cfg, make in SF_CONFIGS.items():
        params = {n: t.clone().requires_grad_(True) for n, t in init.items()}
        opt = make(params)
        base = [g["lr"] for g in opt.param_groups]
        for k in range(SF_STEPS):
            opt.switch(True)  # HF's training_step
            for g, lr in zip(opt.param_groups, base):
                g["lr"] = lr * SF_LR(k)
            for n, p in params.items():
                p.grad = grads[k % STEPS][n].clone()
            opt.step()
            if k + 1 == SF_EVAL:
                opt.switch(False)  # HF's evaluation_loop
        out.update({f"{cfg}.y.{n}": p.detach().clone() for n, p in params.items()})
        opt.switch(False)
        out.update({f"{cfg}.{n}": p.detach().clone() for n, p in params.items()})
    out["map.signed"] = dynamic_map(True)
    out["map.unsigned"] = dynamic_map(False)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "optim_golden.safetensors")
    st_save(path, out)
    print(f"wrote {path}: {len(out)} tensors, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/optim")
