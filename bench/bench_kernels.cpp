// Kernel benchmark at GPT-2 124M's and Llama-8B's training shapes (bf16; norms, loss, GEMMs, softmax,
// attention forward + backward, AdamW): each op's time, the bytes it must
// move at least (or its FLOPs), the GB/s or TFLOP/s that makes, its share of the device's data-sheet peak and
// of a plain device copy measured in the same run, next to PyTorch on the same device (torch_peer.py
// kernels). Usage: bench_kernels [iters] [cuda|cpu] [rows]. On the CPU (no peak known) it checks the harness
// on smaller rows.
#include <algorithm>
#include <cstdio>

#include "autograd/functions.h"
#include "backend/cuda_api.h"
#include "bench_util.h"
#include "report/summary.h"

namespace tr {
namespace {

struct Bench {
  Device dev;
  int iters;
  double peak_bw = 0, peak_flops = 0, copy_bw = 0;
  nlohmann::json peer;

  // Median seconds per call: each sample runs the op `reps` times and waits for the device once.
  template <typename F>
  double time(F&& f, int reps = 5) {
    auto& be = backend::backend_for(dev);
    return bench::median_seconds(
               [&] {
                 for (int r = 0; r < reps; ++r) f();
                 be.synchronize();
               },
               iters) /
           reps;
  }
  void bytes_row(const char* name, const char* key, double seconds, double bytes) {
    const double bw = bytes / seconds;
    std::printf("  %-34s %9.1f us %8.1f GB/s", name, seconds * 1e6, bw * 1e-9);
    if (peak_bw > 0) std::printf(" %5.1f%% of peak", 100 * bw / peak_bw);
    if (copy_bw > 0) std::printf(" %5.2fx copy", bw / copy_bw);
    peer_column(key, seconds);
  }
  void flops_row(const char* name, const char* key, double seconds, double flops) {
    std::printf("  %-34s %9.1f us %8.1f TFLOP/s", name, seconds * 1e6, flops / seconds * 1e-12);
    if (peak_flops > 0) std::printf(" %5.1f%% of peak", 100 * flops / seconds / peak_flops);
    peer_column(key, seconds);
  }
  void peer_column(const char* key, double seconds) {
    if (!peer.is_null() && peer.contains(key))
      std::printf("   torch %9.1f us  ratio %.2f", peer[key].get<double>() * 1e6,
                  seconds / peer[key].get<double>());
    std::printf("\n");
  }
};

int run(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 10;
  const bool cuda = argc > 2 && std::string(argv[2]) == "cuda";
  if (cuda && !backend::cuda_available()) {
    std::printf("bench_kernels: no CUDA GPU here (%s)\n", backend::cuda_summary().c_str());
    return 1;
  }
  const Device dev = cuda ? Device::cuda(0) : Device::cpu();
  const int64_t N = argc > 3 ? std::atoll(argv[3]) : cuda ? 16384 : 512;  // GPT-2: batch 16 x 1024
  const int64_t d = 768, V = 50257, ldv = 50304, L_rows = N / 2, L_d = 4096;
  Bench b{dev, iters, 0, 0, 0, nullptr};
  const std::string name = cuda ? backend::cuda_device_name(0) : "cpu";
  b.peak_bw = report::peak_memory_bandwidth(name);
  b.peak_flops = report::peak_flops(name, DType::bf16, false);
  b.peer = bench::run_torch_peer(fmt::format("kernels {} {} {}", iters, cuda ? "cuda" : "cpu", N));
  std::printf("kernels on %s, bf16, %lld rows (ratio = our time / torch's, < 1 is faster)%s\n", name.c_str(),
              static_cast<long long>(N), b.peer.is_null() ? "; pytorch unavailable" : "");
  if (b.peer.contains("torch")) std::printf("  peer: torch %s\n", b.peer["torch"].get<std::string>().c_str());
  Generator gen(1);
  auto randn = [&](const Shape& s, DType dt = DType::bf16) {
    return ops::to_device(ops::to_dtype(ops::randn(s, gen), dt), dev);
  };
  const double h = 2;  // bytes of a bf16
  {
    const Tensor src = randn({N, 4 * d}), dst = ops::empty({N, 4 * d}, DType::bf16, dev);
    const double t = b.time([&] { ops::copy_(dst, src); });
    b.bytes_row("copy (the practical peak)", "copy", t, 2 * h * N * 4 * d);
    b.copy_bw = 2 * h * N * 4 * d / t;
  }
  // GPT-2's norms: x + residual normalized (sum and y written), and its backward (gx + the residual's
  // gradient; gw, gb) - the ideal moves x, r in and sum, y out; x, gy, gadd in and gx out.
  const Tensor x = randn({N, d}), r = randn({N, d}), w = randn({d}), bias = randn({d});
  const ops::NormOut ln = ops::add_layer_norm(x, r, w, bias, 1e-5);
  b.bytes_row("add_layer_norm 768", "add_layer_norm",
              b.time([&] { ops::add_layer_norm(x, r, w, bias, 1e-5); }), 4 * h * N * d);
  const Tensor gy = randn({N, d}), ga = randn({N, d});
  b.bytes_row("layer_norm backward 768 (gx only)", "layer_norm_backward_gx", b.time([&] {
    ops::layer_norm_backward(ln.sum, w, ln.mean, ln.rstd, gy, true, false, false, ga);
  }),
              4 * h * N * d);
  b.bytes_row("layer_norm backward 768 (gx gw gb)", "layer_norm_backward", b.time([&] {
    ops::layer_norm_backward(ln.sum, w, ln.mean, ln.rstd, gy, true, true, true, ga);
  }),
              4 * h * N * d);
  // The MLP's bias gradient: [N, 3072] summed over the rows (read once; the 3072 sums are noise).
  {
    const Tensor g = randn({N, 4 * d});
    b.bytes_row("bias gradient 3072 (column sums)", "bias_grad",
                b.time([&] { ops::reduce(ops::ReduceOp::sum, g, {0}, false); }), h * N * 4 * d);
  }
  // GPT-2's residual dropout (p 0.1): x in, y out; a Philox block per four elements.
  b.bytes_row("dropout 768 (p 0.1)", "dropout", b.time([&] { ops::dropout(x, 0.1, 1, 0); }), 2 * h * N * d);
  {
    const Tensor lx = randn({L_rows, L_d}), lw = randn({L_d});
    b.bytes_row("rms_norm 4096 (Llama-8B)", "rms_norm", b.time([&] { ops::rms_norm(lx, lw, 1e-5); }),
                2 * h * L_rows * L_d);
  }
  // GPT-2's loss over its padded head rows: the loss alone reads the logits once; with the gradient written
  // over them, once in and once out.
  {
    std::vector<int64_t> lab(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) lab[static_cast<size_t>(i)] = i * 97 % V;
    const Tensor labels = ops::to_device(ops::from_vector<int64_t>(lab, {N}), dev);
    const Tensor buf = randn({N, ldv}), logits = ops::narrow(buf, 1, 0, V);
    const Tensor g = ops::to_device(ops::full({N}, 1.0 / static_cast<double>(N), DType::f32), dev);
    b.bytes_row("cross_entropy loss 50257", "cross_entropy",
                b.time([&] { ops::cross_entropy(logits, labels, -100); }), h * N * V);
    b.bytes_row("cross_entropy + grad in place", "cross_entropy_fwd_bwd",
                b.time([&] { ops::cross_entropy_with_grad_(logits, labels, -100, g, logits); }),
                2 * h * N * V);
    // The head's GEMM (tokens x 768 -> the padded vocabulary).
    const Tensor hx = randn({N, d}), hw = randn({ldv, d});
    b.flops_row("head GEMM 768 -> 50304", "head_matmul", b.time([&] { ops::matmul(hx, hw, false, true); }, 2),
                2.0 * N * d * ldv);
  }
  {
    const Tensor a = randn({N, d}), w1 = randn({4 * d, d});
    b.flops_row("MLP GEMM 768 -> 3072", "mlp_matmul", b.time([&] { ops::matmul(a, w1, false, true); }),
                2.0 * N * d * 4 * d);
    const Tensor s = randn({N, 1024});
    b.bytes_row("softmax 1024", "softmax", b.time([&] { ops::softmax(s, -1); }), 2 * h * N * 1024);
  }
  {
    // GPT-2's attention (causal, 12 heads of 64) forward and backward as the model runs it: q/k/v read in
    // place from the packed [B, T, 3 x 768] projection, dout as merging heads hands it back. FLOPs of the
    // causal half: two products forward, five backward (7 B H T^2 D).
    const int64_t T = std::min<int64_t>(N, 1024), B = std::max<int64_t>(1, N / T), H = 12, D = 64;
    const Tensor qkv = randn({B, T, 3 * H * D}), dout = ops::transpose(randn({B, T, H, D}), 1, 2);
    auto heads = [&](int64_t i) {
      return ops::transpose(ops::view(ops::narrow(qkv, 2, i * H * D, H * D), {B, T, H, D}), 1, 2);
    };
    const Tensor q = heads(0), k = heads(1), v = heads(2);
    const auto automatic = ops::AttentionForm::automatic;
    for (const double p : {0.0, 0.1}) {
      const ops::AttentionDropout drop{p, 1, 0};
      const double t = b.time(
          [&] {
            const ops::AttentionOut o = ops::attention(q, k, v, Tensor(), true, 0.125, 0, automatic, drop);
            ops::attention_backward(q, k, v, Tensor(), true, 0.125, o.out, o.lse, dout, 0, automatic, drop);
          },
          1);
      b.flops_row(p > 0 ? "attention fwd+bwd, dropout 0.1" : "attention fwd+bwd (causal 12 x 64)",
                  p > 0 ? "attention_dropout" : "attention", t, 7.0 * B * H * T * T * D);
    }
  }
  {
    // AdamW over GPT-2 124M's parameters (at 16384 rows; scaled with them), f32 masters and moments, bf16
    // gradient read and bf16 copy written: 4 + 4 (p) + 8 + 8 (m, v) + 2 (g) + 2 (copy) bytes each.
    const int64_t n = 124'000'000 * N / 16384;
    const Tensor p = randn({n}, DType::f32), m = ops::zeros({n}, DType::f32, dev),
                 v = ops::zeros({n}, DType::f32, dev), g16 = randn({n}),
                 copy = ops::empty({n}, DType::bf16, dev);
    backend::Backend::AdamWHyper hp;
    hp.weight_decay = 0.01;
    b.bytes_row("fused AdamW (124M at 16K rows)", "adamw",
                b.time(
                    [&] {
                      ops::fused_adamw({{p, g16, m, v, true, copy}}, hp, {});
                    },
                    2),
                28.0 * n);
  }
  return 0;
}

}  // namespace
}  // namespace tr

int main(int argc, char** argv) {
  try {
    return tr::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 1;
  }
}
