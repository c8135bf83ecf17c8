// AMX bf16 tile products for the small GEMMs inside our own kernels (the fused attention's 64 x 256 tiles),
// where one oneDNN primitive per product would cost more than the product. f32 accumulation, as the GPU's
// bf16 rules: products of bf16 pairs summed in f32 tiles. CPU-only (not included by .cu files).
#pragma once
#include <cstdint>

#include "core/half.h"

namespace tr::cpu::amx {

// Asks Linux for the AMX tile register state (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA) for this process;
// true when the CPU has AMX-BF16 and the kernel grants it. Idempotent.
bool request_tiles();

// c[M x N] (row stride ldc) = (accumulate ? c : 0) + a[M x K] (row stride lda) * b, with b in VNNI pairs: row
// kp of b holds, for each column n, the pair (B[2kp][n], B[2kp+1][n]) (row stride ldb elements, >= 2N).
// M and N multiples of 16, K of 32; request_tiles() must have succeeded. Bound by tile loads: each 32 x 32
// block of c loads 2 A and 2 B tiles per 32-deep step for 4 tile dot products.
void gemm(int64_t M, int64_t N, int64_t K, const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb,
          float* c, int64_t ldc, bool accumulate);

// Returns the tile registers to their initial state (call at the end of a parallel region that used gemm).
void release();

// b = x[rows x cols] (row stride ldx) in VNNI pairs, rows zero-padded to rows_pad (a multiple of 2): the B
// operand of x itself (K = rows). Row stride of b: 2 * cols.
template <typename T>
void pack_pairs(const T* x, int64_t rows, int64_t cols, int64_t ldx, int64_t rows_pad, BFloat16* b);

// b = x^T in VNNI pairs for x[n x k] (row stride ldx, k even): the B operand of x^T (K = k, N = n), columns
// zero-padded to n_pad. Row stride of b: 2 * n_pad.
void pack_transposed(const BFloat16* x, int64_t n, int64_t k, int64_t ldx, int64_t n_pad, BFloat16* b);

}  // namespace tr::cpu::amx
