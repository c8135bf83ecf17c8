// CPU GEMM. f32 goes through oneDNN's sgemm (AVX-512 kernels, OpenMP, about 1.5x OpenBLAS's Haswell kernels
// on the machines we measure: docs/PERFORMANCE.md); f64 through OpenBLAS; bf16 through oneDNN's native bf16
// matmul where the CPU has the instructions (matmul_native.cpp); other bf16/f16 operands are widened to f32,
// multiplied, and rounded back once.
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"

namespace tr::cpu {

namespace {

// Copies a strided [batch] x (rows x cols with leading dim ld) operand into dense f32 (vectorized and
// threaded: a conversion pass is memory-bound, and a serial one cost as much as the head's GEMMs).
template <typename T>
ScratchPool::Lease widen(ScratchPool& pool, const T* p, int64_t batch, int64_t stride, int64_t rows,
                         int64_t cols, int64_t ld) {
  auto out = pool.take(static_cast<size_t>(batch * rows * cols));
  for (int64_t b = 0; b < batch; ++b)
    convert_rows(p + b * stride, ld, out.get() + b * rows * cols, cols, rows, cols, widen_run<T>);
  return out;
}

// Row-major C[i] = alpha * op(A[i]) op(B[i]) + beta * C[i] for i < batch. Many small products run one per
// thread (oneDNN runs sequentially inside a parallel region); large ones use all threads each.
void sgemm_batched(bool ta, bool tb, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, int64_t sa, const float* b, int64_t ldb, int64_t sb,
                   float beta, float* c, int64_t ldc) {
  auto one = [&](int64_t i) {
    dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a + i * sa, lda, b + i * sb,
                                  ldb, beta, c + i * m * ldc, ldc);
    return st;
  };
  const bool per_thread = batch > 1 && m * n * k < (int64_t{1} << 22);
  if (per_thread) {
    int bad = 0;
#pragma omp parallel for schedule(dynamic) reduction(| : bad)
    for (int64_t i = 0; i < batch; ++i) bad |= one(i) != dnnl_success;
    TR_CHECK(!bad, "matmul: oneDNN sgemm failed for [{}, {}] x [{}, {}]", m, k, k, n);
  } else {
    for (int64_t i = 0; i < batch; ++i)
      TR_CHECK(one(i) == dnnl_success, "matmul: oneDNN sgemm failed for [{}, {}] x [{}, {}]", m, k, k, n);
  }
}

}  // namespace

namespace {
std::vector<float> round_to_tf32(const float* x, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;  // inf/nan kept
    std::memcpy(&out[static_cast<size_t>(i)], &u, 4);
  }
  return out;
}
}  // namespace

namespace {

// bf16/f16 operands widened to f32 and multiplied into the f32 product c ([batch, m, n], rows ldc apart).
template <typename T>
void widened_gemm(ScratchPool& pool, const backend::GemmArgs& g, float* c, int64_t ldc) {
  const int64_t ar = g.trans_a ? g.k : g.m, ac = g.trans_a ? g.m : g.k;
  const int64_t br = g.trans_b ? g.n : g.k, bc = g.trans_b ? g.k : g.n;
  const int64_t ba = g.stride_a == 0 ? 1 : g.batch, bb = g.stride_b == 0 ? 1 : g.batch;
  auto a = widen(pool, static_cast<const T*>(g.a.data_ptr()), ba, g.stride_a, ar, ac, g.lda);
  auto b = widen(pool, static_cast<const T*>(g.b.data_ptr()), bb, g.stride_b, br, bc, g.ldb);
  sgemm_batched(g.trans_a, g.trans_b, g.batch, g.m, g.n, g.k, static_cast<float>(g.alpha), a.get(), ac,
                ba == 1 ? 0 : ar * ac, b.get(), bc, bb == 1 ? 0 : br * bc, static_cast<float>(g.beta), c,
                ldc);
}

}  // namespace

void CpuBackend::gemm(const backend::GemmArgs& g) {
  if (g.epilogue != backend::GemmEpilogue::none) {
    TR_CHECK(g.batch == 1 && g.beta == 0.0 && g.c_ld() == g.n && g.bias.defined() && g.bias.numel() == g.n &&
                 g.bias.dtype() == g.c.dtype() && g.bias.is_contiguous(),
             "gemm epilogue: needs batch 1, beta 0, dense rows and a contiguous [{}] bias of c's dtype", g.n);
    const bool gelu = g.epilogue == backend::GemmEpilogue::bias_gelu;
    TR_CHECK(!gelu || (g.aux.defined() && g.aux.numel() == g.m * g.n && g.aux.dtype() == g.c.dtype() &&
                       g.aux.is_contiguous()),
             "gemm epilogue: bias_gelu needs a contiguous aux of c's size and dtype");
    // The bias enters as the initial c of a beta = 1 product: added in f32 before any rounding, as cuBLASLt's
    // epilogue adds it to the accumulator. With GELU the product lands in aux (the pre-activation the
    // backward reads) and the GELU reads it from there: no copy of the product.
    const Tensor& target = gelu ? g.aux : g.c;
    const size_t row = static_cast<size_t>(g.n) * dtype_size(g.c.dtype());
    for (int64_t i = 0; i < g.m; ++i)
      std::memcpy(static_cast<char*>(target.data_ptr()) + i * row, g.bias.data_ptr(), row);
    backend::GemmArgs plain = g;
    plain.epilogue = backend::GemmEpilogue::none;
    plain.beta = 1.0;
    plain.c = target;
    gemm(plain);
    if (gelu) unary(backend::UnaryOp::gelu_tanh, g.aux, g.c);
    return;
  }
  const auto ta = g.trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = g.trans_b ? CblasTrans : CblasNoTrans;
  TR_CHECK(g.c_ld() >= g.n && (g.batch == 1 || g.c_ld() == g.n),
           "matmul: rows of c {} apart for {} columns in a batch of {}", g.c_ld(), g.n, g.batch);
  const int64_t ldc = g.c_ld(), mn = g.m * ldc;
  if (g.k == 0) {
    // Nothing to multiply: c = beta * c (c may hold garbage when beta is 0), row by row in a padded buffer.
    const bool dense = ldc == g.n;
    for (int64_t i = 0; i < (dense ? 1 : g.m); ++i) {
      const Tensor c = dense ? g.c : g.c.as_strided({g.n}, {1}, g.c.offset() + i * ldc);
      if (g.beta == 0.0)
        fill(c, 0.0);
      else
        affine(c, g.beta, 0.0, c);
    }
    return;
  }
  if (g.c.dtype() == DType::f32 && g.a.dtype() != DType::f32) {
    // bf16/f16 operands into an f32 product: widened, multiplied, stored without rounding.
    TR_CHECK(g.a.dtype() == g.b.dtype() && (g.a.dtype() == DType::bf16 || g.a.dtype() == DType::f16),
             "matmul: an f32 product needs bf16/f16 operands of one dtype, got {} and {}",
             dtype_name(g.a.dtype()), dtype_name(g.b.dtype()));
    if (native_.preferred() && native_.run(g)) return;
    dispatch_float(g.a.dtype(), "matmul", [&]<typename T>() {
      if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>)
        widened_gemm<T>(gemm_scratch_, g, static_cast<float*>(g.c.data_ptr()), ldc);
    });
    return;
  }
  switch (g.c.dtype()) {
    case DType::f32: {
      const float* a = static_cast<const float*>(g.a.data_ptr());
      const float* b = static_cast<const float*>(g.b.data_ptr());
      float* c = static_cast<float*>(g.c.data_ptr());
      std::vector<float> a32, b32;
      if (g.tf32) {  // what a tensor core reads: each input rounded to 10 mantissa bits (nearest even)
        const int64_t ar = g.trans_a ? g.k : g.m, ac = g.trans_a ? g.m : g.k;
        const int64_t br = g.trans_b ? g.n : g.k, bc = g.trans_b ? g.k : g.n;
        a32 = round_to_tf32(a, (g.stride_a ? (g.batch - 1) * g.stride_a : 0) + (ar - 1) * g.lda + ac);
        b32 = round_to_tf32(b, (g.stride_b ? (g.batch - 1) * g.stride_b : 0) + (br - 1) * g.ldb + bc);
        a = a32.data();
        b = b32.data();
      }
      sgemm_batched(g.trans_a, g.trans_b, g.batch, g.m, g.n, g.k, static_cast<float>(g.alpha), a, g.lda,
                    g.stride_a, b, g.ldb, g.stride_b, static_cast<float>(g.beta), c, ldc);
      return;
    }
    case DType::f64: {
      const double* a = static_cast<const double*>(g.a.data_ptr());
      const double* b = static_cast<const double*>(g.b.data_ptr());
      double* c = static_cast<double*>(g.c.data_ptr());
      for (int64_t i = 0; i < g.batch; ++i)
        cblas_dgemm(CblasRowMajor, ta, tb, g.m, g.n, g.k, g.alpha, a + i * g.stride_a, g.lda,
                    b + i * g.stride_b, g.ldb, g.beta, c + i * mn, ldc);
      return;
    }
    case DType::bf16:
    case DType::f16:
      if (native_.preferred() && native_.run(g)) return;
      dispatch_float(g.c.dtype(), "matmul", [&]<typename T>() {
        if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
          T* cp = static_cast<T*>(g.c.data_ptr());
          // beta 0 never reads c (which may hold garbage): no need to widen it.
          auto c = g.beta == 0.0
                       ? gemm_scratch_.take(static_cast<size_t>(g.batch * g.m * g.n))
                       : widen(gemm_scratch_, static_cast<const T*>(cp), g.batch, mn, g.m, g.n, ldc);
          widened_gemm<T>(gemm_scratch_, g, c.get(), g.n);
          convert_rows(c.get(), g.n, cp, ldc, g.batch * g.m, g.n, narrow_run<T>);
        }
      });
      return;
    default: fail("matmul: dtype {} is not supported", dtype_name(g.c.dtype()));
  }
}

}  // namespace tr::cpu

namespace tr::cpu {

// What half precision buys on such a CPU (docs/PERFORMANCE.md, the guide's table measured).
constexpr const char* kNoSpeedup =
    "halves activation memory here (weights then take 6 bytes per parameter, not 4) but trains slower than "
    "fp32";

backend::NativeHalf CpuBackend::native_half_matmul(DType operands) const {
  if (!native_.native_for(operands)) return backend::NativeHalf::none;
  return native_.amx() ? backend::NativeHalf::amx : backend::NativeHalf::avx512_bf16;
}

std::string CpuBackend::gemm_precision_note(DType operands) const {
  if (operands != DType::bf16 && operands != DType::f16) return "";
  const bool is_bf16 = operands == DType::bf16;
  const std::string& impl = native_.impl_name(operands);
  const dnnl_version_t* v = dnnl_version();
  const std::string lib = fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
  const char* name = is_bf16 ? "bf16" : "fp16";
  const bool kernel = !impl.empty() && impl.rfind("ref", 0) != 0;
  if (native_.native_for(operands))
    return native_.amx()
               ? fmt::format(
                     "bf16 matmuls run natively on this CPU, on its AMX tiles ({}: {}), accumulating "
                     "in f32",
                     lib, impl)
               : fmt::format(
                     "bf16 matmuls run natively on this CPU, as AVX512_BF16 dot products ({}: {}; about "
                     "2x the f32 sgemm on AMD Zen 4 and Zen 5), accumulating in f32",
                     lib, impl);
  if (is_bf16 && native_.has_bf16() && kernel)
    return fmt::format(
        "bf16 is widened to f32 on this CPU: its AVX512_BF16 matmul ({}: {}) is not known to beat the f32 "
        "sgemm here (0.6x on Intel cores without AMX; 2.1-2.3x measured on AMD Zen 4 and 5), so matmuls "
        "widen "
        "bf16 "
        "to f32; --bf16 {}",
        lib, impl, kNoSpeedup);
  if (!is_bf16 && native_.cpu_has_avx512_fp16())
    return fmt::format(
        "fp16 is emulated on this CPU: it has AVX512_FP16, but {} has no fp16 matmul kernel for it, so "
        "matmuls widen fp16 to f32; --fp16 {}",
        lib, kNoSpeedup);
  return fmt::format(
      "{} is emulated on this CPU: {} has no {} matmul for it (that needs {}), so matmuls widen {} to f32; "
      "--{} {}",
      name, lib, name, is_bf16 ? "AVX512_BF16 or AMX" : "AVX512_FP16 or AMX-FP16", name, name, kNoSpeedup);
}

}  // namespace tr::cpu

namespace tr::backend {

std::string cpu_library_versions() {
  const dnnl_version_t* v = dnnl_version();
  const char* config = openblas_get_config();
  const char* core = openblas_get_corename();
  return fmt::format("oneDNN {}.{}.{}, {} (core {})", v->major, v->minor, v->patch,
                     config ? config : "OpenBLAS (no build line)", core ? core : "unknown");
}

}  // namespace tr::backend
