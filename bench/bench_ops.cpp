// Op benchmarks on the CPU: matmul GFLOP/s and layernorm / softmax / cross-entropy GB/s, next to PyTorch CPU
// running the same shapes in the same run (torch_peer.py ops).
#include <cstdio>

#include "autograd/functions.h"
#include "backend/cpu/matmul_native.h"
#include "optim/optimizer.h"
#include "bench_util.h"

int main(int argc, char** argv) {
  using namespace tr;
  const int iters = argc > 1 ? std::atoi(argv[1]) : 10;
  Generator gen(1);
  auto peer = bench::run_torch_peer(fmt::format("ops {}", iters));
  auto row = [&](const char* name, const std::string& key, double ours, double work, const char* unit) {
    std::printf("  %-22s ours %8.2f ms %8.1f %s", name, ours * 1e3, work / ours * 1e-9, unit);
    if (!peer.is_null() && peer.contains(key)) {
      const double t = peer[key].get<double>();
      std::printf("   torch %8.2f ms %8.1f %s   time ratio %.2f", t * 1e3, work / t * 1e-9, unit, ours / t);
    }
    std::printf("\n");
  };
  std::printf("CPU ops, %d threads (ratio = our time / torch time, < 1 is faster)%s\n", omp_get_max_threads(),
              peer.is_null() ? "; pytorch unavailable" : "");
  for (int64_t n : {512, 1024, 2048}) {
    Tensor a = ops::randn({n, n}, gen), b = ops::randn({n, n}, gen);
    double t = bench::median_seconds([&] { ops::matmul(a, b); }, iters);
    row(fmt::format("matmul f32 {}^3", n).c_str(), fmt::format("matmul_{}", n), t, 2.0 * n * n * n,
        "GFLOP/s");
  }
  {
    const int64_t n = 1024;
    Tensor a = ops::to_dtype(ops::randn({n, n}, gen), DType::bf16),
           b = ops::to_dtype(ops::randn({n, n}, gen), DType::bf16);
    double t = bench::median_seconds([&] { ops::matmul(a, b); }, iters);
    row("matmul bf16 1024^3", "-", t, 2.0 * n * n * n, "GFLOP/s");
  }
  // oneDNN's bf16 matmul called directly, whatever the backend chooses on this CPU (it widens to f32 sgemm
  // where native bf16 measured slower): the numbers that choice rests on.
  cpu::NativeMatmul native;
  auto native_row = [&](const char* name, const Tensor& a, const Tensor& b, bool trans_b,
                        DType out = DType::bf16, bool trans_a = false) {
    backend::GemmArgs g;
    g.a = a, g.b = b, g.trans_a = trans_a, g.trans_b = trans_b;
    g.m = a.size(trans_a ? 1 : 0), g.k = a.size(trans_a ? 0 : 1), g.n = trans_b ? b.size(0) : b.size(1);
    g.lda = a.size(1), g.ldb = b.size(1);
    g.c = ops::empty({g.m, g.n}, out);
    if (!native.run(g)) return std::printf("  %-22s (oneDNN has no native kernel here)\n", name), void();
    row(name, "-", bench::median_seconds([&] { native.run(g); }, iters), 2.0 * g.m * g.n * g.k, "GFLOP/s");
  };
  std::printf("  (oneDNN bf16 kernel here: %s)\n",
              native.impl_name(DType::bf16).empty() ? "none" : native.impl_name(DType::bf16).c_str());
  {
    // The LM head of the benchmarks' GPT-2 (1024 tokens x 256 hidden x 50257 vocabulary): 90% of a step's
    // flops.
    const int64_t m = 1024, k = 256, n = 50257;
    Tensor a = ops::randn({m, k}, gen), b = ops::randn({n, k}, gen);
    row("head f32 1024x256x50257", "-", bench::median_seconds([&] { ops::matmul(a, b, false, true); }, iters),
        2.0 * m * n * k, "GFLOP/s");
    Tensor a16 = ops::to_dtype(a, DType::bf16), b16 = ops::to_dtype(b, DType::bf16);
    row("head bf16 1024x256x50257", "-",
        bench::median_seconds([&] { ops::matmul(a16, b16, false, true); }, iters), 2.0 * m * n * k,
        "GFLOP/s");
    if (native.has_bf16()) {
      const Tensor s16 = ops::to_dtype(ops::randn({1024, 1024}, gen), DType::bf16);
      native_row("matmul bf16 native 1024^3", s16, s16, false);
      native_row("head bf16 native", a16, b16, true);
      native_row("head bf16 native f32 out", a16, b16, true, DType::f32);  // the LM head's logits
      // The head's backward: dx = dl w, dw = dl^T x (f32 accumulators), against f32 sgemm.
      const Tensor dl32 = ops::randn({m, n}, gen), dl16 = ops::to_dtype(dl32, DType::bf16);
      native_row("head dx bf16 native", dl16, b16, false, DType::f32);
      native_row("head dw bf16 native", dl16, a16, false, DType::f32, true);
      native_row("head dw^T bf16 native", a16, dl16, false, DType::f32, true);  // x^T dl: [256, 50257]
      row("head dx f32", "-", bench::median_seconds([&] { ops::matmul(dl32, b); }, iters), 2.0 * m * n * k,
          "GFLOP/s");
      row("head dw f32", "-", bench::median_seconds([&] { ops::matmul(dl32, a, true, false); }, iters),
          2.0 * m * n * k, "GFLOP/s");
      row("head dw^T f32", "-", bench::median_seconds([&] { ops::matmul(a, dl32, true, false); }, iters),
          2.0 * m * n * k, "GFLOP/s");
      // The price of the x^T dl form: its [256, 50257] f32 product turned into the [50257, 256] gradient.
      const Tensor dwt = ops::randn({k, n}, gen);
      row("dw^T -> dw, f32 to bf16", "-",
          bench::median_seconds([&] { ops::to_dtype(ops::transpose(dwt, 0, 1), DType::bf16); }, iters),
          6.0 * k * n, "GB/s");
      // The head's backward as it runs: scaled by the loss's gradient, then turned back (two ops, then one).
      // A scale of 1: repeated in-place multiplies by a smaller one would reach subnormals.
      const Tensor gs = ops::full({}, 1.0, DType::f32), dws = ops::clone(dwt);
      row("scale, dw^T -> dw, 2 ops", "-",
          bench::median_seconds(
              [&] {
                ops::binary_(ops::BinaryOp::mul, dws, gs);
                ops::to_dtype(ops::transpose(dws, 0, 1), DType::bf16);
              },
              iters),
          6.0 * k * n, "GB/s");
      const Tensor dw16 = ops::empty({n, k}, DType::bf16);
      row("scale, dw^T -> dw, 1 op", "-",
          bench::median_seconds([&] { ops::scaled_copy_(ops::transpose(dw16, 0, 1), dws, gs); }, iters),
          6.0 * k * n, "GB/s");
      row("dw, f32 to bf16 (plain)", "-",
          bench::median_seconds([&] { ops::to_dtype(dwt, DType::bf16); }, iters), 6.0 * k * n, "GB/s");
      row("dw^T -> dw, f32", "-",
          bench::median_seconds([&] { ops::contiguous(ops::transpose(dwt, 0, 1)); }, iters), 8.0 * k * n,
          "GB/s");
    }
  }
  Tensor x = ops::randn({8192, 1024}, gen), w = ops::ones({1024}), bias = ops::zeros({1024});
  const double bytes = 2.0 * 8192 * 1024 * 4;  // read x, write y
  row("layer_norm 8192x1024", "layer_norm",
      bench::median_seconds([&] { ops::layer_norm(x, w, bias, 1e-5); }, iters), bytes, "GB/s");
  row("softmax 8192x1024", "softmax", bench::median_seconds([&] { ops::softmax(x, -1); }, iters), bytes,
      "GB/s");
  Tensor logits = ops::randn({512, 50257}, gen);
  std::vector<int64_t> lab(512);
  for (size_t i = 0; i < lab.size(); ++i) lab[i] = static_cast<int64_t>(i * 97 % 50257);
  Tensor labels = ops::from_vector<int64_t>(lab, {512});
  row("cross_entropy 512x50257", "cross_entropy",
      bench::median_seconds([&] { cross_entropy(logits, labels); }, iters), 512.0 * 50257 * 4, "GB/s");
  {
    // The chunked LM head's loss and half logit gradient: two ops (the gradient reads the 206 MB of logits
    // again) against one call that makes each row's gradient while the row is in cache.
    const int64_t n = 1024, v = 50257;
    const Tensor lg = ops::randn({n, v}, gen), g1 = ops::ones({n}), dl = ops::empty({n, v}, DType::bf16);
    std::vector<int64_t> lv(n);
    for (int64_t i = 0; i < n; ++i) lv[static_cast<size_t>(i)] = i * 97 % v;
    const Tensor lab = ops::from_vector<int64_t>(lv, {n});
    row("CE + bf16 grad, 2 ops", "-",
        bench::median_seconds(
            [&] {
              const ops::CrossEntropyOut ce = ops::cross_entropy(lg, lab, -100);
              ops::cross_entropy_backward_into(lg, lab, ce.lse, g1, -100, dl);
            },
            iters),
        n * v * 4.0, "GB/s");
    row("CE + bf16 grad, 1 call", "-",
        bench::median_seconds([&] { ops::cross_entropy_with_grad_(lg, lab, -100, g1, dl); }, iters),
        n * v * 4.0, "GB/s");
  }
  {
    // One AdamW step over the side-by-side model's 16M parameters: fp32 (f32 gradient) against mixed
    // precision (bf16 gradient read, the bf16 weight copy written by the same pass). Bytes: what each moves.
    const int64_t n = 16 * 1024 * 1024;
    const Tensor p = ops::randn({n}, gen), m = ops::zeros({n}), v = ops::zeros({n});
    const Tensor g32 = ops::randn({n}, gen), g16 = ops::to_dtype(g32, DType::bf16);
    const Tensor copy = ops::empty({n}, DType::bf16);
    backend::Backend::AdamWHyper h;
    h.weight_decay = 0.01;
    row("adamw 16M, f32 grad", "-",
        bench::median_seconds(
            [&] {
              ops::fused_adamw({{p, g32, m, v, true, Tensor()}}, h, {});
            },
            iters),
        n * 28.0, "GB/s");
    row("adamw 16M, bf16 + copy", "-",
        bench::median_seconds(
            [&] {
              ops::fused_adamw({{p, g16, m, v, true, copy}}, h, {});
            },
            iters),
        n * 28.0, "GB/s");
  }
  {
    // The other optimizers' steps over 16M parameters of one matrix (8-bit state where the name says so):
    // bytes are what each step reads and writes (param, grad, states; codes as one byte, absmax ignored).
    const int64_t n = 16 * 1024 * 1024;
    const Tensor w0 = ops::randn({n}, gen), g = ops::affine(ops::randn({n}, gen), 0.01, 0.0);
    for (const auto& [name, bytes] :
         std::vector<std::pair<const char*, double>>{{"adamw_8bit", 16.0},
                                                     {"lion_32bit", 20.0},
                                                     {"lion_8bit", 14.0},
                                                     {"ademamix", 36.0},
                                                     {"ademamix_8bit", 18.0},
                                                     {"schedule_free_adamw", 28.0},
                                                     {"schedule_free_sgd", 20.0},
                                                     {"stable_adamw", 44.0},
                                                     {"grokadamw", 56.0}}) {
      Tensor w = ops::clone(w0);
      const nn::ParamList params{{"h.0.mlp.c_fc.weight", &w}};
      auto opt = optim::make_optimizer(name, params, {});
      autograd::set_grad(w, g);
      row(fmt::format("{} 16M", name).c_str(), "-", bench::median_seconds([&] { opt->step(); }, iters),
          n * bytes, "GB/s");
    }
  }
  {
    // GaLore's basis refresh (the leading 128 right singular vectors; LAPACK's SVD computes all of them, as
    // torch.linalg.svd does), and a step between refreshes over one 4096 x 4096 weight at rank 128: the two
    // projections (4 m n r flops) and the low-rank AdamW.
    for (const auto& [m, n] : std::vector<std::pair<int64_t, int64_t>>{{1024, 1024}, {768, 3072}}) {
      const Tensor g = ops::randn({m, n}, gen);
      const Tensor vh = ops::empty({128, n});
      row(fmt::format("svd {}x{}", m, n).c_str(), fmt::format("svd_{}x{}", m, n),
          bench::median_seconds([&] { ops::svd_into(g, Tensor(), vh); }, std::max(1, iters / 5)),
          4.0 * m * n * std::min(m, n), "GFLOP/s");
    }
    const int64_t d = 4096;
    Tensor w = ops::randn({d, d}, gen);
    const nn::ParamList params{{"h.0.mlp.c_fc.weight", &w}};
    optim::OptimizerOptions o;
    o.target_modules = "all-linear";
    o.linear_weights = {"h.0.mlp.c_fc.weight"};
    o.args = optim::parse_optim_args("rank=128,update_proj_gap=1000000");
    auto opt = optim::make_optimizer("galore_adamw", params, o);
    autograd::set_grad(w, ops::affine(ops::randn({d, d}, gen), 0.01, 0.0));
    opt->step();  // the refresh
    row("galore_adamw 4096^2 r128", "-", bench::median_seconds([&] { opt->step(); }, iters),
        4.0 * d * d * 128, "GFLOP/s");
  }
  return 0;
}
