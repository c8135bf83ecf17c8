// The flash attention kernels themselves (flash_attention.cu launches them; the semantics and the schedule
// are described there), in a header of their own so that the CPU can run this very code:
// tests/cuda_emulator.h defines the CUDA built-ins and mma.sync for the host and
// tests/test_flash_emulated.cpp runs every kernel against an f64 reference - the parity test of kernels that
// otherwise only run on a GPU.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/attention_geometry.h"
#include "core/rng.h"

// A kernel's dynamic shared memory (the emulation points it at a host buffer).
#ifndef TR_FLASH_SMEM
#define TR_FLASH_SMEM(name) extern __shared__ uint4 name[]
#endif

// The kernels' namespace (the emulation's own, so its host copies never meet the device build's symbols).
#ifndef TR_FLASH_NAMESPACE
#define TR_FLASH_NAMESPACE flash
#endif

namespace tr::cuda::TR_FLASH_NAMESPACE {

using Geo = backend::AttentionGeometry;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kOwn = 16 * kWarps;  // rows a block owns: queries (forward, dq) or keys (dk/dv)
constexpr int kTile = 64;          // rows of a streamed tile: keys (forward, dq) or queries (dk/dv)
constexpr int kN = kTile / 8;      // its n-blocks of 8

// Shared-memory row pitch in halves: 8 more than the padded head dim, so the fragment loads of the 8 row
// groups x 4 lanes of a warp hit 32 different banks.
template <int DP>
constexpr int pitch() {
  return DP + 8;
}

#ifndef TR_FLASH_EMULATED  // (the CPU emulation, tests/cuda_emulator.h, brings its own)
// d += a b for one 16 x 8 x 16 product (a: row-major 16 x 16, b: column-major 16 x 8).
template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)d, (void)a, (void)b0, (void)b1;
  __trap();  // flash_attention_fits() keeps older devices off these kernels
#endif
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: four 8 x 8 matrices of halves from shared memory in one
// instruction. Lane 8 m + r gives the address of row r of matrix m (16 bytes, 16-byte aligned); register m
// receives, at lane (g, i) = (lane / 4, lane % 4), matrix m's row g, columns 2i and 2i + 1 - or with Trans,
// rows 2i and 2i + 1 of column g (the transpose's row g).
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
  (void)r, (void)p;
  __trap();
#endif
}
// cp.async.cg.shared.global: 16 bytes from global src to shared dst without a register round trip (L2 only:
// a tile is read once per block), of which the first `bytes` come from src and the rest are zeros (0: src is
// not read). They land by the cp_async_wait<N>() that leaves at most N of this thread's later groups
// (cp_async_commit) in flight; other threads see them after a __syncthreads that follows that wait.
__device__ __forceinline__ void cp_async16(uint16_t* dst, const uint16_t* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(bytes) : "memory");
#else
  (void)dst, (void)src, (void)bytes;
  __trap();
#endif
}
// cp.async.ca.shared.global of 4 bytes (the .cg form copies 16 only): the first `bytes` (4 or 0) from src.
__device__ __forceinline__ void cp_async4(float* dst, const float* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(bytes) : "memory");
#else
  (void)dst, (void)src, (void)bytes;
  __trap();
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// The same for two matrices (lanes 0-15 give the addresses; the others' are ignored).
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const uint16_t* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(a));
#else
  (void)r, (void)p;
  __trap();
#endif
}
#endif

// Two values rounded (RNE) into one register, the lower index in the low half (the fragments' order).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Two adjacent halves (a pair along the row).
__device__ __forceinline__ uint32_t pair(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Rows r0 .. r0 + NR - 1 of a [rows, D] matrix whose rows are ld apart into shared memory (pitch<DP>()),
// zeros past either end: 16-byte chunks (D is a multiple of 8), one vector load each where the pointers and
// strides allow.
template <int DP, int NR>
__device__ void load_tile(uint16_t* dst, const uint16_t* src, int64_t r0, int64_t rows, int64_t ld, int D,
                          bool vec) {
  constexpr int kChunks = DP / 8;
  for (int e = threadIdx.x; e < NR * kChunks; e += kThreads) {
    const int rr = e / kChunks, c = (e % kChunks) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + rr < rows && c < D) {
      const uint16_t* p = src + (r0 + rr) * ld + c;
      if (vec) {
        v = *reinterpret_cast<const uint4*>(p);
      } else {
        v.x = pair(p);  // 4-byte aligned: D, ld and every operand's start are even (flash_attention.cu)
        v.y = pair(p + 2);
        v.z = pair(p + 4);
        v.w = pair(p + 6);
      }
    }
    *reinterpret_cast<uint4*>(dst + rr * pitch<DP>() + c) = v;
  }
}

// load_tile's rows as cp.async copies (one group for the caller to commit) where 16-byte loads are allowed;
// else load_tile itself, whose stores the caller's next __syncthreads publishes.
template <int DP, int NR>
__device__ void load_tile_async(uint16_t* dst, const uint16_t* src, int64_t r0, int64_t rows, int64_t ld,
                                int D, bool vec) {
  if (!vec) return load_tile<DP, NR>(dst, src, r0, rows, ld, D, vec);
  constexpr int kChunks = DP / 8;
  for (int e = threadIdx.x; e < NR * kChunks; e += kThreads) {
    const int rr = e / kChunks, c = (e % kChunks) * 8;
    const bool in = r0 + rr < rows && c < D;
    cp_async16(dst + rr * pitch<DP>() + c, in ? src + (r0 + rr) * ld + c : src, in ? 16 : 0);
  }
}

// The fragments come from shared memory through ldmatrix: one instruction per four 8 x 8 matrices where
// 32-bit loads took four (A) and 16-bit loads of a column took sixteen (the B operand of P V and its backward
// twins), the loads these kernels were bound by. Rows pitch<DP>() halves apart keep every matrix's eight rows
// on different banks.

// The A fragment (16 x 16 at column k0) of the 16 rows at `rows`: lane (g, i) holds rows g and g + 8 at
// columns k0 + 2i, 2i + 1 and k0 + 8 + 2i, 2i + 1 - matrices (rows 0-7 | 8-15) x (columns k0 | k0 + 8).
template <int DP>
__device__ __forceinline__ void a_fragment(uint32_t (&a)[4], const uint16_t* rows, int k0, int lane) {
  constexpr int P = pitch<DP>();
  const int m = lane / 8, r = lane % 8;
  ldmatrix_x4<false>(a, rows + (r + 8 * (m % 2)) * P + k0 + 8 * (m / 2));
}

// acc[j] (16 x 8 blocks) = the warp's 16 rows (`rows`) times the transposes of the tile's 64 rows (`tile`),
// over the padded head dim: the lane holds B[k][n] = tile[8 j + g][k0 + 2i, 2i + 1] (and + 8), two n-blocks'
// B operands per ldmatrix (matrices (rows 8j | 8j + 8) x (columns k0 | k0 + 8)).
template <typename T, int DP>
__device__ __forceinline__ void rows_times_tile_t(float (&acc)[kN][4], const uint16_t* rows,
                                                  const uint16_t* tile, int g, int i) {
  constexpr int P = pitch<DP>();
  const int lane = 4 * g + i, m = lane / 8, r = lane % 8;
#pragma unroll
  for (int j = 0; j < kN; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
  for (int k0 = 0; k0 < DP; k0 += 16) {
    uint32_t a[4];
    a_fragment<DP>(a, rows, k0, lane);
#pragma unroll
    for (int j = 0; j < kN; j += 2) {
      uint32_t b[4];
      ldmatrix_x4<false>(b, tile + (8 * (j + m / 2) + r) * P + k0 + 8 * (m % 2));
      mma<T>(acc[j], a, b[0], b[1]);
      mma<T>(acc[j + 1], a, b[2], b[3]);
    }
  }
}

// out[n] (16 x 8 blocks over the head dim) += x (16 x 64, as score fragments) times the tile's 64 rows: the
// score blocks 2kk and 2kk + 1 are the A fragment of keys 16 kk .. 16 kk + 15, and the lane holds
// B[k][n] = tile[16 kk + 2i, 2i + 1 (and + 8)][8 n + g]: the transposed matrices (rows 16 kk | 16 kk + 8) x
// (columns 8n | 8n + 8), two n-blocks per ldmatrix.
template <typename T, int DP, bool kNarrow = false>
__device__ __forceinline__ void scores_times_tile(float (&out)[DP / 8][4], const float (&x)[kN][4],
                                                  const uint16_t* tile, int g, int i) {
  constexpr int P = pitch<DP>();
  const int lane = 4 * g + i, m = lane / 8, r = lane % 8;
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    const uint32_t a[4] = {pack2<T>(x[2 * kk][0], x[2 * kk][1]), pack2<T>(x[2 * kk][2], x[2 * kk][3]),
                           pack2<T>(x[2 * kk + 1][0], x[2 * kk + 1][1]),
                           pack2<T>(x[2 * kk + 1][2], x[2 * kk + 1][3])};
    if constexpr (!kNarrow) {
#pragma unroll
      for (int n = 0; n < DP / 8; n += 2) {
        uint32_t b[4];
        ldmatrix_x4<true>(b, tile + (16 * kk + 8 * (m % 2) + r) * P + 8 * (n + m / 2));
        mma<T>(out[n], a, b[0], b[1]);
        mma<T>(out[n + 1], a, b[2], b[3]);
      }
    } else {  // one n-block per load: dk/dv's kernel at DP 128 (its 128 accumulators) spills with two more
#pragma unroll
      for (int n = 0; n < DP / 8; ++n) {
        uint32_t b[2];
        ldmatrix_x2<true>(b, tile + (16 * kk + 8 * (m % 2) + r) * P + 8 * n);
        mma<T>(out[n], a, b[0], b[1]);
      }
    }
  }
}

// The Philox offset of this launch's dropout: the call's, moved by a CUDA graph's shift where one is set.
__device__ __forceinline__ uint64_t drop_offset(const Geo& g, const uint64_t* shift) {
  return g.offset + (shift ? *shift : 0);
}

// Dropout's keep bits of the N (16 or 32) keys s .. s + N - 1 of query t in head row bh (bit k: key s + k
// kept, uniform(word) >= dropout): their Philox words are consecutive (drop_index), so the N / 4 + 1 blocks
// that hold them are made once each. A lane makes the bits of one row's keys and the warp shares them by
// shuffles, where drawing each score's word on its own made a Philox block per score pair (forward, dq) or
// per score (dk/dv): ~80 integer instructions each, several times the tile's tensor-core work. A query past
// T has no bits (its scores are never kept).
template <int N>
__device__ __forceinline__ uint32_t keep_bits(const Geo& g, uint64_t offset, int64_t bh, int64_t t,
                                              int64_t s) {
  if (t >= g.T) return 0;
  const uint64_t first = g.drop_index(bh, t, s), b0 = first / 4, b1 = (first + N - 1) / 4;
  uint32_t bits = 0;
#pragma unroll
  for (int k = 0; k <= N / 4; ++k) {
    if (b0 + k > b1) break;
    const Philox4 p = philox4x32(offset + b0 + k, g.seed);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const auto pos = static_cast<int64_t>(4 * (b0 + k) + w - first);
      if (pos >= 0 && pos < N && uniform_from_word(p.w[w]) >= g.dropout) bits |= 1u << pos;
    }
  }
  return bits;
}

// The factor of a score whose keep bit is bit `pos` of `bits`: keep_scale or 0.
__device__ __forceinline__ float factor_of(const Geo& g, uint32_t bits, int pos) {
  return bits >> pos & 1u ? static_cast<float>(g.keep_scale) : 0.0f;
}

// The keep bits of the 64 keys from s0 for a forward or dq lane's two query rows tr[0] = t and tr[1] = t + 8
// (kb[r][h]: keys s0 + 32 h ..): lane i of the row group makes row i / 2's half i % 2, and the group's four
// lanes trade them. Every lane of the warp calls it (shuffles).
__device__ __forceinline__ void row_keep_bits(const Geo& g, uint64_t offset, int64_t bh, int64_t t,
                                              int64_t s0, int gi, int i, uint32_t (&kb)[2][2]) {
  const uint32_t mine = keep_bits<32>(g, offset, bh, t + 8 * (i >> 1), s0 + 32 * (i & 1));
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) kb[r][h] = __shfl_sync(0xffffffffu, mine, 4 * gi + 2 * r + h);
}

// max that keeps a NaN (fmaxf drops it): a row of NaN scores gives NaN, as the CPU twin.
__device__ __forceinline__ float nan_max(float a, float b) { return a != a || a > b ? a : b; }

// Rows t (g and g + 8 of the warp's 16) of [*, D] at `base`, rows ld apart: the two values of each 16 x 8
// block the lane holds, rounded, as one 4-byte store.
template <typename T, int DP>
__device__ __forceinline__ void store_rows(uint16_t* base, int64_t r0, int64_t rows, int64_t ld, int D,
                                           const float (&x)[DP / 8][4], const float (&mul)[2], int g, int i) {
#pragma unroll
  for (int n = 0; n < DP / 8; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = r0 + g + 8 * half;
      const int c = 8 * n + 2 * i;
      if (r < rows && c < D)
        *reinterpret_cast<uint32_t*>(base + r * ld + c) =
            pack2<T>(x[n][2 * half] * mul[half], x[n][2 * half + 1] * mul[half]);
    }
}

// The kOwn queries a forward or dq block owns: head row bh = b * H + h from t0, its batch and kv head's K and
// V, the lane's two query rows, and the 64-key tiles any of its queries may see (s_begin .. s_end,
// tile-aligned).
struct QueryBlock {
  int64_t bh, b, h, t0, s_begin, s_end;
  int64_t tr[2];
  const uint16_t *kb, *vb;
  __device__ QueryBlock(const Geo& G, const uint16_t* k, const uint16_t* v, int warp, int g) {
    const int64_t tiles = (G.T + kOwn - 1) / kOwn;
    bh = blockIdx.x / tiles, t0 = (blockIdx.x % tiles) * kOwn, b = bh / G.H, h = bh % G.H;
    const int64_t kvh = h / (G.H / G.KV);
    kb = k + G.rows.k.at(b, kvh, 0);
    vb = v + G.rows.v.at(b, kvh, 0);
    tr[0] = t0 + 16 * warp + g, tr[1] = tr[0] + 8;
    const int64_t t_last = (t0 + kOwn < G.T ? t0 + kOwn : G.T) - 1;
    s_begin = G.first_key(t0) / kTile * kTile, s_end = G.last_key(t_last) + 1;
  }
};

template <typename T, int DP>
__global__ void __launch_bounds__(kThreads)
    flash_forward(Geo geo, const uint64_t* shift, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                  uint16_t* out, float* lse, bool vec) {
  TR_FLASH_SMEM(smem);
  constexpr int P = pitch<DP>();
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* Ks = Qs + kOwn * P;
  uint16_t* Vs = Ks + kTile * P;
  const Geo& G = geo;
  const int D = static_cast<int>(G.D), warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, i = threadIdx.x % 4;
  const QueryBlock qb(G, k, v, warp, g);
  const int64_t bh = qb.bh, b = qb.b, t0 = qb.t0;
  const int64_t(&tr)[2] = qb.tr;
  load_tile<DP, kOwn>(Qs, q + G.rows.q.at(b, qb.h, 0), t0, G.T, G.rows.q.row, D, vec);
  const float scale = static_cast<float>(G.scale);
  const uint64_t offset = drop_offset(G, shift);
  float o[DP / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  // K and V stream through one buffer each, the next tile's K copied in while this tile's softmax and P V
  // run, its V while the next Q K^T does: the copy groups go K0, V0, K1, V1, ..., so waiting until one
  // group is left in flight finds the buffer about to be read complete.
  if (qb.s_begin < qb.s_end) {
    load_tile_async<DP, kTile>(Ks, qb.kb, qb.s_begin, G.S, G.rows.k.row, D, vec);
    cp_async_commit();
    load_tile_async<DP, kTile>(Vs, qb.vb, qb.s_begin, G.S, G.rows.v.row, D, vec);
    cp_async_commit();
  }
  for (int64_t s0 = qb.s_begin; s0 < qb.s_end; s0 += kTile) {
    const bool more = s0 + kTile < qb.s_end;
    cp_async_wait<1>();  // this tile's K (its V may still be in flight)
    __syncthreads();     // ... for every thread (and Qs, the first time)
    float sc[kN][4];
    rows_times_tile_t<T, DP>(sc, Qs + 16 * warp * P, Ks, g, i);
    __syncthreads();  // every warp is done with Ks: the next tile's K may come in
    if (more) load_tile_async<DP, kTile>(Ks, qb.kb, s0 + kTile, G.S, G.rows.k.row, D, vec);
    cp_async_commit();
    uint32_t kb[2][2] = {};  // dropout's keep bits of the lane's rows
    if (G.dropout > 0.0f) row_keep_bits(G, offset, bh, tr[0], s0, g, i, kb);
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int j = 0; j < kN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t t = tr[e / 2], s = s0 + 8 * j + 2 * i + e % 2;
        sc[j][e] = t < G.T && s < G.S && G.visible(b, t, s) ? sc[j][e] * scale : -INFINITY;
        mx[e / 2] = nan_max(sc[j][e], mx[e / 2]);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // a row's 64 scores are spread over the 4 lanes of its group
      mx[r] = nan_max(__shfl_xor_sync(0xffffffffu, mx[r], 1), mx[r]);
      mx[r] = nan_max(__shfl_xor_sync(0xffffffffu, mx[r], 2), mx[r]);
      corr[r] = mx[r] == -INFINITY ? 1.0f : __expf(m[r] - mx[r]);
      m[r] = mx[r];
      l[r] *= corr[r];
    }
#pragma unroll
    for (int j = 0; j < kN; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float p[2];
        for (int e = 0; e < 2; ++e) {
          p[e] = mx[r] == -INFINITY ? 0.0f : __expf(sc[j][2 * r + e] - mx[r]);
          l[r] += p[e];  // the softmax's sum is undropped; the product takes p * z
          if (G.dropout > 0.0f) p[e] *= factor_of(G, kb[r][j / 4], (8 * j + 2 * i + e) % 32);
        }
        sc[j][2 * r] = p[0], sc[j][2 * r + 1] = p[1];
      }
#pragma unroll
    for (int n = 0; n < DP / 8; ++n) {
      o[n][0] *= corr[0], o[n][1] *= corr[0];
      o[n][2] *= corr[1], o[n][3] *= corr[1];
    }
    cp_async_wait<1>();  // this tile's V (the next K may still be in flight)
    __syncthreads();
    scores_times_tile<T, DP>(o, sc, Vs, g, i);
    __syncthreads();  // every warp is done with Vs: the next tile's V may come in
    if (more) load_tile_async<DP, kTile>(Vs, qb.vb, s0 + kTile, G.S, G.rows.v.row, D, vec);
    cp_async_commit();
  }
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    if (i == 0 && tr[r] < G.T) lse[bh * G.T + tr[r]] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
  }
  store_rows<T, DP>(out + G.rows.out.at(b, qb.h, 0), t0 + 16 * warp, G.T, G.rows.out.row, D, o, inv, g, i);
}

// The backward kernels stream their tiles through Slots buffers: 2, the next tile copied in under this one's
// work, where the device's shared memory per block allows (dq_smem, dkv_smem), else 1 (copied in after it).
template <typename T, int DP, int Slots = 2>
__global__ void __launch_bounds__(kThreads)
    flash_dq(Geo geo, const uint64_t* shift, const uint16_t* q, const uint16_t* k, const uint16_t* v,
             const float* lse, const float* delta, const uint16_t* dout, uint16_t* dq, bool vec) {
  TR_FLASH_SMEM(smem);
  constexpr int P = pitch<DP>();
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* dOs = Qs + kOwn * P;
  uint16_t* KV = dOs + kOwn * P;  // Slots slots of a K tile then a V tile
  const Geo& G = geo;
  const int D = static_cast<int>(G.D), warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, i = threadIdx.x % 4;
  const QueryBlock qb(G, k, v, warp, g);
  const int64_t bh = qb.bh, b = qb.b, t0 = qb.t0;
  const int64_t(&tr)[2] = qb.tr;
  load_tile_async<DP, kOwn>(Qs, q + G.rows.q.at(b, qb.h, 0), t0, G.T, G.rows.q.row, D, vec);
  load_tile_async<DP, kOwn>(dOs, dout + G.rows.dout.at(b, qb.h, 0), t0, G.T, G.rows.dout.row, D, vec);
  const auto fetch = [&](int64_t s0, int slot_to) {
    uint16_t* ks = KV + slot_to * 2 * kTile * P;
    load_tile_async<DP, kTile>(ks, qb.kb, s0, G.S, G.rows.k.row, D, vec);
    load_tile_async<DP, kTile>(ks + kTile * P, qb.vb, s0, G.S, G.rows.v.row, D, vec);
  };
  if (qb.s_begin < qb.s_end) fetch(qb.s_begin, 0);
  cp_async_commit();  // one copy group a tile (the first with Q and dO): waiting for all finds it landed
  float L[2], Dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    L[r] = tr[r] < G.T ? lse[bh * G.T + tr[r]] : -INFINITY;
    Dl[r] = tr[r] < G.T ? delta[bh * G.T + tr[r]] : 0.0f;
  }
  const float scale = static_cast<float>(G.scale);
  const uint64_t offset = drop_offset(G, shift);
  float acc[DP / 8][4] = {};
  int slot = 0;
  for (int64_t s0 = qb.s_begin; s0 < qb.s_end; s0 += kTile, slot = (slot + 1) % Slots) {
    cp_async_wait<0>();  // this tile's K and V
    __syncthreads();  // ... for every thread, and every warp is done with the other slot: the next comes in
    if constexpr (Slots == 2) {
      if (s0 + kTile < qb.s_end) fetch(s0 + kTile, slot ^ 1);
      cp_async_commit();
    }
    const uint16_t* Ks = KV + slot * 2 * kTile * P;
    const uint16_t* Vs = Ks + kTile * P;
    float sc[kN][4], dp[kN][4];
    rows_times_tile_t<T, DP>(sc, Qs + 16 * warp * P, Ks, g, i);
    rows_times_tile_t<T, DP>(dp, dOs + 16 * warp * P, Vs, g, i);
    uint32_t kb[2][2] = {};  // dropout's keep bits of the lane's rows
    if (G.dropout > 0.0f) row_keep_bits(G, offset, bh, tr[0], s0, g, i, kb);
#pragma unroll
    for (int j = 0; j < kN; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t t = tr[r], s = s0 + 8 * j + 2 * i;
        for (int e = 0; e < 2; ++e) {
          float ds = 0.0f;
          if (t < G.T && s + e < G.S && L[r] != -INFINITY && G.visible(b, t, s + e)) {
            const float p = __expf(sc[j][2 * r + e] * scale - L[r]);
            const float z = G.dropout > 0.0f ? factor_of(G, kb[r][j / 4], (8 * j + 2 * i + e) % 32) : 1.0f;
            ds = p * (dp[j][2 * r + e] * z - Dl[r]) * scale;
          }
          sc[j][2 * r + e] = ds;
        }
      }
    scores_times_tile<T, DP>(acc, sc, Ks, g, i);  // dq += ds k
    if constexpr (Slots == 1) {
      __syncthreads();  // every warp is done with the slot
      if (s0 + kTile < qb.s_end) fetch(s0 + kTile, 0);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();  // (a block with no tile leaves no copy in flight)
  const float one[2] = {1.0f, 1.0f};
  store_rows<T, DP>(dq + G.rows.dq.at(b, qb.h, 0), t0 + 16 * warp, G.T, G.rows.dq.row, D, acc, one, g, i);
}

template <typename T, int DP, int Slots = 2>
__global__ void __launch_bounds__(kThreads)
    flash_dkv(Geo geo, const uint64_t* shift, const uint16_t* q, const uint16_t* k, const uint16_t* v,
              const float* lse, const float* delta, const uint16_t* dout, uint16_t* dk, uint16_t* dv,
              bool vec) {
  TR_FLASH_SMEM(smem);
  constexpr int P = pitch<DP>();
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem);
  uint16_t* Vs = Ks + kOwn * P;
  uint16_t* QD = Vs + kOwn * P;  // Slots slots of a query tile's Q then dO
  float* LD = reinterpret_cast<float*>(QD + Slots * 2 * kTile * P);  // and of its lse then delta
  const Geo& G = geo;
  const int64_t tiles = (G.S + kOwn - 1) / kOwn, bkv = blockIdx.x / tiles, s0 = (blockIdx.x % tiles) * kOwn;
  const int64_t kvh = bkv % G.KV, b = bkv / G.KV, rep = G.H / G.KV;
  const int D = static_cast<int>(G.D), warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, i = threadIdx.x % 4;
  load_tile_async<DP, kOwn>(Ks, k + G.rows.k.at(b, kvh, 0), s0, G.S, G.rows.k.row, D, vec);
  load_tile_async<DP, kOwn>(Vs, v + G.rows.v.at(b, kvh, 0), s0, G.S, G.rows.v.row, D, vec);
  const int64_t sr[2] = {s0 + 16 * warp + g, s0 + 16 * warp + g + 8};  // the lane's two key rows
  const float scale = static_cast<float>(G.scale);
  const uint64_t offset = drop_offset(G, shift);
  // Causal: the first query that can see key s0 is t = s0 - (S - T); with a window of W keys the last one
  // that sees the block's last key s0 + kOwn - 1 is t = s0 + kOwn - 1 - (S - T) + W - 1.
  const int64_t t_first = G.causal && s0 - (G.S - G.T) > 0 ? s0 - (G.S - G.T) : 0;
  const int64_t t_stop = G.causal && G.window > 0 ? s0 + kOwn - 1 - (G.S - G.T) + G.window : G.T;
  const int64_t t_end = t_stop < G.T ? t_stop : G.T, t_lo = t_first / kTile * kTile;
  // The query tiles t_lo, t_lo + kTile, .. below t_end of each head of the group, one after the other.
  const auto fetch = [&](int64_t h, int64_t t0, int slot_to) {
    const int64_t bh = b * G.H + h;
    uint16_t* qs = QD + slot_to * 2 * kTile * P;
    load_tile_async<DP, kTile>(qs, q + G.rows.q.at(b, h, 0), t0, G.T, G.rows.q.row, D, vec);
    load_tile_async<DP, kTile>(qs + kTile * P, dout + G.rows.dout.at(b, h, 0), t0, G.T, G.rows.dout.row, D,
                               vec);
    float* ls = LD + slot_to * 2 * kTile;
    for (int e = threadIdx.x; e < kTile; e += kThreads) {  // rows past T: zeros, never read
      const bool in = t0 + e < G.T;
      cp_async4(ls + e, in ? lse + bh * G.T + t0 + e : lse, in ? 4 : 0);
      cp_async4(ls + kTile + e, in ? delta + bh * G.T + t0 + e : delta, in ? 4 : 0);
    }
  };
  const int64_t h_end = (kvh + 1) * rep;
  int64_t h = t_lo < t_end ? kvh * rep : h_end, t0 = t_lo;  // the tile at hand
  if (h < h_end) fetch(h, t0, 0);
  cp_async_commit();  // one copy group a tile (the first with K and V): waiting for all finds it landed
  float ak[DP / 8][4] = {}, av[DP / 8][4] = {};
  for (int slot = 0; h < h_end; slot = (slot + 1) % Slots) {
    cp_async_wait<0>();  // this tile's Q, dO, lse and delta
    __syncthreads();  // ... for every thread, and every warp is done with the other slot: the next comes in
    const bool wrap = t0 + kTile >= t_end;
    const int64_t h_next = wrap ? h + 1 : h, t_next = wrap ? t_lo : t0 + kTile;
    if constexpr (Slots == 2) {
      if (h_next < h_end) fetch(h_next, t_next, slot ^ 1);
      cp_async_commit();
    }
    const int64_t bh = b * G.H + h;
    const uint16_t* Qs = QD + slot * 2 * kTile * P;
    const uint16_t* dOs = Qs + kTile * P;
    const float* Ls = LD + slot * 2 * kTile;
    const float* Dl = Ls + kTile;
    float st[kN][4], dpt[kN][4];  // the warp's 16 keys against the tile's 64 queries
    rows_times_tile_t<T, DP>(st, Ks + 16 * warp * P, Qs, g, i);
    rows_times_tile_t<T, DP>(dpt, Vs + 16 * warp * P, dOs, g, i);
    // Dropout's keep bits: lane L makes those of queries t0 + 2L and t0 + 2L + 1 against the warp's 16 keys
    // (low and high half); the lane holding queries 8j + 2i, 8j + 2i + 1 reads lane 4j + i's.
    uint32_t mine = 0;
    if (G.dropout > 0.0f) {
      const int64_t tq = t0 + 2 * (threadIdx.x % 32), sw = s0 + 16 * warp;
      mine = keep_bits<16>(G, offset, bh, tq, sw) | keep_bits<16>(G, offset, bh, tq + 1, sw) << 16;
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      const uint32_t kbj = G.dropout > 0.0f ? __shfl_sync(0xffffffffu, mine, 4 * j + i) : 0u;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = 8 * j + 2 * i + e % 2;
        const int64_t s = sr[e / 2], t = t0 + qi;
        float p = 0.0f, ds = 0.0f;
        if (t < G.T && s < G.S && Ls[qi] != -INFINITY && G.visible(b, t, s)) {
          const float z = G.dropout > 0.0f ? factor_of(G, kbj, 16 * (e % 2) + g + 8 * (e / 2)) : 1.0f;
          p = __expf(st[j][e] * scale - Ls[qi]);
          ds = p * (dpt[j][e] * z - Dl[qi]) * scale;
          p *= z;  // dv takes the dropped probability
        }
        st[j][e] = p;
        dpt[j][e] = ds;
      }
    }
    scores_times_tile<T, DP, (DP > 64)>(av, st, dOs, g, i);  // dv += p^T do
    scores_times_tile<T, DP, (DP > 64)>(ak, dpt, Qs, g, i);  // dk += ds^T q
    if constexpr (Slots == 1) {
      __syncthreads();  // every warp is done with the slot
      if (h_next < h_end) fetch(h_next, t_next, 0);
      cp_async_commit();
    }
    h = h_next, t0 = t_next;
  }
  cp_async_wait<0>();  // (a block with no query tile leaves no copy in flight)
  const float one[2] = {1.0f, 1.0f};
  store_rows<T, DP>(dk + G.rows.dk.at(b, kvh, 0), s0 + 16 * warp, G.S, G.rows.dk.row, D, ak, one, g, i);
  store_rows<T, DP>(dv + G.rows.dv.at(b, kvh, 0), s0 + 16 * warp, G.S, G.rows.dv.row, D, av, one, g, i);
}

template <int DP>
constexpr size_t forward_smem() {
  return static_cast<size_t>(kOwn + 2 * kTile) * pitch<DP>() * 2;
}
template <int DP, int Slots = 2>
constexpr size_t dq_smem() {
  return static_cast<size_t>(2 * kOwn + Slots * 2 * kTile) * pitch<DP>() * 2;
}
template <int DP, int Slots = 2>
constexpr size_t dkv_smem() {
  return static_cast<size_t>(2 * kOwn + Slots * 2 * kTile) * pitch<DP>() * 2 +
         Slots * 2 * kTile * sizeof(float);
}

}  // namespace tr::cuda::TR_FLASH_NAMESPACE
