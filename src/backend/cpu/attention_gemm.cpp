// CPU fused attention for f32/bf16/f16 (FlashAttention-2's tiling, with each tile product an oneDNN sgemm):
// 64 queries against blocks of 256 keys with an online softmax forward, the probabilities recomputed from
// the saved logsumexp backward. Bound by sgemm (about 5 products of 64 x 256 x D per tile pair) rather than
// by the per-element dot products of a scalar kernel; causal tiles stop at their last visible key, so a long
// causal sequence does about half the products of materialized attention. The products run sequentially
// inside our parallel loops (oneDNN does not nest), each (batch, kv head) group on one thread in backward,
// so the summation order, and the result, does not depend on the thread count. Attention dropout scales the
// probabilities of the P V and P^T dO products by each element's factor (drop_factors).
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/attention_kernels.h"
#include "backend/cpu/attention_rows.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vec_unary.h"

namespace tr::cpu {

using namespace attn;

namespace {

// Row-major c = a op(b) (+ c when accumulate), sequential; false when oneDNN refuses the arguments.
bool gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
          int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  return dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f,
                    c, ldc) == dnnl_success;
}

}  // namespace

template <typename T>
void attention_gemm_forward(const backend::AttentionGeometry& g, const T* q, const T* k, const T* v, T* out,
                            float* lse) {
  const int64_t D = g.D, rep = g.H / g.KV, q_tiles = (g.T + kQ - 1) / kQ;
  const bool wide = cpu_has_avx512f();
  int bad = 0;
#pragma omp parallel reduction(| : bad)
  {
    std::vector<float> qt(static_cast<size_t>(kQ * D)), acc(static_cast<size_t>(kQ * D)),
        kb(static_cast<size_t>(kK * D)), vb(static_cast<size_t>(kK * D)), s(static_cast<size_t>(kQ * kK)),
        m(kQ), l(kQ), z(g.dropout > 0 ? kK : 0);
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t h = 0; h < g.H; ++h)
        for (int64_t tile = 0; tile < q_tiles; ++tile) {
          const int64_t t0 = tile * kQ, nt = std::min(kQ, g.T - t0), kvh = h / rep;
          const T* qp = q + g.rows.q.at(b, h, t0);
          const T* kp = k + g.rows.k.at(b, kvh, 0);
          const T* vp = v + g.rows.v.at(b, kvh, 0);
          for (int64_t i = 0; i < nt; ++i)
            for (int64_t c = 0; c < D; ++c)
              qt[i * D + c] = load(qp + i * g.rows.q.row, c) * static_cast<float>(g.scale);
          std::fill(acc.begin(), acc.begin() + nt * D, 0.0f);
          std::fill(m.begin(), m.end(), kNegInf);
          std::fill(l.begin(), l.end(), 0.0f);
          const int64_t s_end = g.last_key(t0 + nt - 1) + 1;
          for (int64_t s0 = g.first_key(t0); s0 < s_end; s0 += kK) {
            const int64_t ns = std::min(kK, s_end - s0);
            int64_t ldk = g.rows.k.row, ldv = g.rows.v.row;
            const float* kr = rows_f32(kp + s0 * ldk, ns, D, ldk, kb);
            const float* vr = rows_f32(vp + s0 * ldv, ns, D, ldv, vb);
            bad |= !gemm(false, true, nt, ns, D, qt.data(), D, kr, ldk, false, s.data(), ns);
            for (int64_t i = 0; i < nt; ++i) {
              float* si = s.data() + i * ns;
              mask_row(g, b, t0 + i, s0, ns, si);
              online_softmax_row(g, b * g.H + h, t0 + i, s0, ns, si, m[i], l[i], acc.data() + i * D, D,
                                 z.data(), wide);
            }
            bad |= !gemm(false, false, nt, D, ns, s.data(), ns, vr, ldv, true, acc.data(), D);  // acc += P V
          }
          finish_rows(nt, D, acc.data(), m.data(), l.data(), out + g.rows.out.at(b, h, t0), g.rows.out.row,
                      lse + (b * g.H + h) * g.T + t0);
        }
  }
  TR_CHECK(!bad, "attention: oneDNN sgemm refused a tile product (head dim {})", D);
}

template <typename T>
void attention_gemm_backward(const backend::AttentionGeometry& g, const T* q, const T* k, const T* v,
                             const T* out, const float* lse, const T* dout, T* dq, T* dk, T* dv) {
  const int64_t D = g.D, S = g.S, rep = g.H / g.KV;
  int bad = 0;
#pragma omp parallel reduction(| : bad)
  {
    std::vector<float> kbuf(static_cast<size_t>(std::is_same_v<T, float> ? 0 : S * D)), vbuf(kbuf.size()),
        dka(static_cast<size_t>(S * D)), dva(static_cast<size_t>(S * D)), qt(static_cast<size_t>(kQ * D)),
        dot(static_cast<size_t>(kQ * D)), ot(static_cast<size_t>(kQ * D)), dqt(static_cast<size_t>(kQ * D)),
        p(static_cast<size_t>(kQ * kK)), ds(static_cast<size_t>(kQ * kK)), delta(kQ),
        z(g.dropout > 0 ? kK : 0);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t kvh = 0; kvh < g.KV; ++kvh) {
        int64_t ldk = g.rows.k.row, ldv = g.rows.v.row;
        const float* kr = rows_f32(k + g.rows.k.at(b, kvh, 0), S, D, ldk, kbuf);
        const float* vr = rows_f32(v + g.rows.v.at(b, kvh, 0), S, D, ldv, vbuf);
        std::fill(dka.begin(), dka.end(), 0.0f);
        std::fill(dva.begin(), dva.end(), 0.0f);
        for (int64_t r = 0; r < rep; ++r) {
          const int64_t h = kvh * rep + r;
          for (int64_t t0 = 0; t0 < g.T; t0 += kQ) {
            const int64_t nt = std::min(kQ, g.T - t0);
            const float* lp = lse + (b * g.H + h) * g.T + t0;
            rows_to_f32(q + g.rows.q.at(b, h, t0), nt, g.rows.q.row, D, qt.data());
            rows_to_f32(dout + g.rows.dout.at(b, h, t0), nt, g.rows.dout.row, D, dot.data());
            rows_to_f32(out + g.rows.out.at(b, h, t0), nt, g.rows.out.row, D, ot.data());
            for (int64_t i = 0; i < nt; ++i)  // delta_t = rowsum(dO * O)
              delta[i] = row_dot(dot.data() + i * D, ot.data() + i * D, D);
            std::fill(dqt.begin(), dqt.begin() + nt * D, 0.0f);
            const int64_t s_end = g.last_key(t0 + nt - 1) + 1;
            for (int64_t s0 = g.first_key(t0); s0 < s_end; s0 += kK) {
              const int64_t ns = std::min(kK, s_end - s0);
              bad |= !gemm(false, true, nt, ns, D, qt.data(), D, kr + s0 * ldk, ldk, false, p.data(), ns);
              bad |= !gemm(false, true, nt, ns, D, dot.data(), D, vr + s0 * ldv, ldv, false, ds.data(), ns);
              tile_grads(g, b, h, t0, nt, s0, ns, ns, lp, delta.data(), p.data(), ds.data(), z.data());
              bad |= !gemm(true, false, ns, D, nt, p.data(), ns, dot.data(), D, true, dva.data() + s0 * D, D);
              bad |= !gemm(true, false, ns, D, nt, ds.data(), ns, qt.data(), D, true, dka.data() + s0 * D, D);
              bad |= !gemm(false, false, nt, D, ns, ds.data(), ns, kr + s0 * ldk, ldk, true, dqt.data(), D);
            }
            store_rows(dqt.data(), nt, D, dq + g.rows.dq.at(b, h, t0), g.rows.dq.row);
          }
        }
        store_rows(dka.data(), S, D, dk + g.rows.dk.at(b, kvh, 0), g.rows.dk.row);
        store_rows(dva.data(), S, D, dv + g.rows.dv.at(b, kvh, 0), g.rows.dv.row);
      }
  }
  TR_CHECK(!bad, "attention_backward: oneDNN sgemm refused a tile product (head dim {})", D);
}

#define TR_ATTENTION_GEMM(T)                                                                                \
  template void attention_gemm_forward<T>(const backend::AttentionGeometry&, const T*, const T*, const T*,  \
                                          T*, float*);                                                      \
  template void attention_gemm_backward<T>(const backend::AttentionGeometry&, const T*, const T*, const T*, \
                                           const T*, const float*, const T*, T*, T*, T*);
TR_ATTENTION_GEMM(float)
TR_ATTENTION_GEMM(BFloat16)
TR_ATTENTION_GEMM(Half)
#undef TR_ATTENTION_GEMM

}  // namespace tr::cpu
