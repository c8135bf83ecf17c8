// Causal attention on the CPU or a GPU, forward + backward, in three forms across sequence lengths: the
// backend's fused (tiled) kernel, the blocked GEMM form (ops/attention_blocked.cpp) and eager (materialized
// scores, HF's reference); then what sdpa runs for that shape. Tokens per call stay fixed, so rows compare
// cost per token as T grows. With a dropout probability, each form drops the probabilities (attention dropout
// as in training). On a GPU each call is timed to its end (synchronized); the fused form there is the flash
// kernels for bf16 (the tiled kernels for f32), and a cuDNN column times cuDNN's fused attention where it
// takes the call (bf16 without dropout; "-" where it declines), which sdpa then runs.
//
//   bench_attention [iters=5] [tokens=4096] [heads=4] [head_dim=64] [dtype=f32|bf16] [dropout=0] [cpu|cuda]
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "autograd/functions.h"
#include "backend/cuda_api.h"
#include "bench_util.h"
#include "models/causal_lm.h"

int main(int argc, char** argv) {
  using namespace tr;
  const int iters = argc > 1 ? std::atoi(argv[1]) : 5;
  const int64_t tokens = argc > 2 ? std::atoll(argv[2]) : 4096, H = argc > 3 ? std::atoll(argv[3]) : 4,
                D = argc > 4 ? std::atoll(argv[4]) : 64;
  const DType dt = argc > 5 && std::strcmp(argv[5], "bf16") == 0 ? DType::bf16 : DType::f32;
  const double p = argc > 6 ? std::atof(argv[6]) : 0.0;
  const bool gpu = argc > 7 && std::strcmp(argv[7], "cuda") == 0;
  if (iters < 1 || tokens < 64 || H < 1 || D < 1 || p < 0 || p >= 1) {
    std::fprintf(stderr,
                 "usage: bench_attention [iters>=1] [tokens>=64] [heads>=1] [head_dim>=1] [f32|bf16] "
                 "[dropout in [0, 1)] [cpu|cuda]\n");
    return 2;
  }
  if (gpu && !backend::cuda_available()) {
    std::fprintf(stderr, "bench_attention: no CUDA GPU here\n");
    return 2;
  }
  const Device dev = gpu ? Device::cuda(0) : Device::cpu();
  // A call's time to its end: the GPU's queue drained after it.
  const auto timed = [&](auto&& f) {
    return bench::median_seconds(
        [&] {
          f();
          backend::backend_for(dev).synchronize();
        },
        iters, 1);
  };
  Generator gen(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::printf(
      "causal attention forward+backward on %s, %lld tokens per call, %lld heads x %lld, %s, dropout %g, %d "
      "threads\n",
      dev.str().c_str(), static_cast<long long>(tokens), static_cast<long long>(H), static_cast<long long>(D),
      std::string(dtype_name(dt)).c_str(), p, omp_get_max_threads());
  const ops::AttentionDropout drop{p, 5, 0};
  std::printf("%6s %4s %10s %10s %10s %10s   %-8s %s\n", "T", "B", "fused ms", "cuDNN ms", "blocked ms",
              "eager ms", "sdpa", "sdpa / eager time");
  for (int64_t T = 64; T <= tokens; T *= 2) {
    const int64_t B = tokens / T;
    const auto make = [&] { return ops::to_device(ops::to_dtype(ops::randn({B, H, T, D}, gen), dt), dev); };
    Tensor q = make(), k = make(), v = make(), dy = make();
    const auto fused_call = [&] {
      const Tensor none;  // the backend's tiled kernel, whatever sdpa would pick for this shape
      const auto form = ops::AttentionForm::fused;
      ops::AttentionOut o = ops::attention(q, k, v, none, true, scale, 0, form, drop);
      ops::attention_backward(q, k, v, none, true, scale, o.out, o.lse, dy, 0, form, drop);
    };
    backend::cuda_use_cudnn_attention(false);  // our kernels (a no-op without CUDA)
    const double fused = timed(fused_call);
    backend::cuda_use_cudnn_attention(true);
    const auto before = backend::cuda_cudnn_attention_counts();
    const double cudnn = gpu ? timed(fused_call) : 0.0;
    const auto after =
        backend::cuda_cudnn_attention_counts();  // both directions on cuDNN, or it is not its row
    const bool cudnn_ran = after.forward > before.forward && after.backward > before.backward;
    const double blocked = timed([&] {
      const Tensor none;
      ops::AttentionOut o = ops::attention_blocked(q, k, v, none, true, scale, 0, drop);
      ops::attention_blocked_backward(q, k, v, none, true, scale, o.out, o.lse, dy, 0, drop);
    });
    std::vector<float> m(static_cast<size_t>(T * T));
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = i + 1; j < T; ++j) m[static_cast<size_t>(i * T + j)] = 1;
    const Tensor mask =
        ops::to_device(ops::to_dtype(ops::from_vector<float>(m, {1, 1, T, T}), DType::boolean), dev);
    const double eager = timed([&] {
      Tensor ql = ops::clone(q), kl = ops::clone(k), vl = ops::clone(v);
      for (Tensor* t : {&ql, &kl, &vl}) autograd::set_requires_grad(*t, true);
      Tensor y = models::eager_attention(ql, kl, vl, mask, scale, p, &gen, p > 0);
      autograd::backward({y}, {dy});
    });
    const bool blocked_pick = ops::attention_form(q, k, p > 0) == ops::AttentionForm::blocked;
    const double sdpa = blocked_pick ? blocked : cudnn_ran ? cudnn : fused;
    const std::string cudnn_ms = cudnn_ran ? fmt::format("{:.2f}", cudnn * 1e3) : "-";
    std::printf("%6lld %4lld %10.2f %10s %10.2f %10.2f   %-8s %.2f\n", static_cast<long long>(T),
                static_cast<long long>(B), fused * 1e3, cudnn_ms.c_str(), blocked * 1e3, eager * 1e3,
                blocked_pick ? "blocked"
                : cudnn_ran  ? "cuDNN"
                             : "fused",
                sdpa / eager);
  }
  return 0;
}
