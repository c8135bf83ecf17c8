// bf16 tile products on AVX512_BF16 dot-product instructions (VDPBF16PS), for the small GEMMs inside our own
// kernels where the CPU has no AMX tiles but runs bf16 dot products faster than f32 FMAs (AMD Zen 4 and
// later: matmul_native.h). Same operands as amx_tiles.h (B in VNNI pairs), f32 accumulation. CPU-only.
#pragma once
#include <cstdint>

#include "core/half.h"

namespace tr::cpu::dpbf16 {

// Whether this CPU has AVX512_BF16 (cpuid; the kernels below need it).
bool available();

// c[M x N] (row stride ldc) = (accumulate ? c : 0) + A * B, where A's (row m, pair kp) pair (A[m][2kp],
// A[m][2kp + 1]) is the 32-bit word at a + 2 * (m * a_row + kp * a_pair) - a_row = lda / 2, a_pair = 1 for
// row-major A, a_row = 1, a_pair = row stride in words for A given as the pairs of its transpose
// (pack_pairs_rounded) - and b holds B in VNNI pairs (amx_tiles.h: row kp, column n at b + kp * ldb + 2n).
// M a multiple of 4, N of 16, K even. Bound by the dot products: a 4 x 64 block of c stays in 16
// registers while each pair step loads 4 B vectors and broadcasts 4 A words.
void gemm(int64_t M, int64_t N, int64_t K, const BFloat16* a, int64_t a_row, int64_t a_pair,
          const BFloat16* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);

// out = x[rows x cols] (f32, row stride ldx) rounded to bf16 (RNE) in pairs of rows: word kp * ld_out + j
// holds (x[2kp][j], x[2kp + 1][j]), rows from `rows` to rows_pad (even) and columns from `cols` to ld_out
// zero. As A operand with a_row = 1, a_pair = ld_out it is x^T; as B operand (ldb = 2 * ld_out), x itself.
void pack_pairs_rounded(const float* x, int64_t ldx, int64_t rows, int64_t cols, int64_t rows_pad,
                        int64_t ld_out, BFloat16* out);

}  // namespace tr::cpu::dpbf16
