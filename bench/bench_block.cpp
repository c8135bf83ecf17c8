// One GPT-2-style transformer block (batch 8, sequence 256, d_model 512, 8 heads, fp32) forward+backward,
// against the same block in PyTorch measured in the same run; prints both and the ratio.
// Usage: bench_block [iters] [cpu|cuda]
#include <cstdio>

#include "../tests/transformer_block.h"
#include "backend/backend.h"
#include "bench_util.h"

int main(int argc, char** argv) {
  using namespace tr;
  const int64_t B = 8, T = 256, d = 512, H = 8;
  const int iters = argc > 1 ? std::atoi(argv[1]) : 5;
  const Device dev = Device::parse(argc > 2 ? argv[2] : "cpu");
  Generator gen(0);
  test::BlockParams p = test::make_block(d, H, gen, dev);
  Tensor x = ops::randn({B, T, d}, gen, DType::f32, dev);
  autograd::set_requires_grad(x, true);
  Tensor mask = test::causal_mask_on(T, dev);
  Allocator& alloc = ops::allocator_for(dev);
  alloc.reset_peak();
  const int64_t base = alloc.stats().current_bytes;
  double ours = bench::median_seconds(
      [&] {
        autograd::backward({mean(test::block_forward(p, x, mask))});
        for (Tensor* t : p.all()) autograd::zero_grad(*t);
        autograd::zero_grad(x);
        backend::backend_for(dev).synchronize();
      },
      iters);
  const double peak_mb = static_cast<double>(alloc.stats().peak_bytes - base) / (1 << 20);
  // FLOPs: 6 * params * tokens for the linears, plus attention (QK^T and AV: 4*B*T*T*d fwd, x3 with bwd).
  const double tokens = static_cast<double>(B * T);
  const double flops = 6.0 * 12.0 * d * d * tokens + 3.0 * 4.0 * B * T * T * d;
  std::printf("block B=%lld T=%lld d=%lld H=%lld fp32 fwd+bwd on %s, %d threads\n", (long long)B,
              (long long)T, (long long)d, (long long)H, dev.str().c_str(), omp_get_max_threads());
  std::printf("  trainer.cpp : %8.1f ms  %6.1f GFLOP/s  %8.0f tokens/s  peak %.1f MiB\n", ours * 1e3,
              flops / ours * 1e-9, tokens / ours, peak_mb);
  auto peer = bench::run_torch_peer(
      fmt::format("block {} {} {} {} {} {}", B, T, d, H, iters, dev.is_cuda() ? "cuda" : "cpu"));
  if (peer.is_null()) {
    std::printf("  pytorch     : unavailable (install with scripts/setup.sh --bench)\n");
    return 0;
  }
  const double theirs = peer["seconds"].get<double>();
  std::printf("  pytorch %s : %8.1f ms  %6.1f GFLOP/s  %8.0f tokens/s  (torch %s)\n",
              dev.is_cuda() ? "cuda" : "cpu", theirs * 1e3, flops / theirs * 1e-9, tokens / theirs,
              peer.value("torch", "?").c_str());
  std::printf("  time ratio trainer.cpp / pytorch = %.3f  (< 1 is faster)\n", ours / theirs);
  return 0;
}
