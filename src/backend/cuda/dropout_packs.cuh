// CUDA dropout over contiguous arrays (elementwise.cu launches it): y = x * keep / (1 - p), keep[i] when
// uniform(philox_word(seed, offset, i)) >= p - the CPU's mask. In a header of its own so that the CPU runs
// this very code (tests/cuda_emulator.h; tests/test_blocked_rows_emulated.cpp against the CPU backend).
// Bound by Philox's integer work more than by HBM (2-4 bytes read and written per element), hence the packs.
#pragma once
#include <cstdint>

#include "backend/cuda/kernel_basics.cuh"
#include "core/rng.h"
#ifndef TR_DROP_EMULATED
#include "backend/cuda/common.cuh"  // acc_t, to_acc, from_acc (the emulation brings its own)
#endif

// The kernels' namespace (the emulation's own, so its host copies never meet the device build's symbols).
#ifndef TR_DROP_NAMESPACE
#define TR_DROP_NAMESPACE drop
#endif

namespace tr::cuda::TR_DROP_NAMESPACE {

template <typename T>
struct DropoutF {
  float p;
  acc_t<T> scale;
  uint64_t seed, offset;
  const uint64_t* shift;  // a CUDA graph's launch: added to offset (null: none)
  __device__ T operator()(int64_t i, T x) const {
    const uint64_t at = offset + (shift ? *shift : 0);
    const bool keep = uniform_from_word(philox_word(seed, at, static_cast<uint64_t>(i))) >= p;
    return from_acc<T>(keep ? to_acc(x) * scale : acc_t<T>(0));
  }
};

// Dropout over contiguous arrays in 16-byte packs of V elements (V a multiple of 4): the pack's V Philox
// words from V / 4 blocks, where DropoutF through map1 made a block per element - ~80 integer instructions
// each, which bound the kernel at several times its memory traffic. The words are philox_word's: the same
// mask.
template <int V, typename T>
__global__ void dropout_packs_kernel(const T* x, T* y, int64_t n, float p, acc_t<T> scale, uint64_t seed,
                                     uint64_t offset, const uint64_t* shift) {
  const uint64_t at = offset + (shift ? *shift : 0);
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t packs = n / V;
  for (int64_t j = first; j < packs; j += step) {
    const Pack<T, V> in = reinterpret_cast<const Pack<T, V>*>(x)[j];
    uint32_t w[V];
    philox_block_words(seed, at, static_cast<uint64_t>(j * V), w);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k)
      out.v[k] = from_acc<T>(uniform_from_word(w[k]) >= p ? to_acc(in.v[k]) * scale : acc_t<T>(0));
    reinterpret_cast<Pack<T, V>*>(y)[j] = out;
  }
  const DropoutF<T> f{p, scale, seed, offset, shift};
  for (int64_t i = packs * V + first; i < n; i += step) y[i] = f(i, x[i]);
}

// Dropout's keep mask alone: y[i] = 1 where dropout over an array of n elements with (seed, offset) keeps
// element i, 0 where it drops it - cuDNN's attention multiplies its probabilities by it. The same words, in
// the same packs, as dropout_packs_kernel; bound by Philox's integer work (2 bytes written per element).
template <int V, typename T>
__global__ void keep_mask_packs_kernel(T* y, int64_t n, float p, uint64_t seed, uint64_t offset,
                                       const uint64_t* shift) {
  const uint64_t at = offset + (shift ? *shift : 0);
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t packs = n / V;
  const T one = from_acc<T>(acc_t<T>(1)), zero = from_acc<T>(acc_t<T>(0));
  for (int64_t j = first; j < packs; j += step) {
    uint32_t w[V];
    philox_block_words(seed, at, static_cast<uint64_t>(j * V), w);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = uniform_from_word(w[k]) >= p ? one : zero;
    reinterpret_cast<Pack<T, V>*>(y)[j] = out;
  }
  for (int64_t i = packs * V + first; i < n; i += step)
    y[i] = uniform_from_word(philox_word(seed, at, static_cast<uint64_t>(i))) >= p ? one : zero;
}

}  // namespace tr::cuda::TR_DROP_NAMESPACE
