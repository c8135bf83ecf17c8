// AMX bf16 tile GEMM and its operand packing (see amx_tiles.h).
#include "backend/cpu/amx_tiles.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <type_traits>

#include "backend/cpu/convert.h"

// GCC 12's AVX-512 intrinsics trip its own -Wuninitialized once inlined (see vec_math512.h).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tr::cpu::amx {

namespace {

// ldtilecfg's 64-byte operand: palette 1, eight tiles of 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int i = 0; i < 8; ++i) {
      colsb[i] = 64;
      rows[i] = 16;
    }
  }
};

}  // namespace

bool request_tiles() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;  // leaf 7, sub-leaf 0: EDX bit 22 AMX-BF16, bit 24 AMX-TILE
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx >> 22 & 1u) || !(edx >> 24 & 1u))
    return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

__attribute__((target("amx-tile,amx-bf16"))) void gemm(int64_t M, int64_t N, int64_t K, const BFloat16* a,
                                                       int64_t lda, const BFloat16* b, int64_t ldb, float* c,
                                                       int64_t ldc, bool accumulate) {
  // Loaded per call: cheap next to a product, and robust to whatever ran on this thread's tiles before.
  const TileConfig cfg;
  _tile_loadconfig(&cfg);
  const int64_t sa = lda * 2, sb = ldb * 2, sc = ldc * 4;
  for (int64_t m = 0; m < M; m += 32) {
    const bool m2 = m + 16 < M;
    for (int64_t n = 0; n < N; n += 32) {
      const bool n2 = n + 16 < N;
      float* c0 = c + m * ldc + n;
      float* c2 = c0 + 16 * ldc;
      if (accumulate) {
        _tile_loadd(0, c0, sc);
        if (n2) _tile_loadd(1, c0 + 16, sc);
        if (m2) _tile_loadd(2, c2, sc);
        if (m2 && n2) _tile_loadd(3, c2 + 16, sc);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int64_t k = 0; k < K; k += 32) {
        _tile_loadd(4, a + m * lda + k, sa);
        if (m2) _tile_loadd(5, a + (m + 16) * lda + k, sa);
        const BFloat16* bk = b + (k / 2) * ldb + 2 * n;
        _tile_loadd(6, bk, sb);
        if (n2) _tile_loadd(7, bk + 32, sb);
        _tile_dpbf16ps(0, 4, 6);
        if (n2) _tile_dpbf16ps(1, 4, 7);
        if (m2) _tile_dpbf16ps(2, 5, 6);
        if (m2 && n2) _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0, sc);
      if (n2) _tile_stored(1, c0 + 16, sc);
      if (m2) _tile_stored(2, c2, sc);
      if (m2 && n2) _tile_stored(3, c2 + 16, sc);
    }
  }
}

__attribute__((target("amx-tile"))) void release() { _tile_release(); }

namespace {

// out[2n] = a[n], out[2n + 1] = b[n] for n < 32: two rows' 32 columns interleaved (AMX CPUs have AVX512-BW).
__attribute__((target("avx512f,avx512bw"))) void interleave32(const BFloat16* a, const BFloat16* b,
                                                              BFloat16* out) {
  alignas(64) static constexpr uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                   37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                   11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i lo = _mm512_load_si512(kLo), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  const __m512i va = _mm512_loadu_si512(a), vb = _mm512_loadu_si512(b);
  _mm512_storeu_si512(out, _mm512_permutex2var_epi16(va, lo, vb));
  _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi16(va, hi, vb));
}

// out rows c = 0..15 (stride ld_out words) = column c of the 16 x 16 words at in (row stride ld_in words).
__attribute__((target("avx512f"))) void transpose16x16(const uint32_t* in, int64_t ld_in, uint32_t* out,
                                                       int64_t ld_out) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(in + i * ld_in);
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: (r_i, r_i+1) word pairs
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // lane L of r[i + c]: rows i .. i + 3 of column 4L + c
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // gather lane L of the four row groups: column 4L + c
    const __m512i w0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88),
                  w1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xDD);
    const __m512i w2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88),
                  w3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xDD);
    _mm512_storeu_si512(out + c * ld_out, _mm512_shuffle_i32x4(w0, w2, 0x88));
    _mm512_storeu_si512(out + (8 + c) * ld_out, _mm512_shuffle_i32x4(w0, w2, 0xDD));
    _mm512_storeu_si512(out + (4 + c) * ld_out, _mm512_shuffle_i32x4(w1, w3, 0x88));
    _mm512_storeu_si512(out + (12 + c) * ld_out, _mm512_shuffle_i32x4(w1, w3, 0xDD));
  }
}

}  // namespace

template <typename T>
void pack_pairs(const T* x, int64_t rows, int64_t cols, int64_t ldx, int64_t rows_pad, BFloat16* b) {
  for (int64_t r = 0; r < rows_pad; r += 2) {
    BFloat16* out = b + r * cols;
    if constexpr (std::is_same_v<T, BFloat16>) {
      if (r + 1 < rows && cols % 32 == 0) {
        for (int64_t n = 0; n < cols; n += 32)
          interleave32(x + r * ldx + n, x + (r + 1) * ldx + n, out + 2 * n);
        continue;
      }
    }
    for (int e = 0; e < 2; ++e) {
      if (r + e >= rows) {
        for (int64_t n = 0; n < cols; ++n) out[2 * n + e].bits = 0;
        continue;
      }
      const T* row = x + (r + e) * ldx;
      for (int64_t n = 0; n < cols; ++n) {
        if constexpr (std::is_same_v<T, BFloat16>)
          out[2 * n + e] = row[n];
        else
          out[2 * n + e] = from_f32<BFloat16>(row[n]);
      }
    }
  }
}

void pack_transposed(const BFloat16* x, int64_t n, int64_t k, int64_t ldx, int64_t n_pad, BFloat16* b) {
  // A pair (x[j][2kp], x[j][2kp + 1]) is one 32-bit word: a transpose of words, 16 x 16 at a time where
  // both ranges allow (ldx even: rows start on words).
  const int64_t kw = k / 2, n16 = ldx % 2 == 0 ? n / 16 * 16 : 0, k16 = kw / 16 * 16;
  const auto* xw = reinterpret_cast<const uint32_t*>(x);
  auto* bw = reinterpret_cast<uint32_t*>(b);
  for (int64_t j = 0; j < n16; j += 16)
    for (int64_t kp = 0; kp < k16; kp += 16)
      transpose16x16(xw + j * (ldx / 2) + kp, ldx / 2, bw + kp * n_pad + j, n_pad);
  for (int64_t kp = 0; kp < kw; ++kp) {
    uint32_t* out = bw + kp * n_pad;
    for (int64_t j = kp < k16 ? n16 : 0; j < n; ++j) std::memcpy(out + j, x + j * ldx + 2 * kp, 4);
    for (int64_t j = n; j < n_pad; ++j) out[j] = 0;
  }
}

template void pack_pairs<BFloat16>(const BFloat16*, int64_t, int64_t, int64_t, int64_t, BFloat16*);
template void pack_pairs<float>(const float*, int64_t, int64_t, int64_t, int64_t, BFloat16*);

}  // namespace tr::cpu::amx
