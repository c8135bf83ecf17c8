// What the kernels share that needs only CUDA's built-ins (threadIdx, shuffles, __syncthreads): block
// reductions, their chunking and 16-byte packs. Apart from common.cuh so that the headers the CPU runs
// through tests/cuda_emulator.h (which defines those built-ins for the host) take them too.
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

// How many chunks a reduction of length r with m outputs splits into: enough threads to fill a GPU (~64K),
// chunks of at least min_rows elements, at most 4096 of them. 1: one thread per output suffices.
inline int64_t reduce_chunks(int64_t m, int64_t r, int64_t min_rows = 64) {
  if (m >= 65536 || r <= 2 * min_rows) return 1;
  int64_t c = (65536 + m - 1) / m;
  const int64_t by_len = (r + min_rows - 1) / min_rows;
  if (c > by_len) c = by_len;
  if (c > 4096) c = 4096;
  return c < 1 ? 1 : c;
}

// 16-byte access: V elements moved as one aligned vector load/store.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

}  // namespace tr::cuda
