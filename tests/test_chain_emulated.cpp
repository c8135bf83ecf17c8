// The CUDA fused elementwise chain's own source (backend/cuda/fused_chain.cuh) run on the CPU through
// tests/cuda_emulator.h, against the CPU backend's fused_elementwise on the same stages: the chains
// compile::fuse_elementwise makes (dropout + residual add, the GELU backward with its gradient adds, exp /
// affine / binary runs), f32 and bf16, a grid smaller than the tensors (the grid-stride loop), values kept
// and not stored, and dropout with a CUDA graph's Philox shift - bit for bit; with one or two dropout stages
// the kernel makes one Philox block per four elements each (counted). What the GPU itself adds (its
// exp and tanh) is the device's to show: CompileGpu.* there.
#include "cuda_emulator.h"  // first: the CUDA built-ins the kernel's header expects

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <atomic>

#include "backend/backend.h"

// The Philox blocks the chain kernel makes (its unqualified calls find this one first).
namespace tr::cuda::chain_emulated {
inline std::atomic<int64_t> philox_blocks{0};
inline Philox4 philox4x32(uint64_t counter, uint64_t key) {
  philox_blocks.fetch_add(1, std::memory_order_relaxed);
  return tr::philox4x32(counter, key);
}
}  // namespace tr::cuda::chain_emulated

#include "backend/cuda/fused_chain.cuh"
#include "backend/cuda/fused_chain_of.h"
#include "ops/ops.h"

namespace tr {
namespace {

namespace ck = cuda::chain_emulated;
using Stage = backend::Backend::FusedStage;
using Kind = Stage::Kind;

Stage stage(Kind kind, std::initializer_list<int32_t> in, int32_t out) {
  Stage s;
  s.kind = kind;
  int j = 0;
  for (int32_t o : in) s.in[j++] = o;
  s.out = out;
  return s;
}

// Runs `stages` over `count` tensors of n elements (inputs drawn, outputs poisoned) on the CPU backend and
// through the emulated kernel; every tensor's bytes must agree.
template <typename T>
void check_chain(const char* what, const std::vector<Stage>& stages, int count, DType dt, uint64_t shift,
                 int64_t n = 1000) {
  SCOPED_TRACE(fmt::format("{} in {}, shift {}, {} elements", what, dtype_name(dt), shift, n));
  std::vector<Tensor> cpu;
  Generator gen(17);
  for (int k = 0; k < count; ++k)
    cpu.push_back(ops::to_dtype(ops::affine(ops::randn({n}, gen), 1.5, 0.25), dt));
  std::vector<std::vector<T>> dev(static_cast<size_t>(count));
  for (int k = 0; k < count; ++k) {
    dev[static_cast<size_t>(k)].resize(static_cast<size_t>(n));
    std::memcpy(dev[static_cast<size_t>(k)].data(), cpu[static_cast<size_t>(k)].data_ptr(), n * sizeof(T));
  }
  // The CPU runs the stages with the shift already in their offsets (what a replay of a plan does there).
  std::vector<Stage> shifted = stages;
  for (Stage& s : shifted) s.offset += shift;
  backend::backend_for(Device::cpu()).fused_elementwise(shifted, cpu);

  std::vector<void*> ptrs;
  for (int k = 0; k < count; ++k) ptrs.push_back(dev[static_cast<size_t>(k)].data());
  const cuda::FusedChain c = cuda::chain_of(stages, ptrs);  // the backend's own conversion
  const cuda::FusedChain p = ck::prepared(c);
  const uint64_t word = shift;
  ck::philox_blocks = 0;
  const int elements = ck::chain_elements(p);  // the launcher's choice: 4 with a dropout stage, else 1
  emu::launch(3, 64, 0, [&] {                  // 192 threads
    if (elements == 4)
      ck::fused_chain_kernel<T, 4>(p, n, shift ? &word : nullptr);
    else
      ck::fused_chain_kernel<T, 1>(p, n, shift ? &word : nullptr);
  });
  // A dropout stage makes one Philox block per four elements (one per element made four times as many).
  const auto drops =
      std::count_if(stages.begin(), stages.end(), [](const Stage& s) { return s.kind == Kind::dropout; });
  if (drops <= 2) {  // (the kernel keeps two stages' blocks of a quad; a third takes the second's place)
    EXPECT_EQ(ck::philox_blocks.load(), drops * ((n + 3) / 4)) << "Philox blocks";
  }
  for (int k = 0; k < count; ++k)
    EXPECT_EQ(0, std::memcmp(dev[static_cast<size_t>(k)].data(), cpu[static_cast<size_t>(k)].data_ptr(),
                             n * sizeof(T)))
        << "tensor " << k;
}

template <typename T>
void check_all(DType dt) {
  // Dropout into a kept value, plus the residual: GPT-2's attention/MLP output (t0 x, t1 residual, t2 out).
  Stage drop = stage(Kind::dropout, {0}, -1);
  drop.alpha = 0.1, drop.seed = 1234, drop.offset = 77;
  const Stage add = stage(Kind::binary, {-1, 1}, 2);
  for (const uint64_t shift : {uint64_t{0}, uint64_t{5}})
    for (const int64_t n : {1000, 1003, 3})  // the kernel's quads of elements, a ragged last one
      check_chain<T>("dropout + residual", {drop, add}, 3, dt, shift, n);
  // Two dropout stages in one chain: each its own block of every quad.
  Stage drop2 = drop;
  drop2.in[0] = 1, drop2.alpha = 0.3, drop2.seed = 99, drop2.offset = 5;
  const Stage add2 = stage(Kind::binary, {-1, -2}, 2);
  check_chain<T>("two dropouts", {drop, drop2, add2}, 3, dt, 5, 1001);
  Stage drop3 = drop2;
  drop3.in[0] = 2, drop3.alpha = 0.5, drop3.offset = 9;
  const Stage add3 = stage(Kind::binary, {-3, -4}, 2);  // (drop + drop2) + drop3
  check_chain<T>("three dropouts", {drop, drop2, add2, drop3, add3}, 3, dt, 0, 1002);
  // The GELU backward, scaled and accumulated: t0 x, t1 gy, t2 accumulated gradient; stores t3 and t2.
  Stage gelu = stage(Kind::unary_backward, {0, 1}, 3);
  gelu.unary = backend::UnaryOp::gelu_tanh;
  Stage half = stage(Kind::affine, {-1}, -1);
  half.alpha = 0.5, half.beta = 0.0;
  Stage acc = stage(Kind::binary, {2, -2}, 2);
  check_chain<T>("gelu backward + accumulate", {gelu, half, acc}, 4, dt, 0);
  // exp, a product with a tensor, an affine and a subtraction of the first value (t0, t1; out t2, t3).
  Stage e = stage(Kind::unary, {0}, -1);
  e.unary = backend::UnaryOp::exp;
  Stage mul = stage(Kind::binary, {-1, 1}, 2);
  mul.binary = backend::BinaryOp::mul;
  Stage aff = stage(Kind::affine, {-2}, -1);
  aff.alpha = -1.25, aff.beta = 3.0;
  Stage sub = stage(Kind::binary, {-3, -1}, 3);
  sub.binary = backend::BinaryOp::sub;
  check_chain<T>("exp, mul, affine, sub", {e, mul, aff, sub}, 4, dt, 0);
}

TEST(ChainEmulated, TheCudaChainGivesTheCpuChainsBits) {
  check_all<float>(DType::f32);
  check_all<__nv_bfloat16>(DType::bf16);
}

}  // namespace
}  // namespace tr
