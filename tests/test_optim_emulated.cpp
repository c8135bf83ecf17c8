// The CUDA optimizer kernels' own source (backend/cuda/optim_kernels.cuh) run on the CPU through
// tests/cuda_emulator.h against the CPU backend, bit for bit: fused multi-tensor AdamW (f32 parameters,
// bf16 / f16 / f32 gradients through the loss-scale inverse and the clip, with and without weight decay, the
// bf16 weight copy, a tensor longer than one 64K chunk), the gradient transform, bitsandbytes' blockwise
// 8-bit AdamW (a partial last block, three steps, NaN-free and with an infinite gradient) and its 32-bit
// small-tensor path, SGD with momentum, dampening and Nesterov, the element-wise rules (Adagrad, RMSprop,
// Lion, bitsandbytes' RMSprop) and bitsandbytes' one-state 8-bit kernel (Lion, RMSprop); the gradient
// statistics within f64 rounding (their sums run in another order); half weights' AdamW (bf16 / f16
// parameters and moments) and in-place half gradient transform; torchdistx's AnyPrecisionAdamW over mixed
// dtypes. Compiled without contracting
// multiply-adds, as optim.cu and the CPU's optimizers. The GPU runs them in the CUDA parity tests
// (OptimDevice.*, CudaOptim.*).
#include "cuda_emulator.h"  // first: the CUDA built-ins the kernels' header expects

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/optim_kernels.cuh"
#include "ops/ops.h"
#include "optim/adamw_8bit.h"

namespace tr {
namespace {

namespace ok = cuda::opt_emulated;
using BE = backend::Backend;

backend::Backend& cpu() { return backend::backend_for(Device::cpu()); }

Tensor draw(const Shape& s, Generator& gen, DType dt, double scale = 1.0) {
  return ops::to_dtype(ops::affine(ops::randn(s, gen), scale, 0.0), dt);
}
Tensor copy_of(const Tensor& t) { return ops::contiguous(ops::clone(t)); }
bool same(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// The backend's chunking: 64K-element stretches of every tensor, one block each.
std::vector<cuda::GradChunk> grad_chunks(const std::vector<std::pair<Tensor, Tensor>>& src_dst) {
  std::vector<cuda::GradChunk> chunks;
  for (const auto& [g, d] : src_dst)
    for (int64_t b = 0; b < g.numel(); b += backend::kAdamWChunk)
      chunks.push_back(
          {static_cast<const char*>(g.data_ptr()) + b * static_cast<int64_t>(dtype_size(g.dtype())),
           d.defined() ? static_cast<char*>(d.data_ptr()) + b * static_cast<int64_t>(dtype_size(d.dtype()))
                       : nullptr,
           std::min(backend::kAdamWChunk, g.numel() - b), g.dtype(), d.defined() ? d.dtype() : DType::f32});
  return chunks;
}

TEST(OptimEmulated, FusedAdamWGivesTheCpuBits) {
  Generator gen(21);
  struct Case {
    int64_t n;
    DType grad;
    bool decay, copy;
  };
  const Case cases[] = {{1000, DType::bf16, true, true},
                        {37, DType::f32, false, false},
                        {70000, DType::f16, true, false}};  // the last one: two chunks
  std::vector<BE::AdamWTensors> on_cpu, emulated;
  for (const Case& c : cases) {
    const Tensor p = draw({c.n}, gen, DType::f32), g = draw({c.n}, gen, c.grad, 0.1);
    const Tensor m = draw({c.n}, gen, DType::f32, 0.01),
                 v = ops::affine(ops::binary(ops::BinaryOp::mul, m, m), 1.0, 1e-6);
    const Tensor copy = c.copy ? ops::empty({c.n}, DType::bf16) : Tensor();
    on_cpu.push_back({p, g, m, copy_of(v), c.decay, copy});
    emulated.push_back(
        {copy_of(p), g, copy_of(m), copy_of(v), c.decay, c.copy ? ops::empty({c.n}, DType::bf16) : Tensor()});
  }
  BE::AdamWHyper h;
  h.lr = 3e-3, h.weight_decay = 0.1, h.step = 7;
  for (const double max_norm : {0.0, 0.5}) {  // without and with clipping (the norm of these gradients > 0.5)
    SCOPED_TRACE(fmt::format("max_norm {}", max_norm));
    std::vector<Tensor> grads;
    for (const auto& x : on_cpu) grads.push_back(x.grad);
    const Tensor stats = ops::zeros({2}, DType::f64);
    cpu().grad_stats(grads, 0.5, stats);
    const BE::GradTransform t{0.5, max_norm, stats};
    cpu().fused_adamw(on_cpu, h, t);

    std::vector<cuda::AdamWChunk> chunks;
    for (const auto& x : emulated)
      for (int64_t b = 0; b < x.param.numel(); b += backend::kAdamWChunk) {
        const int64_t gs = static_cast<int64_t>(dtype_size(x.grad.dtype()));
        chunks.push_back(
            {x.param.data<float>() + b, static_cast<const char*>(x.grad.data_ptr()) + b * gs,
             x.exp_avg.data<float>() + b, x.exp_avg_sq.data<float>() + b,
             x.param_copy.defined() ? static_cast<char*>(x.param_copy.data_ptr()) + 2 * b : nullptr,
             std::min(backend::kAdamWChunk, x.param.numel() - b), x.decay ? 1 : 0, x.grad.dtype(),
             x.param_copy.defined() ? x.param_copy.dtype() : DType::f32});
      }
    const backend::AdamWScalars<float> sd(h.lr, h.weight_decay, h.beta1, h.beta2, h.eps, h.step),
        sp(h.lr, 0.0, h.beta1, h.beta2, h.eps, h.step);
    const double* st = max_norm > 0 ? stats.data<double>() : nullptr;
    emu::launch(static_cast<unsigned>(chunks.size()), 128, 0,
                [&] { ok::fused_adamw_kernel<float>(chunks.data(), sd, sp, 0.5, max_norm, st); });
    for (size_t i = 0; i < on_cpu.size(); ++i) {
      EXPECT_TRUE(same(emulated[i].param, on_cpu[i].param)) << "param " << i;
      EXPECT_TRUE(same(emulated[i].exp_avg, on_cpu[i].exp_avg)) << "exp_avg " << i;
      EXPECT_TRUE(same(emulated[i].exp_avg_sq, on_cpu[i].exp_avg_sq)) << "exp_avg_sq " << i;
      if (on_cpu[i].param_copy.defined()) {
        EXPECT_TRUE(same(emulated[i].param_copy, on_cpu[i].param_copy)) << "copy " << i;
      }
    }
    ++h.step;
  }
}

// Half-precision weights (--torch_dtype bfloat16): bf16 / f16 parameters and moments, gradients of their
// dtype clipped and rounded, then torch's fused rule for half tensors; and the in-place half transform.
TEST(OptimEmulated, HalfWeightsAdamWAndTransformGiveTheCpuBits) {
  Generator gen(23);
  for (const DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    std::vector<BE::AdamWTensors> on_cpu, emulated;
    for (const int64_t n : {int64_t{300}, int64_t{70000}}) {  // the second: two chunks
      const Tensor p = draw({n}, gen, dt), g = draw({n}, gen, dt, 0.1), m = draw({n}, gen, dt, 0.01);
      const Tensor v = ops::to_dtype(ops::affine(ops::binary(ops::BinaryOp::mul, m, m), 1.0, 1e-6), dt);
      on_cpu.push_back({p, g, m, v, n == 300, Tensor()});
      emulated.push_back({copy_of(p), g, copy_of(m), copy_of(v), n == 300, Tensor()});
    }
    BE::AdamWHyper h;
    h.lr = 3e-3, h.weight_decay = 0.1, h.step = 3;
    std::vector<Tensor> grads;
    for (const auto& x : on_cpu) grads.push_back(x.grad);
    const Tensor stats = ops::zeros({2}, DType::f64);
    cpu().grad_stats(grads, 1.0, stats);
    cpu().fused_adamw(on_cpu, h, {1.0, 0.5, stats});
    std::vector<cuda::AdamWChunk> chunks;
    const int64_t es = static_cast<int64_t>(dtype_size(dt));
    for (const auto& x : emulated)
      for (int64_t b = 0; b < x.param.numel(); b += backend::kAdamWChunk)
        chunks.push_back({static_cast<char*>(x.param.data_ptr()) + b * es,
                          static_cast<const char*>(x.grad.data_ptr()) + b * es,
                          static_cast<char*>(x.exp_avg.data_ptr()) + b * es,
                          static_cast<char*>(x.exp_avg_sq.data_ptr()) + b * es, nullptr,
                          std::min(backend::kAdamWChunk, x.param.numel() - b), x.decay ? 1 : 0, dt, dt});
    const backend::AdamWScalars<float> sd(h.lr, h.weight_decay, h.beta1, h.beta2, h.eps, h.step),
        sp(h.lr, 0.0, h.beta1, h.beta2, h.eps, h.step);
    emu::launch(static_cast<unsigned>(chunks.size()), 128, 0, [&] {
      ok::fused_adamw_half_kernel(chunks.data(), dt, sd, sp, 1.0, 0.5, stats.data<double>());
    });
    for (size_t i = 0; i < on_cpu.size(); ++i) {
      EXPECT_TRUE(same(emulated[i].param, on_cpu[i].param)) << "param " << i;
      EXPECT_TRUE(same(emulated[i].exp_avg, on_cpu[i].exp_avg)) << "exp_avg " << i;
      EXPECT_TRUE(same(emulated[i].exp_avg_sq, on_cpu[i].exp_avg_sq)) << "exp_avg_sq " << i;
    }
    // The gradients clipped in place.
    const Tensor g_cpu = copy_of(grads[1]), g_emu = copy_of(grads[1]);
    cpu().transform_grads({{g_cpu, g_cpu}}, {1.0, 0.5, stats});
    const std::vector<cuda::GradChunk> tc = grad_chunks({{g_emu, g_emu}});
    emu::launch(static_cast<unsigned>(tc.size()), 128, 0,
                [&] { ok::transform_half_kernel(tc.data(), 1.0, 0.5, stats.data<double>()); });
    EXPECT_TRUE(same(g_cpu, g_emu));
    EXPECT_FALSE(same(g_cpu, grads[1]));
  }
}

// torchdistx's AnyPrecisionAdamW: f32 and bf16 weights, f32 / bf16 / f16 moments, with and without the Kahan
// buffer, a tensor of two chunks, with and without decay.
TEST(OptimEmulated, AnyPrecisionAdamWGivesTheCpuBits) {
  Generator gen(29);
  struct Case {
    int64_t n;
    DType p, m, v, c;  // c f64: no Kahan buffer
    bool decay;
  };
  const Case cases[] = {{300, DType::f32, DType::f32, DType::f32, DType::f64, true},
                        {70000, DType::bf16, DType::bf16, DType::bf16, DType::bf16, true},
                        {513, DType::bf16, DType::f32, DType::bf16, DType::f64, false},
                        {257, DType::f32, DType::f16, DType::f32, DType::bf16, true}};
  std::vector<BE::AnyPrecisionTensors> on_cpu, emulated;
  for (const Case& c : cases) {
    const Tensor p = draw({c.n}, gen, c.p), g = draw({c.n}, gen, c.p, 0.1), m = draw({c.n}, gen, c.m, 0.01);
    const Tensor v = ops::to_dtype(ops::affine(ops::binary(ops::BinaryOp::mul, m, m), 1.0, 1e-6), c.v);
    const Tensor k = c.c == DType::f64 ? Tensor() : draw({c.n}, gen, c.c, 1e-3);
    on_cpu.push_back({p, g, m, v, k, c.decay});
    emulated.push_back({copy_of(p), g, copy_of(m), copy_of(v), k.defined() ? copy_of(k) : Tensor(), c.decay});
  }
  BE::AnyPrecisionHyper h;
  h.lr = 1e-2, h.weight_decay = 0.1, h.step = 4;
  cpu().anyprecision_adamw(on_cpu, h);
  std::vector<cuda::AnyPrecisionChunk> chunks;
  const auto at = [](const Tensor& t, int64_t b) {
    return t.defined() ? static_cast<char*>(t.data_ptr()) + b * static_cast<int64_t>(dtype_size(t.dtype()))
                       : nullptr;
  };
  for (const auto& x : emulated)
    for (int64_t b = 0; b < x.param.numel(); b += backend::kAdamWChunk)
      chunks.push_back({at(x.param, b), at(x.grad, b), at(x.exp_avg, b), at(x.exp_avg_sq, b),
                        at(x.compensation, b), std::min(backend::kAdamWChunk, x.param.numel() - b),
                        x.decay ? 1 : 0, x.param.dtype(), x.grad.dtype(), x.exp_avg.dtype(),
                        x.exp_avg_sq.dtype(),
                        x.compensation.defined() ? x.compensation.dtype() : DType::f32});
  const backend::AnyPrecisionScalars sd(h.lr, h.weight_decay, h.beta1, h.beta2, h.eps, h.step),
      sp(h.lr, 0.0, h.beta1, h.beta2, h.eps, h.step);
  emu::launch(static_cast<unsigned>(chunks.size()), 128, 0,
              [&] { ok::anyprecision_kernel(chunks.data(), sd, sp); });
  for (size_t i = 0; i < on_cpu.size(); ++i) {
    EXPECT_TRUE(same(emulated[i].param, on_cpu[i].param)) << "param " << i;
    EXPECT_TRUE(same(emulated[i].exp_avg, on_cpu[i].exp_avg)) << "exp_avg " << i;
    EXPECT_TRUE(same(emulated[i].exp_avg_sq, on_cpu[i].exp_avg_sq)) << "exp_avg_sq " << i;
    if (on_cpu[i].compensation.defined()) {
      EXPECT_TRUE(same(emulated[i].compensation, on_cpu[i].compensation)) << "compensation " << i;
    }
  }
}

// grad_stats through the two kernels (chunk partials, then their sum in one block).
std::vector<double> emulated_stats(const std::vector<Tensor>& grads, double inv_scale) {
  std::vector<std::pair<Tensor, Tensor>> pairs;
  for (const Tensor& g : grads) pairs.push_back({g, Tensor()});
  const std::vector<cuda::GradChunk> chunks = grad_chunks(pairs);
  std::vector<double> partial(2 * chunks.size(), NAN), got = {0.0, 0.0};
  emu::launch(static_cast<unsigned>(chunks.size()), 128, 32 * sizeof(double),
              [&] { ok::grad_stats_chunks(chunks.data(), inv_scale, partial.data()); });
  emu::launch(1, 256, 32 * sizeof(double),
              [&] { ok::grad_stats_total(partial.data(), static_cast<int64_t>(chunks.size()), got.data()); });
  return got;
}

TEST(OptimEmulated, GradientStatisticsAndTransformGiveTheCpuResults) {
  Generator gen(4);
  std::vector<Tensor> grads = {draw({1000}, gen, DType::bf16), draw({70000}, gen, DType::f32, 3.0),
                               draw({5}, gen, DType::f16)};
  {  // an infinite element: counted
    Tensor g16 = ops::to_dtype(grads[2], DType::f32);
    g16.data<float>()[3] = INFINITY;
    grads[2] = ops::to_dtype(g16, DType::f16);
  }
  const Tensor stats = ops::zeros({2}, DType::f64);
  cpu().grad_stats(grads, 0.25, stats);
  const std::vector<double> got = emulated_stats(grads, 0.25);
  const double* want = stats.data<double>();
  EXPECT_EQ(got[0], want[0]) << "an infinite product: an infinite sum of squares";
  EXPECT_TRUE(std::isinf(got[0]));
  EXPECT_EQ(got[1], want[1]) << "non-finite count";
  EXPECT_EQ(got[1], 1.0);

  // The transform (unscale, clip) into f32, bit for bit.
  grads.pop_back();  // finite gradients only
  const Tensor fin = ops::zeros({2}, DType::f64);
  cpu().grad_stats(grads, 0.25, fin);
  std::vector<std::pair<Tensor, Tensor>> cpu_pairs, emu_pairs;
  for (const Tensor& g : grads) {
    cpu_pairs.push_back({g, ops::empty(g.shape(), DType::f32)});
    emu_pairs.push_back({g, ops::empty(g.shape(), DType::f32)});
  }
  // The finite gradients' statistics: the same sum within f64 rounding (another order), no bad count.
  const std::vector<double> fgot = emulated_stats(grads, 0.25);
  EXPECT_NEAR(fgot[0], fin.data<double>()[0], 1e-12 * fin.data<double>()[0]);
  EXPECT_GT(fgot[0], 0.0);
  EXPECT_EQ(fgot[1], 0.0);
  cpu().transform_grads(cpu_pairs, {0.25, 1.0, fin});
  const std::vector<cuda::GradChunk> tc = grad_chunks(emu_pairs);
  emu::launch(static_cast<unsigned>(tc.size()), 128, 0,
              [&] { ok::transform_kernel<float>(tc.data(), 0.25, 1.0, fin.data<double>()); });
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(same(emu_pairs[i].second, cpu_pairs[i].second)) << i;
}

// bitsandbytes' two-state kernels, 8-bit (a partial last block) and 32-bit, for AdamW and for AdEMAMix (its
// third state, alpha and beta3 as the scheduled step hands them over).
void check_two_state(bool ademamix) {
  Generator gen(9);
  const int64_t n = 1000,
                blocks = (n + backend::kAdam8bitBlock - 1) / backend::kAdam8bitBlock;  // 4, last partial
  const auto& smap = optim::dynamic_map(true);
  const auto& umap = optim::dynamic_map(false);
  const Tensor signed_map = ops::from_vector<float>(std::vector<float>(smap.begin(), smap.end()), {256});
  const Tensor unsigned_map = ops::from_vector<float>(std::vector<float>(umap.begin(), umap.end()), {256});
  std::mt19937 rng(3);
  auto codes = [&] {
    const Tensor c = ops::empty({n}, DType::u8);
    for (int64_t i = 0; i < n; ++i) c.data<uint8_t>()[i] = static_cast<uint8_t>(rng() & 255);
    return c;
  };
  auto absmax = [&] {
    return ops::affine(ops::unary(ops::UnaryOp::abs, draw({blocks}, gen, DType::f32)), 0.01, 1e-3);
  };
  BE::AdamW8bitTensors c8{draw({n}, gen, DType::f32),
                          draw({n}, gen, DType::f32, 0.1),
                          codes(),
                          codes(),
                          absmax(),
                          absmax(),
                          true,
                          {},
                          Tensor(),
                          Tensor()};
  BE::AdamW8bitTensors c32{draw({37}, gen, DType::f32),
                           draw({37}, gen, DType::f32, 0.1),
                           draw({37}, gen, DType::f32, 0.01),
                           ops::affine(ops::unary(ops::UnaryOp::abs, draw({37}, gen, DType::f32)), 1e-4, 0.0),
                           Tensor(),
                           Tensor(),
                           false,
                           {},
                           Tensor(),
                           Tensor()};
  if (ademamix) {
    c8.state3 = codes();
    c8.absmax3 = absmax();
    c32.state3 = draw({37}, gen, DType::f32, 0.01);
  }
  const auto copy_or_none = [](const Tensor& t) { return t.defined() ? copy_of(t) : Tensor(); };
  BE::AdamW8bitTensors e8{copy_of(c8.param),
                          c8.grad,
                          copy_of(c8.state1),
                          copy_of(c8.state2),
                          copy_of(c8.absmax1),
                          copy_of(c8.absmax2),
                          true,
                          {},
                          copy_or_none(c8.state3),
                          copy_or_none(c8.absmax3)};
  BE::AdamW8bitTensors e32{copy_of(c32.param),
                           c32.grad,
                           copy_of(c32.state1),
                           copy_of(c32.state2),
                           Tensor(),
                           Tensor(),
                           false,
                           {},
                           copy_or_none(c32.state3),
                           Tensor()};
  const auto ptr = [](const Tensor& t) { return t.defined() ? t.data<uint8_t>() : nullptr; };
  const auto fptr = [](const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; };
  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, t = static_cast<float>(step);
    const float c1 = 1.0f - std::pow(b1, t), c2 = std::sqrt(1.0f - std::pow(b2, t));
    backend::Adam8bitConsts k{b1, b2, 1.0f - b1, 1.0f - b2, -lr * c2 / c1, eps * c2, 1.0f - lr * 0.01f, true};
    if (ademamix) {
      k.ademamix = true;
      k.b3 = 0.999f - 0.01f * t;  // a scheduled beta3
      k.one_b3 = 1.0f - k.b3;
      k.alpha = 2.5f * t;  // a scheduled alpha
      k.lr = lr;
      k.eps = eps;
      k.c1 = c1;
      k.c2 = c2;
    }
    c8.k = e8.k = c32.k = e32.k = k;
    if (step == 3) c8.grad.data<float>()[5] = INFINITY;  // an infinite gradient (bitsandbytes' NaN path)
    cpu().adamw_8bit({c8, c32}, signed_map, unsigned_map);
    emu::launch(static_cast<unsigned>(blocks), 256, 536 * sizeof(float), [&] {
      ok::adamw_8bit_kernel(e8.param.data<float>(), e8.grad.data<float>(), e8.state1.data<uint8_t>(),
                            e8.state2.data<uint8_t>(), ptr(e8.state3), e8.absmax1.data<float>(),
                            e8.absmax2.data<float>(), fptr(e8.absmax3), n, k, signed_map.data<float>(),
                            unsigned_map.data<float>());
    });
    emu::launch(1, 64, 0, [&] {
      ok::adamw_32bit_kernel(e32.param.data<float>(), e32.grad.data<float>(), e32.state1.data<float>(),
                             e32.state2.data<float>(), fptr(e32.state3), 37, k);
    });
    EXPECT_TRUE(same(e8.param, c8.param)) << "8-bit param";
    EXPECT_TRUE(same(e8.state1, c8.state1)) << "first moment codes";
    EXPECT_TRUE(same(e8.state2, c8.state2)) << "second moment codes";
    EXPECT_TRUE(same(e8.absmax1, c8.absmax1)) << "absmax1";
    EXPECT_TRUE(same(e8.absmax2, c8.absmax2)) << "absmax2";
    EXPECT_TRUE(same(e32.param, c32.param)) << "32-bit param";
    EXPECT_TRUE(same(e32.state1, c32.state1) && same(e32.state2, c32.state2)) << "32-bit moments";
    if (ademamix) {
      EXPECT_TRUE(same(e8.state3, c8.state3) && same(e8.absmax3, c8.absmax3)) << "slow EMA codes, absmax";
      EXPECT_TRUE(same(e32.state3, c32.state3)) << "32-bit slow EMA";
    }
  }
}

TEST(OptimEmulated, EightBitAdamWGivesTheCpuBits) { check_two_state(false); }

TEST(OptimEmulated, AdEMAMixGivesTheCpuBits) { check_two_state(true); }

TEST(OptimEmulated, SgdGivesTheCpuBits) {
  Generator gen(12);
  for (const bool nesterov : {false, true})
    for (const bool first : {true, false}) {
      SCOPED_TRACE(fmt::format("nesterov {} first {}", nesterov, first));
      const int64_t n = 777;
      const Tensor p = draw({n}, gen, DType::f32), g = draw({n}, gen, DType::f32, 0.1),
                   buf = draw({n}, gen, DType::f32, 0.05);
      BE::SgdTensors x{p, g, buf, 0.01, first};
      BE::SgdHyper h;
      h.lr = 0.05, h.momentum = 0.9, h.dampening = nesterov ? 0.0 : 0.1, h.nesterov = nesterov;
      const Tensor ep = copy_of(p), eb = copy_of(buf);
      cpu().sgd({x}, h);
      const backend::SgdScalars<float> c(h.lr, x.weight_decay, h.momentum, h.dampening, nesterov, first);
      emu::launch(2, 64, 0,
                  [&] { ok::sgd_kernel<float>(ep.data<float>(), g.data<float>(), eb.data<float>(), n, c); });
      EXPECT_TRUE(same(ep, p)) << "param";
      EXPECT_TRUE(same(eb, buf)) << "momentum buffer";
    }
}

// Adagrad, RMSprop (with and without its momentum buffer), bitsandbytes' Lion and RMSprop, schedulefree's
// steps and switch: the kernel's bits.
template <backend::ElementwiseRule R, typename T>
void check_elementwise(const BE::ElementwiseHyper& h, bool second, DType dt, Generator& gen) {
  const int64_t n = 1000;
  const Tensor p = draw({n}, gen, dt), g = draw({n}, gen, dt, 0.1), d1 = draw({n}, gen, dt, 0.2),
               s1 = ops::binary(backend::BinaryOp::mul, d1, d1),
               s2 = second ? draw({n}, gen, dt, 0.05) : Tensor();
  const BE::ElementwiseTensors x{p, g, s1, s2, 0.01};
  const Tensor ep = copy_of(p), e1 = copy_of(s1), e2 = second ? copy_of(s2) : Tensor();
  cpu().elementwise_step({x}, h);
  const backend::ElementwiseScalars<T> c(h, x.weight_decay);
  emu::launch(2, 64, 0, [&] {
    ok::elementwise_kernel<R, T>(ep.data<T>(), g.data<T>(), e1.data<T>(), second ? e2.data<T>() : nullptr, n,
                                 c);
  });
  EXPECT_TRUE(same(ep, p)) << "param";
  EXPECT_TRUE(same(e1, s1)) << "state1";
  if (second) {
    EXPECT_TRUE(same(e2, s2)) << "state2";
  }
}

TEST(OptimEmulated, ElementwiseOptimizersGiveTheCpuBits) {
  using backend::ElementwiseRule;
  Generator gen(13);
  BE::ElementwiseHyper h;
  h.lr = 0.05, h.step = 3, h.lr_decay = 0.1, h.eps = 1e-6;
  h.rule = ElementwiseRule::adagrad;
  check_elementwise<ElementwiseRule::adagrad, float>(h, false, DType::f32, gen);
  check_elementwise<ElementwiseRule::adagrad, double>(h, false, DType::f64, gen);
  h.rule = ElementwiseRule::rmsprop, h.beta1 = 0.9, h.momentum = 0.9;
  for (const bool momentum : {false, true}) {
    SCOPED_TRACE(fmt::format("rmsprop momentum {}", momentum));
    check_elementwise<ElementwiseRule::rmsprop, float>(h, momentum, DType::f32, gen);
    check_elementwise<ElementwiseRule::rmsprop, double>(h, momentum, DType::f64, gen);
  }
  h.rule = ElementwiseRule::lion, h.beta1 = 0.9, h.beta2 = 0.99;
  check_elementwise<ElementwiseRule::lion, float>(h, false, DType::f32, gen);
  h.rule = ElementwiseRule::rmsprop_bnb, h.beta1 = 0.99;
  check_elementwise<ElementwiseRule::rmsprop_bnb, float>(h, false, DType::f32, gen);
  // schedulefree: AdamW (normalized, and RAdam's silent steps), SGD, and the train/eval switch (a weight
  // below and one above 0.5: torch's two lerp forms)
  h.beta2 = 0.999, h.bias_correction2 = 0.003, h.ckp1 = 0.25, h.y_lr = -0.0375, h.lr = 0.05;
  for (const bool normalize : {true, false}) {
    h.rule = ElementwiseRule::schedule_free_adam, h.normalize = normalize;
    SCOPED_TRACE(fmt::format("schedule_free_adam normalize {}", normalize));
    check_elementwise<ElementwiseRule::schedule_free_adam, float>(h, true, DType::f32, gen);
    check_elementwise<ElementwiseRule::schedule_free_adam, double>(h, true, DType::f64, gen);
  }
  h.rule = ElementwiseRule::schedule_free_sgd;
  check_elementwise<ElementwiseRule::schedule_free_sgd, float>(h, false, DType::f32, gen);
  check_elementwise<ElementwiseRule::schedule_free_sgd, double>(h, false, DType::f64, gen);
  // optimi's StableAdamW: the moments (lerp weights on both sides of 0.5) and the parameter pass
  h.rule = ElementwiseRule::stable_adamw_moments, h.beta2 = 0.5;
  for (const double w : {1.0, 0.1}) {
    h.ckp1 = w;
    check_elementwise<ElementwiseRule::stable_adamw_moments, float>(h, true, DType::f32, gen);
    check_elementwise<ElementwiseRule::stable_adamw_moments, double>(h, true, DType::f64, gen);
  }
  h.rule = ElementwiseRule::stable_adamw_param, h.lr = 0.01, h.decay_factor = 0.999;
  check_elementwise<ElementwiseRule::stable_adamw_param, float>(h, true, DType::f32, gen);
  check_elementwise<ElementwiseRule::stable_adamw_param, double>(h, true, DType::f64, gen);
  // galore_torch's AdamW, with and without its decay after the update
  h.rule = ElementwiseRule::galore_adamw, h.beta1 = 0.9, h.beta2 = 0.999, h.eps = 1e-6, h.lr = 0.003;
  for (const double alpha : {-1e-3, 0.0}) {
    h.decay_factor = alpha;
    check_elementwise<ElementwiseRule::galore_adamw, float>(h, true, DType::f32, gen);
    check_elementwise<ElementwiseRule::galore_adamw, double>(h, true, DType::f64, gen);
  }
  // GrokAdamW's two passes: the EMA with lamb's amplification, and the moments and update
  h.rule = ElementwiseRule::grok_ema, h.beta1 = 0.98, h.momentum = 2.0;
  check_elementwise<ElementwiseRule::grok_ema, float>(h, false, DType::f32, gen);
  check_elementwise<ElementwiseRule::grok_ema, double>(h, false, DType::f64, gen);
  h.rule = ElementwiseRule::grokadamw, h.beta1 = 0.81, h.decay_factor = 0.9999, h.lr = 0.004;
  check_elementwise<ElementwiseRule::grokadamw, float>(h, true, DType::f32, gen);
  check_elementwise<ElementwiseRule::grokadamw, double>(h, true, DType::f64, gen);
  h.rule = ElementwiseRule::schedule_free_lerp;
  for (const double w : {1 - 1 / 0.9, 0.1, 0.75}) {
    h.ckp1 = w;
    check_elementwise<ElementwiseRule::schedule_free_lerp, float>(h, false, DType::f32, gen);
    check_elementwise<ElementwiseRule::schedule_free_lerp, double>(h, false, DType::f64, gen);
  }
}

// bitsandbytes' one-state 8-bit kernel (Lion, RMSprop): a partial last block, three steps, with decay.
TEST(OptimEmulated, OneState8bitGivesTheCpuBits) {
  using backend::ElementwiseRule;
  Generator gen(14);
  const int64_t n = 1000, blocks = (n + backend::kAdam8bitBlock - 1) / backend::kAdam8bitBlock;
  const auto& smap = optim::dynamic_map(true);
  const Tensor map = ops::from_vector<float>(std::vector<float>(smap.begin(), smap.end()), {256});
  std::mt19937 rng(5);
  for (const auto rule : {ElementwiseRule::lion, ElementwiseRule::rmsprop_bnb}) {
    SCOPED_TRACE(rule == ElementwiseRule::lion ? "lion" : "rmsprop_bnb");
    const Tensor codes = ops::empty({n}, DType::u8);
    for (int64_t i = 0; i < n; ++i)  // RMSprop's state is non-negative: codes of the upper half
      codes.data<uint8_t>()[i] =
          static_cast<uint8_t>(rule == ElementwiseRule::lion ? rng() & 255 : 127 + rng() % 129);
    const BE::Elementwise8bitTensors c{
        draw({n}, gen, DType::f32), draw({n}, gen, DType::f32, 0.1), codes,
        ops::affine(ops::unary(ops::UnaryOp::abs, draw({blocks}, gen, DType::f32)), 0.01, 1e-3), 0.05};
    const Tensor ep = copy_of(c.param), ec = copy_of(c.state1), ea = copy_of(c.absmax1);
    BE::ElementwiseHyper h;
    h.rule = rule, h.lr = 1e-3, h.beta1 = rule == ElementwiseRule::lion ? 0.9 : 0.99, h.beta2 = 0.99;
    const backend::ElementwiseScalars<float> k(h, c.weight_decay);
    for (int step = 1; step <= 3; ++step) {
      SCOPED_TRACE(fmt::format("step {}", step));
      cpu().elementwise_8bit({c}, h, map);
      emu::launch(static_cast<int>(blocks), 256, 264 * sizeof(float), [&] {
        if (rule == ElementwiseRule::lion)
          ok::state8bit_kernel<ElementwiseRule::lion>(ep.data<float>(), c.grad.data<float>(),
                                                      ec.data<uint8_t>(), ea.data<float>(), n, k,
                                                      map.data<float>());
        else
          ok::state8bit_kernel<ElementwiseRule::rmsprop_bnb>(ep.data<float>(), c.grad.data<float>(),
                                                             ec.data<uint8_t>(), ea.data<float>(), n, k,
                                                             map.data<float>());
      });
      EXPECT_TRUE(same(ep, c.param)) << "param";
      EXPECT_TRUE(same(ec, c.state1)) << "codes";
      EXPECT_TRUE(same(ea, c.absmax1)) << "absmax";
    }
  }
}

}  // namespace
}  // namespace tr
