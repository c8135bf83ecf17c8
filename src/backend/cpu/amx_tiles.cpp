// AMX bf16 tile GEMM and its operand packing (see amx_tiles.h).
#include "backend/cpu/amx_tiles.h"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "backend/cpu/convert.h"

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
  if (!__builtin_cpu_supports("amx-bf16") || !__builtin_cpu_supports("amx-tile")) return false;
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

template <typename T>
void pack_pairs(const T* x, int64_t rows, int64_t cols, int64_t ldx, int64_t rows_pad, BFloat16* b) {
  for (int64_t r = 0; r < rows_pad; r += 2) {
    BFloat16* out = b + r * cols;
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
  // A pair (x[j][2kp], x[j][2kp + 1]) is one 32-bit word: a transpose of words.
  for (int64_t kp = 0; kp < k / 2; ++kp) {
    uint32_t* out = reinterpret_cast<uint32_t*>(b + kp * 2 * n_pad);
    for (int64_t j = 0; j < n; ++j) std::memcpy(out + j, x + j * ldx + 2 * kp, 4);
    for (int64_t j = n; j < n_pad; ++j) out[j] = 0;
  }
}

template void pack_pairs<BFloat16>(const BFloat16*, int64_t, int64_t, int64_t, int64_t, BFloat16*);
template void pack_pairs<float>(const float*, int64_t, int64_t, int64_t, int64_t, BFloat16*);

}  // namespace tr::cpu::amx
