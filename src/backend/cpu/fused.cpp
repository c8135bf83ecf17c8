// The CPU's fused elementwise chains (torch_compile's inductor fusion, backend.h FusedStage): the tensors are
// walked in chunks small enough for L1, and each stage runs the unfused call's kernel
// (elementwise_kernels.h) on the chunk, so every value has the unfused bits while the chain's data is read
// from memory once and its intermediates never are. Bound by memory bandwidth (or the slowest stage's math).
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/elementwise_kernels.h"

namespace tr::cpu {

namespace {

using Stage = backend::Backend::FusedStage;
constexpr int64_t kChunk = 1024;  // elements: a few stages' values of f32 fit in L1

template <typename T>
void run_stage(const Stage& s, const T* const* in, T* out, int64_t lo, int64_t n) {
  switch (s.kind) {
    case Stage::Kind::unary:
      dispatch_unary(s.unary, [&]<backend::UnaryOp OP>() { unary_kernel<T, OP>(in[0], out, n); });
      return;
    case Stage::Kind::unary_backward:
      dispatch_unary(s.unary, [&]<backend::UnaryOp OP>() { unary_grad_kernel<T, OP>(in[0], in[1], out, n); });
      return;
    case Stage::Kind::binary:
      dispatch_binary(s.binary, [&]<backend::BinaryOp OP>() { binary_kernel<T, OP>(in[0], in[1], out, n); });
      return;
    case Stage::Kind::affine: affine_kernel(in[0], out, n, s.alpha, s.beta); return;
    case Stage::Kind::dropout:  // an element's Philox word is its index in the tensor
      dropout_kernel(in[0], out, n, lo, s.alpha, s.seed, s.offset);
      return;
  }
}

int operands(Stage::Kind k) { return k == Stage::Kind::binary || k == Stage::Kind::unary_backward ? 2 : 1; }

}  // namespace

void CpuBackend::fused_elementwise(const std::vector<Stage>& stages, const std::vector<Tensor>& t) {
  check_fused_chain(stages, t);
  const int64_t n = t[0].numel();
  const DType dt = t[0].dtype();
  const auto ns = static_cast<int64_t>(stages.size());
  dispatch_float(dt, "fused_elementwise", [&]<typename T>() {
    std::vector<T*> base(t.size());
    for (size_t i = 0; i < t.size(); ++i) base[i] = static_cast<T*>(t[i].data_ptr());
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel num_threads(threads_for(n* ns))
    {
      // A value that is not stored lives in the chunk buffer of its stage.
      std::vector<T> scratch(static_cast<size_t>(ns * kChunk));
      std::vector<T*> value(static_cast<size_t>(ns));
#pragma omp for schedule(static)
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t lo = c * kChunk, len = std::min(kChunk, n - lo);
        for (int64_t k = 0; k < ns; ++k) {
          const Stage& s = stages[static_cast<size_t>(k)];
          const T* in[2] = {nullptr, nullptr};
          for (int j = 0; j < operands(s.kind); ++j)
            in[j] = s.in[j] >= 0 ? base[static_cast<size_t>(s.in[j])] + lo
                                 : value[static_cast<size_t>(-1 - s.in[j])];
          T* out = s.out >= 0 ? base[static_cast<size_t>(s.out)] + lo : scratch.data() + k * kChunk;
          value[static_cast<size_t>(k)] = out;
          run_stage(s, in, out, lo, len);
        }
      }
    }
  });
}

}  // namespace tr::cpu
