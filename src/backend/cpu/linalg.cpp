// Dense linear algebra beyond GEMM on the CPU: the thin SVD, through OpenBLAS's LAPACK (gesdd, the driver
// torch.linalg.svd uses on the CPU, given the matrix in column-major order as torch hands it).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "backend/cpu/cpu_backend.h"

extern "C" {
// LAPACK's divide-and-conquer SVD (Fortran ABI: every argument by address, the string's length appended).
void sgesdd_(const char* jobz, const int* m, const int* n, float* a, const int* lda, float* s, float* u,
             const int* ldu, float* vt, const int* ldvt, float* work, const int* lwork, int* iwork, int* info,
             size_t jobz_len);
void dgesdd_(const char* jobz, const int* m, const int* n, double* a, const int* lda, double* s, double* u,
             const int* ldu, double* vt, const int* ldvt, double* work, const int* lwork, int* iwork,
             int* info, size_t jobz_len);
}

namespace tr::cpu {

namespace {

void gesdd(const int* m, const int* n, float* a, float* s, float* u, float* vt, float* work, const int* lwork,
           int* iwork, int* info) {
  const int ldu = *m, ldvt = std::min(*m, *n);
  sgesdd_("S", m, n, a, m, s, u, &ldu, vt, &ldvt, work, lwork, iwork, info, 1);
}
void gesdd(const int* m, const int* n, double* a, double* s, double* u, double* vt, double* work,
           const int* lwork, int* iwork, int* info) {
  const int ldu = *m, ldvt = std::min(*m, *n);
  dgesdd_("S", m, n, a, m, s, u, &ldu, vt, &ldvt, work, lwork, iwork, info, 1);
}

// Bounded by LAPACK's bidiagonalization (memory-bound BLAS-2 for half its flops): O(m n min(m, n)). The
// factors live in host scratch; only the leading r rows/columns asked for are written out.
template <typename T>
void svd_typed(const Tensor& a, const Tensor& u, const Tensor& s, const Tensor& vh) {
  const int64_t m = a.shape()[0], n = a.shape()[1], k = std::min(m, n);
  TR_CHECK(m < (int64_t{1} << 31) / std::max<int64_t>(1, n), "svd: a [{}, {}] matrix is beyond LAPACK's int",
           m, n);
  const int mi = static_cast<int>(m), ni = static_cast<int>(n);
  // Column-major copy of a (gesdd overwrites it).
  std::vector<T> col(static_cast<size_t>(m * n));
  const T* src = a.data<T>();
  bool finite = true;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      finite &= std::isfinite(src[i * n + j]);
      col[static_cast<size_t>(j * m + i)] = src[i * n + j];
    }
  TR_CHECK(finite, "svd: the [{}, {}] matrix holds a NaN or an infinity", m, n);
  std::vector<T> ucol(static_cast<size_t>(m * k)), vtcol(static_cast<size_t>(k * n)),
      sv(static_cast<size_t>(k));
  std::vector<int> iwork(static_cast<size_t>(8 * std::max<int64_t>(1, k)));
  int info = 0, query = -1;
  T wkopt = 0;
  gesdd(&mi, &ni, col.data(), sv.data(), ucol.data(), vtcol.data(), &wkopt, &query, iwork.data(), &info);
  TR_CHECK(info == 0, "svd: LAPACK's gesdd workspace query failed (info {})", info);
  const int lwork = std::max(1, static_cast<int>(wkopt));
  std::vector<T> work(static_cast<size_t>(lwork));
  gesdd(&mi, &ni, col.data(), sv.data(), ucol.data(), vtcol.data(), work.data(), &lwork, iwork.data(), &info);
  TR_CHECK(info >= 0, "svd: LAPACK's gesdd rejected argument {}", -info);
  TR_CHECK(
      info == 0,
      "svd: LAPACK's gesdd did not converge on a [{}, {}] matrix (info {}; a non-finite input does this)", m,
      n, info);
  // The leading r of each factor, row-major.
  const int64_t r = u.defined() ? u.shape()[1] : vh.defined() ? vh.shape()[0] : s.defined() ? s.numel() : k;
  TR_CHECK(r <= k, "svd: {} singular triplets asked of a [{}, {}] matrix", r, m, n);
  if (s.defined()) std::copy(sv.begin(), sv.begin() + r, s.data<T>());
  if (u.defined()) {
    T* uo = u.data<T>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < r; ++j) uo[i * r + j] = ucol[static_cast<size_t>(j * m + i)];
  }
  if (vh.defined()) {
    T* vo = vh.data<T>();
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < n; ++j) vo[i * n + j] = vtcol[static_cast<size_t>(j * k + i)];
  }
}

}  // namespace

bool CpuBackend::svd(const Tensor& a, const Tensor& u, const Tensor& s, const Tensor& vh) {
  if (a.dtype() == DType::f64)
    svd_typed<double>(a, u, s, vh);
  else
    svd_typed<float>(a, u, s, vh);
  return true;
}

}  // namespace tr::cpu
