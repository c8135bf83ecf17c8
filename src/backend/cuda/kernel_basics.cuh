// What the kernels share that needs only CUDA's built-ins (threadIdx, shuffles, __syncthreads): block
// reductions and 16-byte packs. Apart from common.cuh so that the headers the CPU runs through
// tests/cuda_emulator.h (which defines those built-ins for the host) take them too.
#pragma once
#include <cstdint>

namespace tr::cuda {

// Sum / max over a block of blockDim.x (a multiple of 32, <= 1024) threads; every thread gets the result.
template <typename A>
__device__ A block_sum(A v, A* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  A t = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) t += shared[w];
  return t;
}

template <typename A>
__device__ A block_max(A v, A* shared) {
  for (int o = 16; o > 0; o >>= 1) {
    A u = __shfl_xor_sync(0xffffffffu, v, o);
    v = (u != u || u > v) ? u : v;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  A t = shared[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
    t = (shared[w] != shared[w] || shared[w] > t) ? shared[w] : t;
  return t;
}

// 16-byte access: V elements moved as one aligned vector load/store.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

}  // namespace tr::cuda
