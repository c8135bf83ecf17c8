// The multi-tensor optimizer passes on the CPU (gradient statistics, gradient transform, AdamW): one parallel
// region over a flat work list of 64K-element chunks of every tensor, as apex's multi_tensor_apply; the
// element math is backend/optim_math.h's, shared with the CUDA kernels.
#include <algorithm>
#include <cmath>

#include "backend/cpu/code_table.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vec_math512.h"
#include "backend/adamw8bit_math.h"
#include "backend/optim_math.h"
#include "core/error.h"

namespace tr::cpu {

namespace {

struct Work {
  size_t tensor;
  int64_t begin, n;
};

template <typename Numel>
std::vector<Work> chunk_list(size_t count, Numel&& numel) {
  std::vector<Work> work;
  for (size_t i = 0; i < count; ++i) {
    const int64_t n = numel(i);
    for (int64_t b = 0; b < n; b += backend::kAdamWChunk)
      work.push_back({i, b, std::min(backend::kAdamWChunk, n - b)});
  }
  return work;
}

const double* stats_of(const backend::Backend::GradTransform& t) {
  if (t.max_norm <= 0) return nullptr;
  TR_CHECK(
      t.stats.defined() && t.stats.dtype() == DType::f64 && t.stats.numel() == 2 && t.stats.device().is_cpu(),
      "gradient transform: clipping needs the f64 [2] statistics of grad_stats on the CPU");
  return t.stats.data<double>();
}

// The work of one chunk for parameter precision T and gradient storage G.
template <typename T, typename G>
void adamw_chunk(const backend::Backend::AdamWTensors& t, int64_t begin, int64_t n,
                 const backend::AdamWScalars<T>& s, const backend::GradScaling<T>& gs) {
  T* p = t.param.data<T>() + begin;
  const G* g = t.grad.data<G>() + begin;
  T* m = t.exp_avg.data<T>() + begin;
  T* v = t.exp_avg_sq.data<T>() + begin;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    backend::adamw_element(p[i], backend::scaled_grad(static_cast<T>(static_cast<acc_t<G>>(g[i])), gs), m[i],
                           v[i], s);
  if (!t.param_copy.defined()) return;
  dispatch_float(t.param_copy.dtype(), "fused_adamw copy", [&]<typename C>() {
    C* c = t.param_copy.data<C>() + begin;
    for (int64_t i = 0; i < n; ++i) store(c, i, p[i]);
  });
}

// Half-precision parameter and moments (--torch_dtype bfloat16): torch's fused AdamW on half tensors - each
// value widened to f32, the f32 element math, each stored value rounded once - in runs of 256 elements
// through f32 buffers, so the arithmetic loop is the f32 one. Bound by memory traffic (8 bytes per element
// each way for bf16 state, against 16 for f32).
template <typename S, typename G>
void adamw_half_chunk(const backend::Backend::AdamWTensors& t, int64_t begin, int64_t n,
                      const backend::AdamWScalars<float>& s, const backend::GradScaling<float>& gs) {
  S* ps = t.param.data<S>() + begin;
  S* ms = t.exp_avg.data<S>() + begin;
  S* vs = t.exp_avg_sq.data<S>() + begin;
  const G* g = t.grad.data<G>() + begin;
  constexpr int64_t kRun = 256;
  alignas(64) float p[kRun], m[kRun], v[kRun], gr[kRun];
  for (int64_t b = 0; b < n; b += kRun) {
    const int64_t k = std::min(kRun, n - b);
    widen_run(ps + b, p, k);
    widen_run(ms + b, m, k);
    widen_run(vs + b, v, k);
    // The clipped gradient rounded to its dtype, as torch's clip_grad_norm_ writes a half gradient.
    for (int64_t i = 0; i < k; ++i)
      gr[i] = round_as<G>(backend::scaled_grad(static_cast<float>(static_cast<acc_t<G>>(g[b + i])), gs));
#pragma omp simd
    for (int64_t i = 0; i < k; ++i) backend::adamw_element(p[i], gr[i], m[i], v[i], s);
    narrow_run(p, ps + b, k);
    narrow_run(m, ms + b, k);
    narrow_run(v, vs + b, k);
  }
}

}  // namespace

void CpuBackend::grad_stats(const std::vector<Tensor>& grads, double inv_scale, const Tensor& stats) {
  TR_CHECK(stats.dtype() == DType::f64 && stats.numel() == 2 && stats.is_contiguous(),
           "grad_stats: stats must be a contiguous f64 [2] tensor");
  for (size_t i = 0; i < grads.size(); ++i)
    TR_CHECK(grads[i].is_contiguous() && is_floating(grads[i].dtype()),
             "grad_stats: gradient {} must be contiguous and floating", i);
  const auto work = chunk_list(grads.size(), [&](size_t i) { return grads[i].numel(); });
  std::vector<double> sum(work.size()), bad(work.size());
  const int64_t total = static_cast<int64_t>(work.size());
#pragma omp parallel for schedule(dynamic, 1) if (total > 1)
  for (int64_t w = 0; w < total; ++w) {
    const Tensor& g = grads[work[w].tensor];
    dispatch_float(g.dtype(), "grad_stats", [&]<typename G>() {
      using T = std::conditional_t<std::is_same_v<G, double>, double, float>;
      const G* d = g.data<G>() + work[w].begin;
      const T inv = static_cast<T>(inv_scale);
      double ss = 0, nb = 0;
#pragma omp simd reduction(+ : ss, nb)
      for (int64_t i = 0; i < work[w].n; ++i) {
        const T x = static_cast<T>(static_cast<acc_t<G>>(d[i])) * inv;
        ss += static_cast<double>(x) * x;
        nb += std::isfinite(x) ? 0.0 : 1.0;
      }
      sum[w] = ss;
      bad[w] = nb;
    });
  }
  // Added to what stats holds, in chunk order: the same bits for any thread count, and a split model's
  // per-device runs continue one sum.
  double ss = stats.data<double>()[0], nb = stats.data<double>()[1];
  for (int64_t w = 0; w < total; ++w) {
    ss += sum[w];
    nb += bad[w];
  }
  stats.data<double>()[0] = ss;
  stats.data<double>()[1] = nb;
}

void CpuBackend::transform_grads(const std::vector<std::pair<Tensor, Tensor>>& src_dst,
                                 const GradTransform& t) {
  const double* st = stats_of(t);
  for (size_t i = 0; i < src_dst.size(); ++i) {
    const auto& [src, dst] = src_dst[i];
    TR_CHECK(src.is_contiguous() && dst.is_contiguous() && src.numel() == dst.numel() &&
                 is_floating(dst.dtype()) && is_floating(src.dtype()),
             "transform_grads: pair {} must be contiguous, of one size and floating", i);
  }
  const auto work = chunk_list(src_dst.size(), [&](size_t i) { return src_dst[i].first.numel(); });
  const int64_t total = static_cast<int64_t>(work.size());
#pragma omp parallel for schedule(dynamic, 1) if (total > 1)
  for (int64_t w = 0; w < total; ++w) {
    // Named references, not a structured binding: clang before 16 cannot capture bindings in the lambdas.
    const Tensor& src = src_dst[work[w].tensor].first;
    const Tensor& dst = src_dst[work[w].tensor].second;
    dispatch_float(src.dtype(), "transform_grads", [&]<typename G>() {
      dispatch_float(dst.dtype(), "transform_grads", [&]<typename T>() {
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          const auto gs = backend::grad_scaling<T>(t.inv_scale, t.max_norm, st);
          const G* s = src.data<G>() + work[w].begin;
          T* d = dst.data<T>() + work[w].begin;
          for (int64_t i = 0; i < work[w].n; ++i)
            d[i] = backend::scaled_grad(static_cast<T>(static_cast<acc_t<G>>(s[i])), gs);
        } else {  // half weights' gradients transformed in place: f32 math, one rounding (torch's
                  // clip_grad_norm_)
          const auto gs = backend::grad_scaling<float>(t.inv_scale, t.max_norm, st);
          const G* s = src.data<G>() + work[w].begin;
          T* d = dst.data<T>() + work[w].begin;
          for (int64_t i = 0; i < work[w].n; ++i)
            store(d, i, backend::scaled_grad(static_cast<float>(static_cast<acc_t<G>>(s[i])), gs));
        }
      });
    });
  }
}

namespace {

// body(begin, end) over [0, n) in 64K-element chunks across the threads (one chunk: no parallel region). The
// element-wise optimizers' loop: each element's update reads only that element, so any split gives one
// result.
template <typename F>
void for_chunks(int64_t n, const F& body) {
  constexpr int64_t kChunk = backend::kAdamWChunk;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t k = 0; k < chunks; ++k) body(k * kChunk, std::min(n, (k + 1) * kChunk));
}

// One tensor's SGD step (bound by memory bandwidth: 3-4 streams).
template <typename T>
void sgd_tensor(const backend::Backend::SgdTensors& x, const backend::Backend::SgdHyper& h) {
  const backend::SgdScalars<T> c(h.lr, x.weight_decay, h.momentum, h.dampening, h.nesterov, x.first);
  T* p = x.param.data<T>();
  const T* g = x.grad.data<T>();
  T* buf = x.momentum_buffer.defined() ? x.momentum_buffer.data<T>() : nullptr;
  for_chunks(x.param.numel(), [&](int64_t begin, int64_t end) {
    if (buf != nullptr) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) backend::sgd_element(p[i], g[i], buf + i, c);
    } else {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) backend::sgd_element(p[i], g[i], static_cast<T*>(nullptr), c);
    }
  });
}

}  // namespace

namespace {

// Element i of an f32 / bf16 / f16 tensor's data as f32, and x stored there rounded to nearest even.
float load_any(const void* d, DType dt, int64_t i) {
  if (dt == DType::bf16) return to_f32(static_cast<const BFloat16*>(d)[i]);
  if (dt == DType::f16) return to_f32(static_cast<const Half*>(d)[i]);
  return static_cast<const float*>(d)[i];
}
void store_any(void* d, DType dt, int64_t i, float x) {
  if (dt == DType::bf16)
    static_cast<BFloat16*>(d)[i] = from_f32<BFloat16>(x);
  else if (dt == DType::f16)
    static_cast<Half*>(d)[i] = from_f32<Half>(x);
  else
    static_cast<float*>(d)[i] = x;
}
float round_any(float x, DType dt) {
  return dt == DType::bf16 ? round_as<BFloat16>(x) : dt == DType::f16 ? round_as<Half>(x) : x;
}

}  // namespace

// One element at a time with the dtypes read per tensor: every op of torchdistx's step rounds to its output's
// dtype. Bound by memory traffic (a few bytes per element and state), not worth a kernel per dtype mix.
void CpuBackend::anyprecision_adamw(const std::vector<AnyPrecisionTensors>& tensors,
                                    const AnyPrecisionHyper& h) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& x = tensors[i];
    const int64_t n = x.param.numel();
    for (const Tensor* t : {&x.param, &x.grad, &x.exp_avg, &x.exp_avg_sq, &x.compensation})
      TR_CHECK(
          (t == &x.compensation && !t->defined()) ||
              (t->numel() == n && t->is_contiguous() && (t->dtype() == DType::f32 || is_half(t->dtype()))),
          "anyprecision_adamw: tensor {} needs contiguous f32/bf16/f16 state of its parameter's size", i);
  }
  const backend::AnyPrecisionScalars with(h.lr, h.weight_decay, h.beta1, h.beta2, h.eps, h.step),
      without(h.lr, 0.0, h.beta1, h.beta2, h.eps, h.step);
  const auto work = chunk_list(tensors.size(), [&](size_t i) { return tensors[i].param.numel(); });
  const int64_t total = static_cast<int64_t>(work.size());
#pragma omp parallel for schedule(dynamic, 1) if (total > 1)
  for (int64_t w = 0; w < total; ++w) {
    const auto& x = tensors[work[w].tensor];
    const DType dt[4] = {x.param.dtype(), x.exp_avg.dtype(), x.exp_avg_sq.dtype(),
                         x.compensation.defined() ? x.compensation.dtype() : DType::f32};
    const auto round = [&](float v, int k) { return round_any(v, dt[k]); };
    const bool kahan = x.compensation.defined();
    dispatch_float(x.grad.dtype(), "anyprecision_adamw", [&]<typename G>() {
      const G* grad = x.grad.data<G>();
      for (int64_t i = work[w].begin; i < work[w].begin + work[w].n; ++i) {
        float p = load_any(x.param.data_ptr(), dt[0], i), m = load_any(x.exp_avg.data_ptr(), dt[1], i),
              v = load_any(x.exp_avg_sq.data_ptr(), dt[2], i);
        float c = kahan ? load_any(x.compensation.data_ptr(), dt[3], i) : 0.0f;
        const float g = static_cast<float>(static_cast<acc_t<G>>(grad[i]));
        backend::anyprecision_element(p, g, m, v, kahan ? &c : nullptr, x.decay ? with : without, round);
        store_any(x.param.data_ptr(), dt[0], i, p);
        store_any(x.exp_avg.data_ptr(), dt[1], i, m);
        store_any(x.exp_avg_sq.data_ptr(), dt[2], i, v);
        if (kahan) store_any(x.compensation.data_ptr(), dt[3], i, c);
      }
    });
  }
}

void CpuBackend::sgd(const std::vector<SgdTensors>& tensors, const SgdHyper& h) {
  for (const auto& x : tensors) {
    const int64_t n = x.param.numel();
    TR_CHECK((x.param.dtype() == DType::f32 || x.param.dtype() == DType::f64) && x.param.is_contiguous() &&
                 x.grad.dtype() == x.param.dtype() && x.grad.numel() == n && x.grad.is_contiguous() &&
                 (!x.momentum_buffer.defined() ||
                  (x.momentum_buffer.dtype() == x.param.dtype() && x.momentum_buffer.numel() == n &&
                   x.momentum_buffer.is_contiguous())),
             "sgd: {} needs a contiguous f32/f64 gradient and momentum buffer of its dtype and size",
             x.param.describe());
    if (x.param.dtype() == DType::f32)
      sgd_tensor<float>(x, h);
    else
      sgd_tensor<double>(x, h);
  }
}

namespace {

// One tensor's step under rule R (bound by memory bandwidth: four or five streams).
template <backend::ElementwiseRule R, typename T>
void elementwise_tensor(const backend::Backend::ElementwiseTensors& x, const backend::ElementwiseHyper& h) {
  const backend::ElementwiseScalars<T> c(h, x.weight_decay);
  T* p = x.param.data<T>();
  const T* g = x.grad.defined() ? x.grad.data<T>() : p;  // (the rules that read none)
  T* s1 = x.state1.data<T>();
  T* s2 = x.state2.defined() ? x.state2.data<T>() : nullptr;
  for_chunks(x.param.numel(), [&](int64_t begin, int64_t end) {
    if (s2 != nullptr) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) backend::elementwise_update<R>(p[i], g[i], s1[i], s2 + i, c);
    } else {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i)
        backend::elementwise_update<R>(p[i], g[i], s1[i], static_cast<T*>(nullptr), c);
    }
  });
}

template <typename T>
void elementwise_dispatch(const backend::Backend::ElementwiseTensors& x, const backend::ElementwiseHyper& h) {
  using backend::ElementwiseRule;
  switch (h.rule) {
    case ElementwiseRule::adagrad: return elementwise_tensor<ElementwiseRule::adagrad, T>(x, h);
    case ElementwiseRule::rmsprop: return elementwise_tensor<ElementwiseRule::rmsprop, T>(x, h);
    case ElementwiseRule::lion: return elementwise_tensor<ElementwiseRule::lion, T>(x, h);
    case ElementwiseRule::rmsprop_bnb: return elementwise_tensor<ElementwiseRule::rmsprop_bnb, T>(x, h);
    case ElementwiseRule::schedule_free_adam:
      return elementwise_tensor<ElementwiseRule::schedule_free_adam, T>(x, h);
    case ElementwiseRule::schedule_free_sgd:
      return elementwise_tensor<ElementwiseRule::schedule_free_sgd, T>(x, h);
    case ElementwiseRule::schedule_free_lerp:
      return elementwise_tensor<ElementwiseRule::schedule_free_lerp, T>(x, h);
    case ElementwiseRule::stable_adamw_moments:
      return elementwise_tensor<ElementwiseRule::stable_adamw_moments, T>(x, h);
    case ElementwiseRule::stable_adamw_param:
      return elementwise_tensor<ElementwiseRule::stable_adamw_param, T>(x, h);
    case ElementwiseRule::galore_adamw: return elementwise_tensor<ElementwiseRule::galore_adamw, T>(x, h);
    case ElementwiseRule::grok_ema: return elementwise_tensor<ElementwiseRule::grok_ema, T>(x, h);
    case ElementwiseRule::grokadamw: return elementwise_tensor<ElementwiseRule::grokadamw, T>(x, h);
  }
}

}  // namespace

void CpuBackend::elementwise_step(const std::vector<ElementwiseTensors>& tensors, const ElementwiseHyper& h) {
  for (const auto& x : tensors) {
    const int64_t n = x.param.numel();
    const auto same = [&](const Tensor& t) {
      return t.dtype() == x.param.dtype() && t.numel() == n && t.is_contiguous();
    };
    const bool needs_grad = backend::reads_gradient(h.rule);
    const bool needs_state2 = backend::needs_state2(h.rule);
    TR_CHECK((x.param.dtype() == DType::f32 || x.param.dtype() == DType::f64) && x.param.is_contiguous() &&
                 (needs_grad ? same(x.grad) : !x.grad.defined() || same(x.grad)) && same(x.state1) &&
                 (!x.state2.defined() || same(x.state2)) && (!needs_state2 || x.state2.defined()),
             "elementwise_step: {} needs a contiguous f32/f64 gradient and state of its dtype and size",
             x.param.describe());
    if (x.param.dtype() == DType::f32)
      elementwise_dispatch<float>(x, h);
    else
      elementwise_dispatch<double>(x, h);
  }
}

namespace {

// One block of up to 256 elements in the order of bitsandbytes' one-state kernel: states, absmax, parameters,
// codes.
template <backend::ElementwiseRule R>
void state8bit_block(float* p, const float* g, uint8_t* c1, float& absmax1, int64_t n,
                     const backend::ElementwiseScalars<float>& cref, const CodeTable& ts) {
  const backend::ElementwiseScalars<float> c = cref;  // local: the loops vectorize
  const float* qs = ts.code().data();
  const float a1 = absmax1;
  float s1[backend::kAdam8bitBlock], upd[backend::kAdam8bitBlock];
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    s1[j] = qs[c1[j]] * a1;
    upd[j] = 0.0f;
    backend::state8bit_update<R>(p[j], g[j], s1[j], upd[j], c);
  }
  float max1 = 0.0f;
  for (int64_t j = 0; j < n; ++j) max1 = backend::fmax_f32(max1, backend::abs_f32(s1[j]));
  absmax1 = max1;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) backend::state8bit_param<R>(p[j], g[j], s1[j], upd[j], c);
  for (int64_t j = 0; j < n; ++j) c1[j] = backend::signed_code_by(ts, s1[j], max1, qs);
}

template <backend::ElementwiseRule R>
void state8bit_tensor(const backend::Backend::Elementwise8bitTensors& x, const backend::ElementwiseHyper& h,
                      const CodeTable& ts) {
  const backend::ElementwiseScalars<float> c(h, x.weight_decay);
  float* p = x.param.data<float>();
  const float* g = x.grad.data<float>();
  uint8_t* c1 = x.state1.data<uint8_t>();
  float* a1 = x.absmax1.data<float>();
  const int64_t n = x.param.numel(), blocks = x.absmax1.numel(), kb = backend::kAdam8bitBlock;
#pragma omp parallel for schedule(static) if (blocks > 64)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t o = b * kb;
    state8bit_block<R>(p + o, g + o, c1 + o, a1[b], std::min(kb, n - o), c, ts);
  }
}

}  // namespace

void CpuBackend::elementwise_8bit(const std::vector<Elementwise8bitTensors>& tensors,
                                  const ElementwiseHyper& h, const Tensor& signed_map) {
  TR_CHECK(signed_map.numel() == 256 && signed_map.dtype() == DType::f32,
           "elementwise_8bit: the code map must be f32 [256]");
  TR_CHECK(h.rule == backend::ElementwiseRule::lion || h.rule == backend::ElementwiseRule::rmsprop_bnb,
           "elementwise_8bit: only Lion and bitsandbytes' RMSprop keep 8-bit state");
  for (const auto& x : tensors) {
    const int64_t n = x.param.numel(), blocks = (n + backend::kAdam8bitBlock - 1) / backend::kAdam8bitBlock;
    TR_CHECK(x.param.dtype() == DType::f32 && x.grad.dtype() == DType::f32 && x.grad.numel() == n &&
                 x.param.is_contiguous() && x.grad.is_contiguous() && x.state1.dtype() == DType::u8 &&
                 x.state1.numel() == n && x.absmax1.dtype() == DType::f32 && x.absmax1.numel() == blocks,
             "elementwise_8bit: {} needs an f32 gradient, u8 codes of its size and f32 absmax per 256",
             x.param.describe());
    const CodeTable& ts = code_tables_.of(signed_map.data<float>());
    if (h.rule == backend::ElementwiseRule::lion)
      state8bit_tensor<backend::ElementwiseRule::lion>(x, h, ts);
    else
      state8bit_tensor<backend::ElementwiseRule::rmsprop_bnb>(x, h, ts);
  }
}

void CpuBackend::fused_adamw(const std::vector<AdamWTensors>& tensors, const AdamWHyper& h,
                             const GradTransform& t) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& x = tensors[i];
    TR_CHECK(is_floating(x.param.dtype()), "fused_adamw: dtype {}", dtype_name(x.param.dtype()));
    TR_CHECK(!is_half(x.param.dtype()) || !x.param_copy.defined(),
             "fused_adamw: half parameter {} is the model's weight itself: no copy to write", i);
    for (const Tensor* y : {&x.exp_avg, &x.exp_avg_sq})
      TR_CHECK(y->dtype() == x.param.dtype() && y->numel() == x.param.numel() && y->is_contiguous(),
               "fused_adamw: state of tensor {} does not match its parameter", i);
    TR_CHECK(is_floating(x.grad.dtype()) && x.grad.numel() == x.param.numel() && x.grad.is_contiguous(),
             "fused_adamw: gradient {} does not match its parameter", i);
    TR_CHECK(!x.param_copy.defined() || (x.param_copy.numel() == x.param.numel() &&
                                         x.param_copy.is_contiguous() && is_floating(x.param_copy.dtype())),
             "fused_adamw: weight copy {} does not match its parameter", i);
  }
  const double* st = stats_of(t);
  const auto work = chunk_list(tensors.size(), [&](size_t i) { return tensors[i].param.numel(); });
  const backend::AdamWScalars<float> fd(h.lr, h.weight_decay, h.beta1, h.beta2, h.eps, h.step),
      fp(h.lr, 0.0, h.beta1, h.beta2, h.eps, h.step);
  const backend::AdamWScalars<double> dd(h.lr, h.weight_decay, h.beta1, h.beta2, h.eps, h.step),
      dp(h.lr, 0.0, h.beta1, h.beta2, h.eps, h.step);
  const auto gf = backend::grad_scaling<float>(t.inv_scale, t.max_norm, st);
  const auto gd = backend::grad_scaling<double>(t.inv_scale, t.max_norm, st);
  const int64_t total = static_cast<int64_t>(work.size());
#pragma omp parallel for schedule(dynamic, 1) if (total > 1)  // one chunk: no parallel region
  for (int64_t w = 0; w < total; ++w) {
    const auto& x = tensors[work[w].tensor];
    dispatch_float(x.grad.dtype(), "fused_adamw", [&]<typename G>() {
      if (x.param.dtype() == DType::f32)
        adamw_chunk<float, G>(x, work[w].begin, work[w].n, x.decay ? fd : fp, gf);
      else if (x.param.dtype() == DType::bf16)
        adamw_half_chunk<BFloat16, G>(x, work[w].begin, work[w].n, x.decay ? fd : fp, gf);
      else if (x.param.dtype() == DType::f16)
        adamw_half_chunk<Half, G>(x, work[w].begin, work[w].n, x.decay ? fd : fp, gf);
      else
        adamw_chunk<double, G>(x, work[w].begin, work[w].n, x.decay ? dd : dp, gd);
    });
  }
}

namespace {

void check_8bit(const backend::Backend::AdamW8bitTensors& x, size_t i) {
  const int64_t n = x.param.numel();
  TR_CHECK(x.param.dtype() == DType::f32 && x.grad.dtype() == DType::f32 && x.grad.numel() == n &&
               x.param.is_contiguous() && x.grad.is_contiguous(),
           "adamw_8bit: tensor {} needs a contiguous f32 parameter and gradient of one size", i);
  std::vector<const Tensor*> states{&x.state1, &x.state2};
  if (x.k.ademamix) states.push_back(&x.state3);
  const int64_t blocks = (n + backend::kAdam8bitBlock - 1) / backend::kAdam8bitBlock;
  for (const Tensor* s : states) {
    const Tensor* absmax = s == &x.state1 ? &x.absmax1 : s == &x.state2 ? &x.absmax2 : &x.absmax3;
    TR_CHECK(s->defined() && s->dtype() == (x.eight_bit ? DType::u8 : DType::f32) && s->numel() == n &&
                 s->is_contiguous() &&
                 (!x.eight_bit || (absmax->defined() && absmax->numel() == blocks &&
                                   absmax->dtype() == DType::f32 && absmax->is_contiguous())),
             "adamw_8bit: the {}-bit state of tensor {} does not fit its {} elements", x.eight_bit ? 8 : 32,
             i, n);
  }
}

// One block of up to 256 elements, in the order of bitsandbytes' kernel; the codes from the maps' tables.
// c3/absmax3: AdEMAMix's slow EMA (null for AdamW).
struct Block8bit {
  float* p;
  const float* g;
  uint8_t *c1, *c2, *c3;
  float *absmax1, *absmax2, *absmax3;
  int64_t n;
};

// The largest |s[j]| (0 for none; a NaN loses, as fmax).
float block_absmax(const float* s, int64_t n) {
  float m = 0.0f;
  for (int64_t j = 0; j < n; ++j) m = backend::fmax_f32(m, backend::abs_f32(s[j]));
  return m;
}

void update_block(const Block8bit& b, const backend::Adam8bitConsts& kref, const CodeTable& ts,
                  const CodeTable& tu) {
  const backend::Adam8bitConsts k = kref;  // local: no store in the loops may change it (they vectorize)
  const float *qs = ts.code().data(), *qu = tu.code().data();
  const float a1 = *b.absmax1, a2 = *b.absmax2, a3 = k.ademamix ? *b.absmax3 : 0.0f;
  float s1[backend::kAdam8bitBlock], s2[backend::kAdam8bitBlock], s3[backend::kAdam8bitBlock];
#pragma omp simd
  for (int64_t j = 0; j < b.n; ++j)
    backend::adam8bit_moments(b.g[j], b.c1[j], b.c2[j], a1, a2, qs, qu, k, s1[j], s2[j]);
  const float max1 = block_absmax(s1, b.n), max2 = block_absmax(s2, b.n);
  float max3 = 0.0f;
  if (k.ademamix) {
#pragma omp simd
    for (int64_t j = 0; j < b.n; ++j) s3[j] = backend::ademamix8bit_m2(b.g[j], b.c3[j], a3, qs, k);
    max3 = block_absmax(s3, b.n);
    *b.absmax3 = max3;
  } else {
    std::fill(s3, s3 + b.n, 0.0f);
  }
  *b.absmax1 = max1;
  *b.absmax2 = max2;
#pragma omp simd
  for (int64_t j = 0; j < b.n; ++j) backend::adam8bit_param(b.p[j], b.g[j], s1[j], s2[j], s3[j], k);
  const float div2 = max2 > 0 ? max2 : 1.0f;  // (adam8bit_codes' divisor)
  for (int64_t j = 0; j < b.n; ++j) {
    b.c1[j] = backend::signed_code_by(ts, s1[j], max1, qs);
    b.c2[j] = tu(s2[j] / div2);
  }
  if (k.ademamix)
    for (int64_t j = 0; j < b.n; ++j) b.c3[j] = backend::signed_code_by(ts, s3[j], max3, qs);
}

void update_32bit(const backend::Backend::AdamW8bitTensors& x) {
  float* p = x.param.data<float>();
  const float* g = x.grad.data<float>();
  float* s1 = x.state1.data<float>();
  float* s2 = x.state2.data<float>();
  const int64_t n = x.param.numel();
  float* s3 = x.k.ademamix ? x.state3.data<float>() : nullptr;
  for_chunks(n, [&](int64_t begin, int64_t end) {
    const backend::Adam8bitConsts k =
        x.k;  // a local copy: no store in the loop may change it (it vectorizes)
    if (s3 != nullptr) {
#pragma omp simd
      for (int64_t j = begin; j < end; ++j) backend::ademamix32_element(p[j], g[j], s1[j], s2[j], s3[j], k);
    } else {
#pragma omp simd
      for (int64_t j = begin; j < end; ++j) backend::adam32_element(p[j], g[j], s1[j], s2[j], k);
    }
  });
}

}  // namespace

void CpuBackend::adamw_8bit(const std::vector<AdamW8bitTensors>& tensors, const Tensor& signed_map,
                            const Tensor& unsigned_map) {
  TR_CHECK(signed_map.numel() == 256 && unsigned_map.numel() == 256 && signed_map.dtype() == DType::f32 &&
               unsigned_map.dtype() == DType::f32,
           "adamw_8bit: the code maps must be f32 [256]");
  const CodeTable& ts = code_tables_.of(signed_map.data<float>());
  const CodeTable& tu = code_tables_.of(unsigned_map.data<float>());
  for (size_t i = 0; i < tensors.size(); ++i) check_8bit(tensors[i], i);
  for (const auto& x : tensors) {
    if (!x.eight_bit) {
      update_32bit(x);
      continue;
    }
    const int64_t n = x.param.numel(), blocks = x.absmax1.numel(), kb = backend::kAdam8bitBlock;
    const bool three = x.k.ademamix;
    const Block8bit t{x.param.data<float>(),
                      x.grad.data<float>(),
                      x.state1.data<uint8_t>(),
                      x.state2.data<uint8_t>(),
                      three ? x.state3.data<uint8_t>() : nullptr,
                      x.absmax1.data<float>(),
                      x.absmax2.data<float>(),
                      three ? x.absmax3.data<float>() : nullptr,
                      n};
#pragma omp parallel for schedule(static) if (blocks > 64)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t o = b * kb;
      update_block({t.p + o, t.g + o, t.c1 + o, t.c2 + o, three ? t.c3 + o : nullptr, t.absmax1 + b,
                    t.absmax2 + b, three ? t.absmax3 + b : nullptr, std::min(kb, n - o)},
                   x.k, ts, tu);
    }
  }
}

}  // namespace tr::cpu
