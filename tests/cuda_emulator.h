// The host emulation of the CUDA built-ins our flash and tiled attention kernels and the row kernels use, so
// that tests run the kernels' own source (backend/cuda/flash_kernels.cuh, attention_tiled.cuh,
// row_kernels.cuh, fused_chain.cuh, blocked_rows.cuh, dropout_packs.cuh, reduce_kernels.cuh,
// optim_kernels.cuh) on the CPU: each CUDA thread of a block is a std::thread, __syncthreads and warp
// collectives are barriers, a kernel's shared memory is a host buffer poisoned with NaN halves before every
// block (a read of what no thread wrote shows up), and mma.sync m16n8k16 gathers the warp's fragments by the
// PTX ISA's layout tables (groupID = lane / 4, thread-in-group = lane % 4) and sums in f64. Include it before
// the kernels' header, in a test translation unit that includes no CUDA header. What it cannot show: races a
// real GPU would expose, __expf's precision, the tensor cores' own rounding.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend/cuda/kernels.h"  // BadIndexKind
#include "core/rng.h"

#define TR_FLASH_EMULATED 1
#define TR_FLASH_NAMESPACE flash_emulated
#define TR_FLASH_SMEM(name) uint4* name = ::tr::emu::shared_memory
#define TR_ATTN_EMULATED 1
#define TR_ATTN_NAMESPACE tiled_emulated
#define TR_ATTN_SMEM(name) double* name = reinterpret_cast<double*>(::tr::emu::shared_memory)
#define TR_ROW_EMULATED 1
#define TR_ROW_NAMESPACE rows_emulated
#define TR_ROW_SMEM(name) double* name = reinterpret_cast<double*>(::tr::emu::shared_memory)
#define TR_CHAIN_EMULATED 1
#define TR_BROWS_EMULATED 1
#define TR_BROWS_NAMESPACE blocked_emulated
#define TR_BROWS_SMEM(name) double* name = reinterpret_cast<double*>(::tr::emu::shared_memory)
#define TR_DROP_EMULATED 1
#define TR_DROP_NAMESPACE drop_emulated
#define TR_RED_EMULATED 1
#define TR_RED_NAMESPACE red_emulated
#define TR_OPT_EMULATED 1
#define TR_OPT_NAMESPACE opt_emulated
#define TR_OPT_SMEM(type, name, count) type* name = reinterpret_cast<type*>(::tr::emu::shared_memory)
#define TR_CHAIN_NAMESPACE chain_emulated
#define __grid_constant__
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)

struct uint4 {
  uint32_t x, y, z, w;
};
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
struct EmulatedDim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmulatedDim3 threadIdx, blockIdx, blockDim, gridDim;

struct __nv_bfloat16 {
  uint16_t x;
};
struct __half {
  uint16_t x;
};
struct __nv_bfloat162 {
  uint16_t x, y;
};
struct __half2 {
  uint16_t x, y;
};

namespace tr::emu {

constexpr int kWarps = 8;  // blocks of up to 256 threads
// The launch in flight (one at a time): its barriers, shared memory and the operand type of its halves.
inline std::barrier<>* block_barrier = nullptr;
inline std::barrier<>* warp_barrier[kWarps] = {};
inline uint4* shared_memory = nullptr;
inline size_t shared_bytes = 0;
inline bool copies_land_at_issue = false;  // cp.async: at once, else at the wait that covers it
inline bool f16 = false;
struct Lane {
  uint32_t a[4], b[2];
  const uint16_t* row;  // ldmatrix: the row address this lane gives
  float f;
  double d;
  uint32_t u;
};
// Two sets, alternating per collective: a lane can be at most one collective ahead of the others (each
// starts with a warp barrier), so one barrier per collective suffices.
inline Lane lanes[2][kWarps][32];
inline thread_local unsigned collective = 0;

inline float bf16_to_float(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float f16_to_float(uint16_t h) {
  const uint32_t s = h >> 15 & 1, e = h >> 10 & 31, m = h & 1023;
  const float v = e == 0    ? std::ldexp(static_cast<float>(m), -24)
                  : e == 31 ? (m ? NAN : INFINITY)
                            : std::ldexp(static_cast<float>(m | 1024), static_cast<int>(e) - 25);
  return s ? -v : v;
}
inline uint16_t float_to_bf16(float f) {  // round to nearest even
  if (std::isnan(f)) return 0x7fc0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + (u >> 16 & 1);
  return static_cast<uint16_t>(u >> 16);
}
inline uint16_t float_to_f16(float f) {  // round to nearest even (exact for the tests' ranges)
  if (std::isnan(f)) return 0x7e00;
  const uint16_t s = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return s | 0x7c00;
  if (a < std::ldexp(1.0, -14)) return s | static_cast<uint16_t>(std::nearbyint(a * std::ldexp(1.0, 24)));
  int e;
  double q = std::nearbyint(std::frexp(a, &e) * 2048.0);  // 11 significant bits
  if (q == 2048.0) q = 1024.0, ++e;
  const int biased = e - 1 + 15;
  if (biased >= 31) return s | 0x7c00;
  return s | static_cast<uint16_t>(biased << 10 | (static_cast<uint16_t>(q) - 1024));
}
inline float half_to_float(uint16_t h) { return f16 ? f16_to_float(h) : bf16_to_float(h); }
inline uint16_t float_to_half(float f) { return f16 ? float_to_f16(f) : float_to_bf16(f); }
inline int warp() { return static_cast<int>(threadIdx.x / 32); }
inline int lane() { return static_cast<int>(threadIdx.x % 32); }
inline void warp_sync() { warp_barrier[warp()]->arrive_and_wait(); }
// This lane's warp's slots for its next collective.
inline Lane* lanes_now() { return lanes[collective++ % 2][warp()]; }

// Runs kernel() as `grid` blocks of `threads` (kWarps warps) with `smem_bytes` of shared memory.
template <typename F>
void launch(unsigned grid, int threads, size_t smem_bytes, F&& kernel) {
  // Whole warps (a partial one would wait forever at its 32-thread barrier), no more than it has barriers
  // for.
  if (threads < 32 || threads % 32 != 0 || threads > kWarps * 32) std::abort();
  std::vector<uint4> smem(smem_bytes / 16 + 1);
  std::memset(smem.data(), 0xff, smem.size() * 16);
  shared_memory = smem.data();
  shared_bytes = smem_bytes;
  std::barrier<> block(threads);
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  for (int w = 0; w < kWarps; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
  block_barrier = &block;
  for (int w = 0; w < kWarps; ++w) warp_barrier[w] = warps[static_cast<size_t>(w)].get();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      threadIdx.x = static_cast<unsigned>(t);
      blockDim.x = static_cast<unsigned>(threads);
      gridDim.x = grid;
      for (unsigned b = 0; b < grid; ++b) {
        blockIdx.x = b;
        kernel();
        block.arrive_and_wait();
        if (t == 0) std::memset(smem.data(), 0xff, smem.size() * 16);  // the next block finds poison
        block.arrive_and_wait();
      }
    });
  for (auto& th : pool) th.join();
}

}  // namespace tr::emu

inline void __syncthreads() { tr::emu::block_barrier->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int mask) {
  tr::emu::Lane* l = tr::emu::lanes_now();
  l[tr::emu::lane()].f = v;
  tr::emu::warp_sync();
  return l[tr::emu::lane() ^ mask].f;
}
inline double __shfl_xor_sync(unsigned, double v, int mask) {
  tr::emu::Lane* l = tr::emu::lanes_now();
  l[tr::emu::lane()].d = v;
  tr::emu::warp_sync();
  return l[tr::emu::lane() ^ mask].d;
}
inline unsigned __shfl_sync(unsigned, unsigned v, int src) {
  tr::emu::Lane* l = tr::emu::lanes_now();
  l[tr::emu::lane()].u = v;
  tr::emu::warp_sync();
  return l[src % 32].u;
}
inline void __syncwarp() { tr::emu::warp_sync(); }
inline float __expf(float x) { return std::exp(x); }
inline void __trap() { std::abort(); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {tr::emu::float_to_bf16(a), tr::emu::float_to_bf16(b)};
}
inline __half2 __floats2half2_rn(float a, float b) {
  return {tr::emu::float_to_f16(a), tr::emu::float_to_f16(b)};
}

namespace tr::cuda::flash_emulated {

// The Philox blocks the flash kernels make (their unqualified calls find this one first): a test reads and
// resets the count to see the dropout's random work per score.
inline std::atomic<int64_t> philox_blocks{0};
inline Philox4 philox4x32(uint64_t counter, uint64_t key) {
  philox_blocks.fetch_add(1, std::memory_order_relaxed);
  return tr::philox4x32(counter, key);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: d (16 x 8) += a (16 x 16, row-major) b (16 x 8,
// column-major), each lane holding the PTX ISA's fragment elements: a's registers 0-3 are (row g, cols 2t,
// 2t+1), (row g+8, same), (row g, cols 2t+8, 2t+9), (row g+8, same); b's (k 2t, 2t+1) and (k 2t+8, 2t+9) of
// column g; c's (row g, cols 2t, 2t+1) then row g+8.
template <typename T>
inline void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::Lane* l = emu::lanes_now();
  const int me = emu::lane();
  for (int r = 0; r < 4; ++r) l[me].a[r] = a[r];
  l[me].b[0] = b0, l[me].b[1] = b1;
  emu::warp_sync();
  auto half_of = [](uint32_t w, int hi) {
    return emu::half_to_float(static_cast<uint16_t>(hi ? w >> 16 : w));
  };
  auto A = [&](int row, int col) {
    return half_of(l[row % 8 * 4 + col % 8 / 2].a[(row >= 8 ? 1 : 0) + (col >= 8 ? 2 : 0)], col % 2);
  };
  auto B = [&](int k, int n) { return half_of(l[n * 4 + k % 8 / 2].b[k >= 8 ? 1 : 0], k % 2); };
  const int g = me / 4, t = me % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
    double acc = d[e];
    for (int k = 0; k < 16; ++k) acc += static_cast<double>(A(row, k)) * B(k, col);
    d[e] = static_cast<float>(acc);
  }
}

// ldmatrix.sync.aligned.m8n8.{x2,x4}[.trans].shared.b16 as the PTX ISA defines it: lane 8 m + r gives the
// address of row r of matrix m; register m of lane 4 g + i gets that matrix's row g, columns 2i and 2i + 1
// (low half first), or with .trans its rows 2i and 2i + 1 of column g.
template <bool Trans, int N>
inline void ldmatrix(uint32_t (&r)[N], const uint16_t* p) {
  emu::Lane* l = emu::lanes_now();
  const int me = emu::lane();
  l[me].row = me < 8 * N ? p : nullptr;  // .x2: lanes 16-31 give no address
  // A row is 16 bytes of this block's shared memory, on a 16-byte boundary (else the GPU faults).
  const auto at = reinterpret_cast<const char*>(p) - reinterpret_cast<const char*>(emu::shared_memory);
  if (me < 8 * N && (at < 0 || at % 16 != 0 || static_cast<size_t>(at) + 16 > emu::shared_bytes))
    std::abort();
  emu::warp_sync();
  const int g = me / 4, i = me % 4;
  for (int m = 0; m < N; ++m) {
    auto row = [&](int k) { return l[8 * m + k].row; };  // lanes 8m .. 8m + 7 give the matrix's rows
    const uint16_t lo = Trans ? row(2 * i)[g] : row(g)[2 * i];
    const uint16_t hi = Trans ? row(2 * i + 1)[g] : row(g)[2 * i + 1];
    r[m] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
  }
}
// cp.async as the ISA allows it to behave: a copy lands at the latest by the wait_group that covers its group
// - here exactly then, so a read of a tile before its wait finds the previous tile or poison - or, with
// emu::copies_land_at_issue, at once, so a copy into a buffer other warps still read (a missing
// __syncthreads) overwrites it under them.
struct AsyncCopy {
  void* dst;
  const void* src;
  int size, bytes;  // size bytes land: the first `bytes` from src, zeros after
  int group;
};
inline thread_local std::vector<AsyncCopy> async_copies;
inline thread_local int async_groups = 0;  // groups committed by this thread
inline void land(const AsyncCopy& c) {
  std::memset(c.dst, 0, static_cast<size_t>(c.size));
  std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
}
inline void copy_async(void* dst, const void* src, int size, int bytes) {
  const AsyncCopy c{dst, src, size, bytes, async_groups};
  if (emu::copies_land_at_issue)
    land(c);
  else
    async_copies.push_back(c);
}
inline void cp_async16(uint16_t* dst, const uint16_t* src, int bytes) { copy_async(dst, src, 16, bytes); }
inline void cp_async4(float* dst, const float* src, int bytes) { copy_async(dst, src, 4, bytes); }
inline void cp_async_commit() { ++async_groups; }
template <int N>
inline void cp_async_wait() {
  std::vector<AsyncCopy> later;
  for (const AsyncCopy& c : async_copies) {
    if (c.group < async_groups - N)
      land(c);
    else
      later.push_back(c);
  }
  async_copies = std::move(later);
}

template <bool Trans>
inline void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* p) {
  ldmatrix<Trans, 4>(r, p);
}
template <bool Trans>
inline void ldmatrix_x2(uint32_t (&r)[2], const uint16_t* p) {
  ldmatrix<Trans, 2>(r, p);
}

}  // namespace tr::cuda::flash_emulated

// What the tiled attention and row kernels take from backend/cuda/common.cuh: accumulator types (f32 for the
// halves, as on the device), loads that widen and stores that round to nearest even, the bad-index report,
// and the host's exp and log overloads.
namespace tr::cuda {
template <typename T>
struct EmulatedAcc {
  using type = T;
};
template <>
struct EmulatedAcc<__nv_bfloat16> {
  using type = float;
};
template <>
struct EmulatedAcc<__half> {
  using type = float;
};
template <typename T>
using acc_t = typename EmulatedAcc<T>::type;
template <typename T>
inline acc_t<T> ld(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return emu::bf16_to_float(p[i].x);
  else if constexpr (std::is_same_v<T, __half>)
    return emu::f16_to_float(p[i].x);
  else
    return p[i];
}
template <typename T, typename A>
inline void st(T* p, int64_t i, A v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    p[i].x = emu::float_to_bf16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __half>)
    p[i].x = emu::float_to_f16(static_cast<float>(v));
  else
    p[i] = static_cast<T>(v);
}
template <typename T>
inline acc_t<T> to_acc(T x) {
  return ld(&x, 0);
}
template <typename T>
inline T from_acc(acc_t<T> v) {
  T r;
  st(&r, 0, v);
  return r;
}
inline void report_bad(int64_t* bad, int64_t kind, int64_t value, int64_t limit) {
  bad[0] = value;
  bad[2] = limit;
  bad[1] = kind;
}
using std::exp;
using std::isfinite;
using std::log;
}  // namespace tr::cuda
