// The CUDA fused elementwise chain (torch_compile's inductor fusion; elementwise.cu launches it), in a header
// of its own so that the CPU runs this very code: tests/cuda_emulator.h defines the CUDA built-ins and
// tests/test_chain_emulated.cpp compares it with the CPU backend's fused chains bit for bit. Bound by memory
// bandwidth like one elementwise kernel: the chain's tensors are read and written once.
#pragma once
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/unary_math.h"
#include "core/rng.h"
#ifndef TR_CHAIN_EMULATED
#include "backend/cuda/common.cuh"  // acc_t, to_acc, from_acc (the emulation brings its own)
#endif

// The kernel's namespace (the emulation's own, so its host copy never meets the device build's symbols).
#ifndef TR_CHAIN_NAMESPACE
#define TR_CHAIN_NAMESPACE chain
#endif

namespace tr::cuda::TR_CHAIN_NAMESPACE {

// What the launcher settles on the host before a launch: dropout's keep scale, 1 / (1 - p) in f64 as the
// unfused kernel computes it, into the stage's beta.
inline FusedChain prepared(const FusedChain& chain) {
  FusedChain c = chain;
  for (int k = 0; k < c.stages; ++k)
    if (c.stage[k].kind == FusedChainStage::Kind::dropout) c.stage[k].beta = 1.0 / (1.0 - c.stage[k].alpha);
  return c;
}

// Elements a thread takes (E): four consecutive ones where the chain has a dropout stage, so the stage makes
// one Philox block for them (element i takes word i % 4 of block i / 4) where a thread per element made it
// four times (~80 integer instructions each, several times the chain's memory traffic); one otherwise, each
// warp access then whole 128-byte lines (four a thread puts a warp's loads and stores 4 elements apart).
inline int chain_elements(const FusedChain& c) {
  for (int k = 0; k < c.stages; ++k)
    if (c.stage[k].kind == FusedChainStage::Kind::dropout) return 4;
  return 1;
}

// E consecutive elements a thread (grid-stride over groups of E; see chain_elements). The chain (~1.2 KB) is
// a __grid_constant__ parameter, read in place rather than copied per thread, since stages and operands are
// indexed at run time; the stage values live in a small per-thread array. The element math is the unfused
// functors' (UnaryF, UnaryBackwardF, BinaryF, AffineF, DropoutF: unary_math.h and rng.h), each stage's value
// rounded to T as a stored tensor would be, so a fused chain gives their bits. `shift` (a CUDA graph's
// launch, or null) moves dropout's Philox offsets.
template <typename T, int E>
__global__ void fused_chain_kernel(const __grid_constant__ FusedChain c, int64_t n, const uint64_t* shift) {
  static_assert(E == 1 || E == 4, "a thread's elements share Philox blocks of four");
  using A = acc_t<T>;
  const uint64_t moved = shift ? *shift : 0;
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x, groups = (n + E - 1) / E;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < groups; q += step) {
    // The Philox blocks of this group for two dropout stages (made0, made1: which; -1 none yet). A chain has
    // one dropout stage, two at most in practice; a third takes the second slot over each time.
    Philox4 block0{}, block1{};
    int made0 = -1, made1 = -1;
    for (int64_t i = E * q; i < E * q + E && i < n; ++i) {
      A value[kFusedStages];
      for (int k = 0; k < c.stages; ++k) {
        const FusedChainStage& s = c.stage[k];
        const auto in = [&](int j) {
          const int32_t o = s.in[j];
          return o >= 0 ? to_acc(static_cast<const T*>(c.tensor[o])[i]) : value[-1 - o];
        };
        A v;
        switch (s.kind) {
          case FusedChainStage::Kind::unary: v = backend::unary_fn(s.unary, in(0)); break;
          case FusedChainStage::Kind::unary_backward: v = in(1) * backend::unary_grad(s.unary, in(0)); break;
          case FusedChainStage::Kind::binary: v = backend::binary_fn(s.binary, in(0), in(1)); break;
          case FusedChainStage::Kind::affine:
            v = static_cast<A>(s.alpha) * in(0) + static_cast<A>(s.beta);
            break;
          default: {  // dropout: the element's Philox word is its index in the tensor (philox_word's)
            if (made0 != k && made1 != k) {
              const Philox4 made = philox4x32(s.offset + moved + static_cast<uint64_t>(i / 4), s.seed);
              if (made0 < 0)
                block0 = made, made0 = k;
              else
                block1 = made, made1 = k;
            }
            const int64_t e = i % 4;  // word e of the stage's block, by selects (no local memory)
            const uint32_t w0 = made0 == k ? block0.w[0] : block1.w[0],
                           w1 = made0 == k ? block0.w[1] : block1.w[1];
            const uint32_t w2 = made0 == k ? block0.w[2] : block1.w[2],
                           w3 = made0 == k ? block0.w[3] : block1.w[3];
            const uint32_t w = e == 0 ? w0 : e == 1 ? w1 : e == 2 ? w2 : w3;
            const float p = static_cast<float>(s.alpha);
            v = uniform_from_word(w) >= p ? in(0) * static_cast<A>(s.beta) : A(0);  // beta: 1 / (1 - p)
          }
        }
        const T r = from_acc<T>(v);
        value[k] = to_acc(r);
        if (s.out >= 0) static_cast<T*>(c.tensor[s.out])[i] = r;
      }
    }
  }
}

}  // namespace tr::cuda::TR_CHAIN_NAMESPACE
