// Adafactor step following transformers' Adafactor.step line by line: on the CPU as loops (f32/f64) whose
// reductions accumulate in double in a fixed order (results do not depend on the thread count); on a GPU as
// the same formulas in tensor ops.
#include "optim/adafactor.h"

#include <algorithm>
#include <cmath>

#include "optim/common.h"

namespace tr::optim {

Adafactor::Adafactor(const nn::ParamList& params, OptimizerOptions opts)
    : Optimizer(params, std::move(opts)) {
  detail::check_params("Adafactor", params, {DType::f32, DType::f64}, /*any_device=*/true);
  detail::OptimArgs args("adafactor", opts_.args);
  beta1_ = args.optional_number("beta1");
  clip_threshold_ = args.number("clip_threshold", 1.0);
  decay_rate_ = args.number("decay_rate", -0.8);
  eps1_ = args.number("eps1", 1e-30);
  eps2_ = args.number("eps2", 1e-3);
  scale_parameter_ = args.flag("scale_parameter", false);
  relative_step_ = args.flag("relative_step", false);
  warmup_init_ = args.flag("warmup_init", false);
  args.check_all_used();
  TR_CHECK(!warmup_init_ || relative_step_, "adafactor: warmup_init=true requires relative_step=true");
  TR_CHECK(clip_threshold_ > 0, "adafactor: clip_threshold must be positive, got {}", clip_threshold_);
  make_slots(params);
}

Adafactor::Adafactor(const nn::ParamList& params, OptimizerOptions opts, const LomoForm& form)
    : Optimizer(params, std::move(opts)) {
  detail::check_params(form.optimizer.c_str(), params, {DType::f32, DType::f64}, /*any_device=*/true);
  detail::OptimArgs(form.optimizer, opts_.args).check_all_used();
  opts_.weight_decay = 0;
  scale_parameter_ = true;
  lr_in_add_ = true;
  make_slots(params);
}

void Adafactor::make_slots(const nn::ParamList& params) {
  for (const auto& [name, p] : params) {
    Slot s{name, p, {}, {}, {}, {}, decays_param(name)};
    const Shape& sh = p->shape();
    if (sh.size() >= 2) {
      s.row = ops::zeros(Shape(sh.begin(), sh.end() - 1), p->dtype(), p->device());  // shape[:-1]
      Shape col(sh.begin(), sh.end() - 2);  // shape[:-2] + shape[-1:]
      col.push_back(sh.back());
      s.col = ops::zeros(col, p->dtype(), p->device());
    } else {
      s.sq = ops::zeros(sh, p->dtype(), p->device());
    }
    if (beta1_) s.exp_avg = ops::zeros(sh, p->dtype(), p->device());
    slots_.push_back(std::move(s));
  }
}

namespace {

// The sum over [0, n) of chunk(i0, i1) - the f64 sum of a chunk's terms - over 16K-element chunks, their
// partial sums added in order: the same bits on any thread count.
template <typename F>
double chunked_sum(int64_t n, F&& chunk) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 4)
  for (int64_t c = 0; c < chunks; ++c)
    part[static_cast<size_t>(c)] = chunk(c * kChunk, std::min(n, (c + 1) * kChunk));
  double total = 0;
  for (double p : part) total += p;
  return total;
}

// Sum of x[i]^2 over [0, n) in double.
template <typename T>
double sum_squares(const T* x, int64_t n) {
  return chunked_sum(n, [x](int64_t i0, int64_t i1) {
    double acc = 0;
    for (int64_t i = i0; i < i1; ++i) acc += double(x[i]) * double(x[i]);
    return acc;
  });
}

// transformers' _rms: tensor.norm(2) / numel ** 0.5, a tensor of the parameter's dtype.
template <typename T>
T rms(const T* x, int64_t n) {
  return static_cast<T>(std::sqrt(sum_squares(x, n))) / static_cast<T>(std::sqrt(static_cast<double>(n)));
}

}  // namespace

template <typename T>
void Adafactor::update(Slot& s, const Tensor& grad) {
  T* p = s.param->data<T>();
  const T* g = grad.data<T>();
  const int64_t n = s.param->numel();
  if (n == 0) return;
  const double t = static_cast<double>(step_);
  const bool big = n > (1 << 16);

  // _get_lr: the external lr, or the relative step; times max(eps2, RMS(p)) with scale_parameter. When the
  // RMS wins it is a tensor and the product is computed in T, as in Python.
  double rel = opts_.lr;
  if (relative_step_) rel = std::min(warmup_init_ ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t));
  double lr = rel;
  bool lr_is_tensor = false;
  if (scale_parameter_) {
    const T r = rms(p, n);
    if (static_cast<double>(r) > eps2_) {
      lr = static_cast<double>(r * static_cast<T>(rel));
      lr_is_tensor = true;
    } else {
      lr = eps2_ * rel;
    }
  }
  const double beta2t = 1.0 - std::pow(t, decay_rate_);
  const T b2 = static_cast<T>(beta2t), one_b2 = static_cast<T>(1.0 - beta2t), eps1 = static_cast<T>(eps1_);

  // The update u[i] = factor(i) * g[i] is never stored (it would be a tensor of the parameter's size): its
  // factors are, and it is computed twice - for its RMS, then for the step.
  std::vector<T> rf, cinv;  // factored: rsqrt(row / row mean) per row, rsqrt(col) per column
  int64_t C = 1, R = 1;
  if (s.row.defined()) {
    // grad viewed as [B, R, C]: row EMA of mean over C, column EMA of mean over R.
    C = s.param->shape().back();
    R = s.param->shape()[s.param->shape().size() - 2];
    const int64_t B = n / std::max<int64_t>(1, R * C);
    T* row = s.row.data<T>();
    T* col = s.col.data<T>();
    // exp_avg_sq_row.mul_(beta2t).add_(update.mean(dim=-1), alpha=1-beta2t), update = grad**2 + eps1
#pragma omp parallel for schedule(static) if (big)
    for (int64_t br = 0; br < B * R; ++br) {
      double acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += double(g[br * C + c] * g[br * C + c] + eps1);
      const T mean = static_cast<T>(acc / static_cast<double>(C));
      row[br] = std::fma(mean, one_b2, row[br] * b2);
    }
    // exp_avg_sq_col likewise with the mean over dim -2: each column's sum in f64 over a fixed number of row
    // chunks (by size, not by thread count), the chunks' partial sums added in order - parallel even when
    // the columns are few (a [vocab, hidden] embedding), and the same bits on any thread count.
    const int64_t chunks = std::clamp<int64_t>(R * C / (1 << 16), 1, 64);
    const int64_t rows_per = (R + chunks - 1) / chunks;
    std::vector<double> part(static_cast<size_t>(chunks * C));
    for (int64_t b = 0; b < B; ++b) {
#pragma omp parallel for schedule(static) if (big)
      for (int64_t k = 0; k < chunks; ++k) {
        double* acc = part.data() + k * C;
        std::fill(acc, acc + C, 0.0);
        for (int64_t r = k * rows_per; r < std::min(R, (k + 1) * rows_per); ++r) {
          const T* gr = g + (b * R + r) * C;
          for (int64_t c = 0; c < C; ++c) acc[c] += double(gr[c] * gr[c] + eps1);
        }
      }
#pragma omp parallel for schedule(static) if (big)
      for (int64_t c = 0; c < C; ++c) {
        double sum = 0;
        for (int64_t k = 0; k < chunks; ++k) sum += part[static_cast<size_t>(k * C + c)];
        const T mean = static_cast<T>(sum / static_cast<double>(R));
        col[b * C + c] = std::fma(mean, one_b2, col[b * C + c] * b2);
      }
    }
    // _approx_sq_grad: rsqrt(row / row.mean(-1)) (outer) rsqrt(col), then times grad.
    rf.resize(static_cast<size_t>(B * R));
    cinv.resize(static_cast<size_t>(B * C));
    for (int64_t b = 0; b < B; ++b) {
      double acc = 0;
      for (int64_t r = 0; r < R; ++r) acc += double(row[b * R + r]);
      const T row_mean = static_cast<T>(acc / static_cast<double>(R));
      for (int64_t r = 0; r < R; ++r)
        rf[static_cast<size_t>(b * R + r)] = T(1) / std::sqrt(row[b * R + r] / row_mean);
      for (int64_t c = 0; c < C; ++c) cinv[static_cast<size_t>(b * C + c)] = T(1) / std::sqrt(col[b * C + c]);
    }
  } else {
    // exp_avg_sq.mul_(beta2t).add_(grad**2 + eps1, alpha=1-beta2t); update = exp_avg_sq.rsqrt().mul_(grad)
    T* sq = s.sq.data<T>();
#pragma omp parallel for simd schedule(static) if (big)
    for (int64_t i = 0; i < n; ++i) sq[i] = std::fma(g[i] * g[i] + eps1, one_b2, sq[i] * b2);
  }
  const T* sq = s.sq.defined() ? s.sq.data<T>() : nullptr;
  // u over [i0, i1) into f(i, u): the factored form walks rows and columns (no division per element)
  const auto each_update = [&](int64_t i0, int64_t i1, auto&& f) {
    if (sq) {
      for (int64_t i = i0; i < i1; ++i) f(i, (T(1) / std::sqrt(sq[i])) * g[i]);
      return;
    }
    int64_t br = i0 / C, c = i0 % C;
    const T* cb = cinv.data() + br / R * C;
    for (int64_t i = i0; i < i1; ++i) {
      f(i, rf[static_cast<size_t>(br)] * cb[c] * g[i]);
      if (++c == C) {
        c = 0;
        if (++br % R == 0) cb += C;
      }
    }
  };
  // update.div_((_rms(update) / clip_threshold).clamp_(min=1.0)); update.mul_(lr) - the RMS summed as
  // sum_squares sums
  const double total = chunked_sum(n, [&](int64_t i0, int64_t i1) {
    double acc = 0;
    each_update(i0, i1, [&](int64_t, T u) { acc += double(u) * double(u); });
    return acc;
  });
  const T rms_upd = static_cast<T>(std::sqrt(total)) / static_cast<T>(std::sqrt(static_cast<double>(n)));
  const T denom = std::max(rms_upd / static_cast<T>(clip_threshold_), T(1));
  const T tlr = static_cast<T>(lr);
  T* m = s.exp_avg.defined() ? s.exp_avg.data<T>() : nullptr;
  const T b1 = static_cast<T>(beta1_.value_or(0.0)), one_b1 = static_cast<T>(1.0 - beta1_.value_or(0.0));
  const double wd = s.decay ? opts_.weight_decay : 0.0;
  // p.add_(p, alpha=-wd*lr): with a tensor lr the product is a tensor of T.
  const T alpha = lr_is_tensor ? static_cast<T>(-wd) * tlr : static_cast<T>(-wd * lr);
  constexpr int64_t kChunk = 1 << 14;
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (nchunks > 4)
  for (int64_t k = 0; k < nchunks; ++k) {
    each_update(k * kChunk, std::min(n, (k + 1) * kChunk), [&](int64_t i, T ui) {
      if (lr_in_add_) {  // AdaLomo: update.div_(denom); p.add_(update, alpha=-lr)
        p[i] = std::fma(ui / denom, -tlr, p[i]);
        return;
      }
      T u = ui / denom * tlr;
      if (m) u = m[i] = std::fma(u, one_b1, m[i] * b1);  // exp_avg.mul_(beta1).add_(update, 1-beta1)
      if (wd != 0) p[i] = std::fma(p[i], alpha, p[i]);
      p[i] += -u;
    });
  }
}

// transformers' Adafactor.step as tensor ops, for parameters off the CPU (the GPU runs each op as a kernel;
// the scalars - RMS, lr, the clip denominator - stay 0-d device tensors, so no host sync). Same formulas as
// update() above; reductions accumulate in f32 there, so it agrees with it to f32 rounding.
void Adafactor::update_with_ops(Slot& s, const Tensor& g) {
  using backend::BinaryOp;
  using backend::ReduceOp;
  using backend::UnaryOp;
  Tensor& p = *s.param;
  const int64_t n = p.numel();
  if (n == 0) return;
  const DType dt = p.dtype();
  const Device dev = p.device();
  auto scalar = [&](double v) { return ops::full({}, v, dt, dev); };
  auto bin = [](BinaryOp op, const Tensor& a, const Tensor& b) { return ops::binary(op, a, b); };
  auto rms = [&](const Tensor& x) {  // _rms: x.norm(2) / numel ** 0.5
    Tensor ss = ops::reduce(ReduceOp::sum, bin(BinaryOp::mul, x, x), {}, false);
    return bin(BinaryOp::div, ops::unary(UnaryOp::sqrt, ss),
               scalar(std::sqrt(static_cast<double>(x.numel()))));
  };
  const double t = static_cast<double>(step_);
  double rel = opts_.lr;
  if (relative_step_) rel = std::min(warmup_init_ ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t));
  Tensor lr = scalar(rel);
  if (scale_parameter_) lr = bin(BinaryOp::mul, bin(BinaryOp::maximum, rms(p), scalar(eps2_)), lr);
  const double beta2t = 1.0 - std::pow(t, decay_rate_);
  // ema(state, x) = state * beta2t + x * (1 - beta2t), written back into the state
  auto ema = [&](const Tensor& state, const Tensor& x) {
    ops::copy_(state, bin(BinaryOp::add, ops::affine(state, beta2t, 0.0), ops::affine(x, 1.0 - beta2t, 0.0)));
  };
  Tensor sq = ops::affine(bin(BinaryOp::mul, g, g), 1.0, eps1_);  // grad**2 + eps1
  Tensor upd;
  if (s.row.defined()) {
    const int64_t nd = p.dim();
    ema(s.row, ops::reduce(ReduceOp::mean, sq, {nd - 1}, false));
    ema(s.col, ops::reduce(ReduceOp::mean, sq, {nd - 2}, false));
    // _approx_sq_grad: rsqrt(row / row.mean(-1, keepdim)) (outer) rsqrt(col), times grad
    Tensor r = ops::unary(UnaryOp::rsqrt,
                          bin(BinaryOp::div, s.row, ops::reduce(ReduceOp::mean, s.row, {nd - 2}, true)));
    Tensor c = ops::unary(UnaryOp::rsqrt, s.col);
    upd = bin(BinaryOp::mul, bin(BinaryOp::mul, ops::unsqueeze(r, -1), ops::unsqueeze(c, -2)), g);
  } else {
    ema(s.sq, sq);
    upd = bin(BinaryOp::mul, ops::unary(UnaryOp::rsqrt, s.sq), g);
  }
  // update.div_((_rms(update) / clip_threshold).clamp_(min=1.0)); update.mul_(lr)
  Tensor denom = bin(BinaryOp::maximum, bin(BinaryOp::div, rms(upd), scalar(clip_threshold_)), scalar(1.0));
  if (lr_in_add_) {  // AdaLomo: p + (update / denom) * -lr (rounded twice here, fused on the CPU)
    ops::copy_(p,
               bin(BinaryOp::add, p,
                   bin(BinaryOp::mul, bin(BinaryOp::div, upd, denom), bin(BinaryOp::mul, lr, scalar(-1.0)))));
    return;
  }
  upd = bin(BinaryOp::mul, bin(BinaryOp::div, upd, denom), lr);
  if (s.exp_avg.defined()) {
    const double b1 = beta1_.value_or(0.0);
    ops::copy_(s.exp_avg,
               bin(BinaryOp::add, ops::affine(s.exp_avg, b1, 0.0), ops::affine(upd, 1.0 - b1, 0.0)));
    upd = s.exp_avg;
  }
  const double wd = s.decay ? opts_.weight_decay : 0.0;
  Tensor np = p;
  if (wd != 0) np = bin(BinaryOp::add, p, bin(BinaryOp::mul, p, bin(BinaryOp::mul, scalar(-wd), lr)));
  ops::copy_(p, bin(BinaryOp::sub, np, upd));
}

void Adafactor::step_params(size_t lo, size_t hi, bool advance) {
  if (advance) ++step_;
  for (size_t i = lo; i < hi; ++i) {
    Slot& s = slots_[i];
    const Tensor g = detail::gradient("Adafactor", s.name, *s.param);
    if (!g.defined()) continue;  // as transformers: parameters without a gradient are skipped
    // A meta dry run (`trainer estimate`) models the CPU, whose update below allocates its scratch outside
    // the allocator: nothing to count. (A GPU estimate would follow update_with_ops instead.)
    if (s.param->device().is_meta()) continue;
    if (tensor_ops_ || !s.param->device().is_cpu())
      update_with_ops(s, g);
    else if (s.param->dtype() == DType::f32)
      update<float>(s, g);
    else
      update<double>(s, g);
  }
}

std::vector<std::pair<std::string, Tensor>> Adafactor::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out{{"step", detail::step_tensor(step_)}};
  for (const auto& s : slots_) {
    if (s.row.defined()) {
      out.emplace_back("exp_avg_sq_row." + s.name, s.row);
      out.emplace_back("exp_avg_sq_col." + s.name, s.col);
    } else {
      out.emplace_back("exp_avg_sq." + s.name, s.sq);
    }
    if (s.exp_avg.defined()) out.emplace_back("exp_avg." + s.name, s.exp_avg);
  }
  return out;
}

void Adafactor::load_state_dict(const std::map<std::string, Tensor>& state) {
  const int64_t step = detail::load_step(state, "Adafactor");
  for (auto& s : slots_) {
    if (s.row.defined()) {
      detail::load_entry(state, "exp_avg_sq_row." + s.name, s.row, "Adafactor");
      detail::load_entry(state, "exp_avg_sq_col." + s.name, s.col, "Adafactor");
    } else {
      detail::load_entry(state, "exp_avg_sq." + s.name, s.sq, "Adafactor");
    }
    if (s.exp_avg.defined()) detail::load_entry(state, "exp_avg." + s.name, s.exp_avg, "Adafactor");
  }
  step_ = step;
}

}  // namespace tr::optim
