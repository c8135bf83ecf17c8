// CUDA flash attention for bf16/f16 on tensor cores (sm_80+): FlashAttention-2's schedule on mma.sync
// m16n8k16 with f32 accumulation. Forward: a block of 4 warps owns 64 queries (16 a warp) and streams 64-key
// tiles of K and V through shared memory; the scores stay in registers, the online softmax rescales the
// output accumulators, and the probabilities (times dropout's factors) feed the P V product straight from the
// score fragments (an m16n8 accumulator pair is an m16k16 A fragment). Backward recomputes the tiles from the
// saved logsumexp: one kernel per query tile for dq, one per key tile for dk/dv (summing grouped query heads
// in the block), so there are no atomics and the result is deterministic, as attention.cu's tiled kernels.
// Fragments come from shared memory by ldmatrix (four 8 x 8 matrices an instruction, transposed for the
// P V operand); the forward streams K and V by cp.async, the next tile's K copied in under this tile's
// softmax and P V and its V under the next Q K^T (159 registers at head dim 64 on sm_90: 3 blocks an SM).
// The backward kernels double-buffer theirs by cp.async: the next tile (K and V for dq; Q, dO, lse and
// delta for dk/dv) comes in under the whole of this one's work, one barrier a tile. That takes 54-55 KiB of
// shared memory at head dim 64 and 102-103 KiB at 128: two blocks an SM on an H100/H200, as their ~240
// registers allow anyway; where an SM would hold fewer (an A100 at head dim 128, an RTX 4090) they take one
// slot, the next tile copied in after this one's work. Dropout's Philox blocks (~80 integer
// instructions each) are made once per four keep words: a lane makes those of 32 keys of one row (16 keys
// of two queries in dk/dv) and the warp trades them by shuffles - 8-9 blocks per lane and 64 x 64 tile in
// each kernel, where a block per score pair (forward, dq: 16-24) or per score (dk/dv: 32) outweighed the
// tile's mma work several times. The semantics are Backend::attention's; the CPU twin is
// backend/cpu/attention_gemm.cpp (dropout as attn::drop_factors).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "backend/attention_geometry.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/flash_kernels.cuh"
#include "core/rng.h"

namespace tr::cuda {

namespace {

using namespace flash;

// delta = rowsum(dout * out) in f32, a warp per row (rows bh * T + t strided over the grid, which blocks_for
// caps).
template <typename T>
__global__ void flash_delta(Geo g, const T* out, const T* dout, float* delta) {
  const int64_t warps = gridDim.x * static_cast<int64_t>(blockDim.x / 32), rows = g.B * g.H * g.T;
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32; row < rows;
       row += warps) {
    const int64_t t = row % g.T, bh = row / g.T, b = bh / g.H, h = bh % g.H;
    const T* o = out + g.rows.out.at(b, h, t);
    const T* d = dout + g.rows.dout.at(b, h, t);
    float s = 0.0f;
    for (int64_t c = threadIdx.x % 32; c < g.D; c += 32) s += ld(o, c) * ld(d, c);
    for (int o2 = 16; o2 > 0; o2 >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o2);
    if (threadIdx.x % 32 == 0) delta[row] = s;
  }
}

// Opts a kernel into more than 48 KiB of dynamic shared memory (the flash kernels need at most 103 KiB).
template <typename K>
void use_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    TR_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The current device's shared memory a block may opt into, or an SM holds (per_sm).
size_t smem_bytes(bool per_sm = false) {
  int dev = 0, bytes = 0;
  TR_CUDA_CHECK(cudaGetDevice(&dev));
  TR_CUDA_CHECK(cudaDeviceGetAttribute(
      &bytes, per_sm ? cudaDevAttrMaxSharedMemoryPerMultiprocessor : cudaDevAttrMaxSharedMemoryPerBlockOptin,
      dev));
  return static_cast<size_t>(bytes);
}

// Calls f.template operator()<T, DP>() with the CUDA half type and the head dim padded to 64 or 128.
template <typename F>
void dispatch_flash(DType dt, int64_t D, F&& f) {
  const auto by_dim = [&]<typename T>() {
    if (D <= 64)
      f.template operator()<T, 64>();
    else
      f.template operator()<T, 128>();
  };
  if (dt == DType::bf16)
    by_dim.template operator()<__nv_bfloat16>();
  else
    by_dim.template operator()<__half>();
}

}  // namespace

bool flash_attention_fits(DType dt, int64_t D) {
  if ((dt != DType::bf16 && dt != DType::f16) || D <= 0 || D % 8 != 0 || D > 128) return false;
  int dev = 0, major = 0;
  TR_CUDA_CHECK(cudaGetDevice(&dev));
  TR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  const size_t need = D <= 64 ? std::max(forward_smem<64>(), dkv_smem<64, 1>())
                              : std::max(forward_smem<128>(), dkv_smem<128, 1>());
  return major >= 8 && smem_bytes() >= need;
}

void flash_attention(Stream stream, DType dt, const Geo& g, const void* q, const void* k, const void* v,
                     void* out, void* lse, const uint64_t* shift) {
  if (g.B * g.H * g.T == 0) return;
  const bool vec = half_rows_aligned({{q, g.rows.q}, {k, g.rows.k}, {v, g.rows.v}}, 16);
  const auto blocks = static_cast<unsigned>(g.B * g.H * ((g.T + kOwn - 1) / kOwn));
  dispatch_flash(dt, g.D, [&]<typename T_, int DP>() {
    use_smem(flash_forward<T_, DP>, forward_smem<DP>());
    flash_forward<T_, DP><<<blocks, kThreads, forward_smem<DP>(), stream>>>(
        g, g.dropout > 0 ? shift : nullptr, static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k),
        static_cast<const uint16_t*>(v), static_cast<uint16_t*>(out), static_cast<float*>(lse), vec);
  });
  TR_CUDA_LAUNCH_CHECK("flash_attention");
}

void flash_attention_backward(Stream stream, DType dt, const Geo& g, const void* q, const void* k,
                              const void* v, const void* out, const void* lse, const void* dout, void* dq,
                              void* dk, void* dv, const uint64_t* shift, Scratch& scratch) {
  if (g.B * g.H * g.T == 0) return;  // no queries: ops::attention_backward gives zero dk/dv itself
  if (g.dropout == 0) shift = nullptr;
  const bool vec = half_rows_aligned({{q, g.rows.q}, {k, g.rows.k}, {v, g.rows.v}, {dout, g.rows.dout}}, 16);
  const int64_t B = g.B, H = g.H, KV = g.KV, T = g.T, S = g.S;
  auto* delta = static_cast<float*>(scratch.take(static_cast<size_t>(B * H * T) * sizeof(float)));
  const auto* lp = static_cast<const float*>(lse);
  const auto* qp = static_cast<const uint16_t*>(q);
  const auto* kp = static_cast<const uint16_t*>(k);
  const auto* vp = static_cast<const uint16_t*>(v);
  const auto* dop = static_cast<const uint16_t*>(dout);
  const auto qblocks = static_cast<unsigned>(B * H * ((T + kOwn - 1) / kOwn));
  const auto kblocks = static_cast<unsigned>(B * KV * ((S + kOwn - 1) / kOwn));
  const size_t smem = smem_bytes(), smem_sm = smem_bytes(true);
  const auto kernels = [&]<typename T_, int DP, int Slots>() {
    use_smem(flash_dq<T_, DP, Slots>, dq_smem<DP, Slots>());
    flash_dq<T_, DP, Slots><<<qblocks, kThreads, dq_smem<DP, Slots>(), stream>>>(
        g, shift, qp, kp, vp, lp, delta, dop, static_cast<uint16_t*>(dq), vec);
    TR_CUDA_LAUNCH_CHECK("flash_attention_dq");
    if (kblocks > 0) {
      use_smem(flash_dkv<T_, DP, Slots>, dkv_smem<DP, Slots>());
      flash_dkv<T_, DP, Slots><<<kblocks, kThreads, dkv_smem<DP, Slots>(), stream>>>(
          g, shift, qp, kp, vp, lp, delta, dop, static_cast<uint16_t*>(dk), static_cast<uint16_t*>(dv), vec);
      TR_CUDA_LAUNCH_CHECK("flash_attention_dkv");
    }
  };
  dispatch_flash(dt, g.D, [&]<typename T_, int DP>() {
    flash_delta<T_><<<blocks_for(B * H * T * 32, 256), 256, 0, stream>>>(g, static_cast<const T_*>(out),
                                                                         static_cast<const T_*>(dout), delta);
    TR_CUDA_LAUNCH_CHECK("flash_attention_delta");
    // Two slots where an SM still holds the two blocks the kernels' ~240 registers allow (1 KiB each for the
    // system): an H100/H200 (228 KiB an SM); an A100 (164) takes one at head dim 128, an RTX 4090 (100) one
    // at both.
    const size_t two = std::max(dq_smem<DP, 2>(), dkv_smem<DP, 2>());
    if (smem >= two && smem_sm >= 2 * (two + 1024))
      kernels.template operator()<T_, DP, 2>();
    else
      kernels.template operator()<T_, DP, 1>();
  });
}

}  // namespace tr::cuda
