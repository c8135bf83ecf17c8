// Differentiable matmul/linear, norms, cross-entropy, embedding and rope: forward and backward side by side.
#include "autograd/functions.h"

namespace tr {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;
using ops::BinaryOp;

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  Tensor y = ops::matmul(a, b, ta, tb);
  if (needs_grad({&a, &b})) {
    const bool ga = a.requires_grad(), gb = b.requires_grad();
    record("matmul", {&a, &b}, {&y}, [a, b, ta, tb, ga, gb](const Grads& g) -> Grads {
      // y = A' B' with A' = ta ? a^T : a.  dA' = g B'^T,  dB' = A'^T g, written in a's and b's own layout.
      Grads r(2);
      if (ga)
        r[0] = ops::sum_to_shape(ta ? ops::matmul(b, g[0], tb, true) : ops::matmul(g[0], b, false, !tb),
                                 a.shape());
      if (gb)
        r[1] = ops::sum_to_shape(tb ? ops::matmul(g[0], a, true, ta) : ops::matmul(a, g[0], !ta, false),
                                 b.shape());
      return r;
    });
  }
  return y;
}

namespace {

// The gradients of y = x @ w^T + bias from g2 = dL/dy as [rows, out].
Grads linear_grads(const Tensor& g2, const Tensor& sx, const Tensor& sw, const Shape& xs, bool gx, bool gw,
                   bool gbias) {
  Grads r(3);
  if (gx) r[0] = ops::reshape(ops::matmul(g2, sw), xs);
  if (gw) r[1] = ops::matmul(g2, ops::reshape(sx, {-1, xs.back()}), true, false);
  if (gbias) r[2] = ops::reduce(ops::ReduceOp::sum, g2, {0}, false);
  return r;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  Tensor y = ops::linear(x, w, bias);
  if (needs_grad({&x, &w, &bias})) {
    const bool gx = x.requires_grad(), gw = w.requires_grad(), gbias = bias.defined() && bias.requires_grad();
    Tensor sx = gw ? x : Tensor(), sw = gx ? w : Tensor();
    const Shape xs = x.shape();
    record("linear", {&x, &w, &bias}, {&y}, [sx, sw, xs, gx, gw, gbias](const Grads& g) -> Grads {
      return linear_grads(ops::reshape(g[0], {-1, g[0].size(-1)}), sx, sw, xs, gx, gw, gbias);
    });
  }
  return y;
}

Tensor linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias) {
  ops::LinearGelu o = ops::linear_gelu(x, w, bias);
  if (needs_grad({&x, &w, &bias})) {
    const bool gx = x.requires_grad(), gw = w.requires_grad(), gbias = bias.requires_grad();
    Tensor sx = gw ? x : Tensor(), sw = gx ? w : Tensor(), pre = o.pre;
    const Shape xs = x.shape();
    record("linear_gelu", {&x, &w, &bias}, {&o.y}, [sx, sw, pre, xs, gx, gw, gbias](const Grads& g) -> Grads {
      Tensor gpre = ops::unary_backward(ops::UnaryOp::gelu_tanh, pre, g[0]);
      return linear_grads(ops::reshape(gpre, {-1, gpre.size(-1)}), sx, sw, xs, gx, gw, gbias);
    });
  }
  return o.y;
}

Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  ops::NormOut o = ops::layer_norm(x, w, b, eps);
  if (needs_grad({&x, &w, &b})) {
    const bool gx = x.requires_grad(), gw = w.defined() && w.requires_grad(),
               gb = b.defined() && b.requires_grad();
    Tensor mean = o.mean, rstd = o.rstd;
    record("layer_norm", {&x, &w, &b}, {&o.y}, [x, w, mean, rstd, gx, gw, gb](const Grads& g) -> Grads {
      ops::NormGrads r = ops::layer_norm_backward(x, w, mean, rstd, g[0], gx, gw, gb);
      return {r.gx, r.gw, r.gb};
    });
  }
  return o.y;
}

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  ops::NormOut o = ops::rms_norm(x, w, eps);
  if (needs_grad({&x, &w})) {
    const bool gx = x.requires_grad(), gw = w.defined() && w.requires_grad();
    Tensor rstd = o.rstd;
    record("rms_norm", {&x, &w}, {&o.y}, [x, w, rstd, gx, gw](const Grads& g) -> Grads {
      ops::NormGrads r = ops::rms_norm_backward(x, w, rstd, g[0], gx, gw);
      return {r.gx, r.gw};
    });
  }
  return o.y;
}

std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& r, const Tensor& w, const Tensor& b,
                                         double eps) {
  ops::NormOut o = ops::add_layer_norm(x, r, w, b, eps);
  if (needs_grad({&x, &r, &w, &b})) {
    const bool gin = x.requires_grad() || r.requires_grad(), gw = w.defined() && w.requires_grad(),
               gb = b.defined() && b.requires_grad();
    // An alias without autograd history: holding the output itself would make a cycle through its grad_fn.
    Tensor sum = o.sum.as_strided(o.sum.shape(), o.sum.strides(), o.sum.offset()), mean = o.mean,
           rstd = o.rstd;
    record("add_layer_norm", {&x, &r, &w, &b}, {&o.sum, &o.y},
           [sum, w, mean, rstd, gin, gw, gb](const Grads& g) -> Grads {
             // g[0]: the residual stream's own gradient, g[1]: the norm output's; both reach x and r.
             if (!g[1].defined()) return {g[0], g[0], Tensor(), Tensor()};
             ops::NormGrads n = ops::layer_norm_backward(sum, w, mean, rstd, g[1], gin, gw, gb, g[0]);
             return {n.gx, n.gx, n.gw, n.gb};
           });
  }
  return {o.sum, o.y};
}

std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& r, const Tensor& w, double eps) {
  ops::NormOut o = ops::add_rms_norm(x, r, w, eps);
  if (needs_grad({&x, &r, &w})) {
    const bool gin = x.requires_grad() || r.requires_grad(), gw = w.defined() && w.requires_grad();
    Tensor sum = o.sum.as_strided(o.sum.shape(), o.sum.strides(), o.sum.offset()), rstd = o.rstd;  // no cycle
    record("add_rms_norm", {&x, &r, &w}, {&o.sum, &o.y}, [sum, w, rstd, gin, gw](const Grads& g) -> Grads {
      if (!g[1].defined()) return {g[0], g[0], Tensor()};
      ops::NormGrads n = ops::rms_norm_backward(sum, w, rstd, g[1], gin, gw, g[0]);
      return {n.gx, n.gx, n.gw};
    });
  }
  return {o.sum, o.y};
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index, Reduction reduction,
                     double label_smoothing) {
  ops::CrossEntropyOut o = ops::cross_entropy(logits, labels, ignore_index, label_smoothing);
  double scale = 1.0;
  Tensor y;
  if (reduction == Reduction::none) {
    y = o.loss;
  } else {
    if (reduction == Reduction::mean) {
      int64_t count = 0;
      if (!labels.device().is_meta()) {
        for (int64_t v : ops::to_vector<int64_t>(labels)) count += v != ignore_index;
      }
      scale = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;  // all ignored: 0 loss, 0 grad
    }
    y = ops::affine(ops::reduce(ops::ReduceOp::sum, o.loss, {}, false), scale, 0.0);
  }
  if (needs_grad({&logits})) {
    Tensor lse = o.lse;
    const Shape ls = labels.shape();
    record(
        "cross_entropy", {&logits}, {&y},
        [logits, labels, lse, scale, reduction, ignore_index, label_smoothing, ls](const Grads& g) -> Grads {
          Tensor gl = reduction == Reduction::none
                          ? g[0]
                          : ops::expand(ops::reshape(ops::affine(g[0], scale, 0.0), Shape(ls.size(), 1)), ls);
          return {ops::cross_entropy_backward(logits, labels, lse, ops::contiguous(gl), ignore_index,
                                              label_smoothing)};
        });
  }
  return y;
}

Tensor linear_cross_entropy_sum(const Tensor& x, const Tensor& w, const Tensor& labels, int64_t chunk_rows,
                                int64_t ignore_index, double label_smoothing) {
  TR_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
           "linear_cross_entropy: x {} does not fit w {}", x.describe(), w.describe());
  TR_CHECK(labels.numel() == x.size(0), "linear_cross_entropy: {} labels for {} rows", labels.numel(),
           x.size(0));
  TR_CHECK(chunk_rows > 0, "linear_cross_entropy: chunk_rows must be positive");
  const int64_t N = x.size(0);
  const DType loss_dt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor lab = ops::reshape(labels, {N});
  Tensor total = ops::zeros({}, loss_dt, x.device());
  // With gradients wanted, each chunk's logits turn into their gradient for a fixed loss gradient right here
  // (as Liger's fused linear cross-entropy): three head GEMMs instead of four (no recompute in backward).
  // dx and dw are held in f32 until backward scales them by the loss's gradient and rounds them once, so a
  // bf16 dw is not rounded once per chunk (HF: one f32-accumulated GEMM, one rounding). The cost: from the
  // end of forward to the head's backward (the step's peak) the f32 dw is held where a half-precision run
  // used to allocate a half dw, and rounding it briefly holds both: 4 extra bytes per head weight under
  // bf16/fp16, none under fp32 (trainer estimate counts it).
  const bool gx = needs_grad({&x}), gw = needs_grad({&w});
  // fp16 logit gradients are rounded at 2^12 times their size (|p - y| <= 1 cannot overflow): a probability
  // of 1/50257 would be subnormal at unit scale. Undone, exactly, with the loss's gradient in backward.
  const double pre = x.dtype() == DType::f16 ? 4096.0 : 1.0;
  Tensor dx = gx ? ops::empty(x.shape(), loss_dt, x.device()) : Tensor();
  // A half-precision dw on the CPU is accumulated transposed, as x^T dl: oneDNN's bf16 kernel reads the
  // transposed A of dl^T x at 0.75x its speed for the same product (bench_ops "head dw" rows), and the
  // rounding copy that follows anyway turns it back in 64 x 64 tiles. An f32 dw keeps its layout: it would
  // need a second [V, D] buffer at the step's peak.
  const bool dw_t = gw && x.device().is_cpu() && x.dtype() != loss_dt;
  const Shape dw_shape = dw_t ? Shape{w.size(1), w.size(0)} : w.shape();
  Tensor dw =
      gw ? (N == 0 ? ops::zeros(dw_shape, loss_dt, w.device()) : ops::empty(dw_shape, loss_dt, w.device()))
         : Tensor();
  Tensor unit = gx || gw ? ops::full({std::min(chunk_rows, N)}, pre, loss_dt, x.device()) : Tensor();
  // The logits and their gradient are rows of a buffer padded to a multiple of 64 columns: GPT-2's 50257
  // would give all three head GEMMs an odd leading dimension, which keeps cuBLASLt off its fast kernels
  // (on the H200 they ran as cuBLAS's fallback at ~115 TFLOP/s), and unaligned rows to the loss kernels.
  const int64_t V = w.size(0), ld = (V + 63) / 64 * 64;
  const auto padded = [&](int64_t n, DType dt) {
    return ops::narrow(ops::empty({n, ld}, dt, x.device()), 1, 0, V);
  };
  for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, N - r0);
    Tensor xc = ops::narrow(x, 0, r0, n), lc = ops::narrow(lab, 0, r0, n);
    // Logits straight from the GEMM's f32 accumulator (half operands, f32 product): no half logits to
    // round and widen again before the softmax.
    Tensor logits = padded(n, loss_dt);
    ops::matmul_into(logits, xc, w, false, true, 1.0, 0.0);
    if (!gx && !gw) {
      ops::CrossEntropyOut ce = ops::cross_entropy(logits, lc, ignore_index, label_smoothing);
      ops::binary_(BinaryOp::add, total, ops::reduce(ops::ReduceOp::sum, ce.loss, {}, false));
      continue;
    }
    // The loss and the GEMMs' operand in the model's dtype from one kernel (each row's gradient made while
    // the row is in cache): a half one straight from the f32 values (one rounding, no f32 gradient stored),
    // an f32/f64 one in place of the logits.
    Tensor dl = x.dtype() == loss_dt ? logits : padded(n, x.dtype());
    ops::CrossEntropyOut ce = ops::cross_entropy_with_grad_(logits, lc, ignore_index,
                                                            ops::narrow(unit, 0, 0, n), dl, label_smoothing);
    ops::binary_(BinaryOp::add, total, ops::reduce(ops::ReduceOp::sum, ce.loss, {}, false));
    logits = Tensor();
    if (gx) ops::matmul_into(ops::narrow(dx, 0, r0, n), dl, w, false, false, 1.0, 0.0);
    if (gw) ops::matmul_into(dw, dw_t ? xc : dl, dw_t ? dl : xc, true, false, 1.0, r0 == 0 ? 0.0 : 1.0);
  }
  Tensor y = total;
  if (gx || gw) {
    record("linear_cross_entropy", {&x, &w}, {&y},
           [dx, dw, dw_t, pre, xdt = x.dtype(), wdt = w.dtype()](const Grads& g) mutable -> Grads {
             // Scaled in f32 on the device (no host read of g: a captured step replays this), then
             // rounded once; each f32 buffer is let go as soon as its rounded copy exists.
             const Tensor s =
                 ops::affine(ops::to_dtype(g[0], dx.defined() ? dx.dtype() : dw.dtype()), 1.0 / pre, 0.0);
             auto finish = [&s](Tensor& held, DType dt, bool transposed) {
               if (!held.defined()) return Tensor();
               Tensor t = std::move(held);
               if (!transposed) {
                 ops::binary_(BinaryOp::mul, t, s);
                 return ops::to_dtype(t, dt);
               }
               // Scaled and turned back in one pass (the CPU's transposing copy).
               Tensor out = ops::empty({t.size(1), t.size(0)}, dt, t.device());
               ops::scaled_copy_(ops::transpose(out, 0, 1), t, ops::reshape(s, {}));
               return out;
             };
             Tensor gdx = finish(dx, xdt, false);
             Tensor gdw = finish(dw, wdt, dw_t);
             return {gdx, gdw};
           });
  }
  return y;
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  Tensor y = ops::embedding(weight, ids);
  if (needs_grad({&weight})) {
    const int64_t rows = weight.size(0);
    record("embedding", {&weight}, {&y},
           [ids, rows](const Grads& g) -> Grads { return {ops::embedding_backward(g[0], ids, rows)}; });
  }
  return y;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                                    bool causal, double scale, double dropout_p, Generator* gen,
                                    int64_t window, ops::AttentionForm form) {
  // Attention dropout draws the mask from the generator as dropout() on the [B, H, T, S] probabilities
  // would (in either form), and the backward redraws the same mask.
  ops::AttentionDropout drop;
  if (dropout_p > 0) {
    TR_CHECK(gen != nullptr, "attention dropout needs a generator");
    drop = {dropout_p, gen->seed(),
            gen->reserve(static_cast<uint64_t>(q.size(0) * q.size(1) * q.size(2) * k.size(2)))};
  }
  ops::AttentionOut o = ops::attention(q, k, v, key_keep, causal, scale, window, form, drop);
  if (needs_grad({&q, &k, &v})) {
    Tensor out = o.out.as_strided(o.out.shape(), o.out.strides(), o.out.offset()), lse = o.lse;
    record("attention", {&q, &k, &v}, {&o.out},
           [q, k, v, key_keep, causal, scale, out, lse, window, form, drop](const Grads& g) -> Grads {
             ops::AttentionGrads r = ops::attention_backward(q, k, v, key_keep, causal, scale, out, lse, g[0],
                                                             window, form, drop);
             return {r.dq, r.dk, r.dv};
           });
  }
  return o.out;
}

Tensor rope(const Tensor& x, const ops::RopeTables& tables, const Tensor& positions, bool seq_major) {
  Tensor y = ops::rope(x, tables, positions, seq_major, false);
  if (needs_grad({&x}))
    record("rope", {&x}, {&y}, [tables, positions, seq_major](const Grads& g) -> Grads {
      return {ops::rope(g[0], tables, positions, seq_major, true)};
    });
  return y;
}

}  // namespace tr
