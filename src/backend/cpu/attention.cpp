// CPU fused attention (FlashAttention-2 style): queries in tiles, keys streamed in blocks with an online
// softmax, so no T x S score matrix exists; the forward saves only the row logsumexp. The backward recomputes
// each block's probabilities from it. Work is split over (batch, kv-head) groups so grouped-query heads that
// share k/v never race on dk/dv, and the summation order is fixed: results do not depend on thread count.
// This file's scalar kernels serve f64 (the gradient checks); f32/bf16/f16 run the same tiling with sgemm
// tile products (attention_gemm.cpp). Also the blocked form's row kernels.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/attention_geometry.h"
#include "backend/cpu/attention_kernels.h"
#include "backend/cpu/attention_rows.h"
#include "backend/cpu/bf16_dot.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/philox_cpu.h"
#include "backend/cpu/vec_unary.h"
#include "core/rng.h"

namespace tr::cpu {

namespace {

constexpr int64_t kBlock = 64;

using Geo = backend::AttentionGeometry;

template <typename T>
void forward_kernel(const Geo& g, const T* q, const T* k, const T* v, T* out, acc_t<T>* lse) {
  using A = acc_t<T>;
  const int64_t rep = g.H / g.KV, q_tiles = (g.T + kBlock - 1) / kBlock;
#pragma omp parallel
  {
    std::vector<A> qt(static_cast<size_t>(kBlock * g.D)), acc(static_cast<size_t>(kBlock * g.D)),
        kb(static_cast<size_t>(kBlock * g.D)), vb(static_cast<size_t>(kBlock * g.D)), m(kBlock), l(kBlock),
        s(static_cast<size_t>(kBlock * kBlock)), z(kBlock, A(1));
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t h = 0; h < g.H; ++h)
        for (int64_t qt_i = 0; qt_i < q_tiles; ++qt_i) {
          const int64_t t0 = qt_i * kBlock, t1 = std::min(g.T, t0 + kBlock), nt = t1 - t0;
          const int64_t kvh = h / rep;
          const T* qp = q + g.rows.q.at(b, h, t0);
          const T* kp = k + g.rows.k.at(b, kvh, 0);
          const T* vp = v + g.rows.v.at(b, kvh, 0);
          for (int64_t i = 0; i < nt; ++i)
            for (int64_t c = 0; c < g.D; ++c)
              qt[i * g.D + c] = load(qp + i * g.rows.q.row, c) * static_cast<A>(g.scale);
          std::fill(acc.begin(), acc.begin() + nt * g.D, A(0));
          std::fill(m.begin(), m.end(), -std::numeric_limits<A>::infinity());
          std::fill(l.begin(), l.end(), A(0));
          const int64_t s_end = g.last_key(t1 - 1) + 1;
          for (int64_t s0 = g.first_key(t0); s0 < s_end; s0 += kBlock) {
            const int64_t s1 = std::min(s_end, s0 + kBlock), ns = s1 - s0;
            for (int64_t j = 0; j < ns; ++j)
              for (int64_t c = 0; c < g.D; ++c) {
                kb[j * g.D + c] = load(kp + (s0 + j) * g.rows.k.row, c);
                vb[j * g.D + c] = load(vp + (s0 + j) * g.rows.v.row, c);
              }
            for (int64_t i = 0; i < nt; ++i) {
              const A* qi = qt.data() + i * g.D;
              A* si = s.data() + i * kBlock;
              A mx = m[i];
              for (int64_t j = 0; j < ns; ++j) {
                if (!g.visible(b, t0 + i, s0 + j)) {
                  si[j] = -std::numeric_limits<A>::infinity();
                  continue;
                }
                const A* kj = kb.data() + j * g.D;
                A d = 0;
#pragma omp simd reduction(+ : d)
                for (int64_t c = 0; c < g.D; ++c) d += qi[c] * kj[c];
                si[j] = d;
                mx = std::max(mx, d);
              }
              if (mx == -std::numeric_limits<A>::infinity()) continue;  // nothing visible yet
              const A corr = std::exp(m[i] - mx);
              A* ai = acc.data() + i * g.D;
              A rowsum = 0;
              for (int64_t c = 0; c < g.D; ++c) ai[c] *= corr;
              // The block's probabilities (unnormalized) at once: a vector exp for f32.
              for (int64_t j = 0; j < ns; ++j) si[j] -= mx;
              if constexpr (std::is_same_v<A, float>)
                unary_row<backend::UnaryOp::exp>(si, si, ns);
              else
                for (int64_t j = 0; j < ns; ++j) si[j] = std::exp(si[j]);
              if (g.dropout > 0) attn::drop_factors(g, b * g.H + h, t0 + i, s0, ns, z.data());
              for (int64_t j = 0; j < ns; ++j) {
                const A p = si[j];
                if (p == A(0)) continue;
                rowsum += p;  // the softmax's sum is undropped; the product takes p * z
                const A pz = p * z[j];
                const A* vj = vb.data() + j * g.D;
#pragma omp simd
                for (int64_t c = 0; c < g.D; ++c) ai[c] += pz * vj[c];
              }
              l[i] = l[i] * corr + rowsum;
              m[i] = mx;
            }
          }
          T* op = out + g.rows.out.at(b, h, t0);
          A* lp = lse + (b * g.H + h) * g.T + t0;
          for (int64_t i = 0; i < nt; ++i) {
            const A inv = l[i] > A(0) ? A(1) / l[i] : A(0);
            for (int64_t c = 0; c < g.D; ++c) store(op + i * g.rows.out.row, c, acc[i * g.D + c] * inv);
            lp[i] = l[i] > A(0) ? m[i] + std::log(l[i]) : -std::numeric_limits<A>::infinity();
          }
        }
  }
}

template <typename T>
void backward_kernel(const Geo& g, const T* q, const T* k, const T* v, const T* out, const acc_t<T>* lse,
                     const T* dout, T* dq, T* dk, T* dv) {
  using A = acc_t<T>;
  const int64_t rep = g.H / g.KV;
#pragma omp parallel
  {
    std::vector<A> dka(static_cast<size_t>(g.S * g.D)), dva(static_cast<size_t>(g.S * g.D)),
        dqa(static_cast<size_t>(g.T * g.D)), delta(static_cast<size_t>(g.T)),
        kf(static_cast<size_t>(g.S * g.D)), vf(static_cast<size_t>(g.S * g.D)),
        qrow(static_cast<size_t>(g.D)), dorow(static_cast<size_t>(g.D)), prow(static_cast<size_t>(g.S)),
        dprow(static_cast<size_t>(g.S)), zrow(static_cast<size_t>(g.S), A(1));
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t kvh = 0; kvh < g.KV; ++kvh) {
        const T* kp = k + g.rows.k.at(b, kvh, 0);
        const T* vp = v + g.rows.v.at(b, kvh, 0);
        for (int64_t s = 0; s < g.S; ++s)
          for (int64_t c = 0; c < g.D; ++c) {
            kf[s * g.D + c] = load(kp + s * g.rows.k.row, c);
            vf[s * g.D + c] = load(vp + s * g.rows.v.row, c);
          }
        std::fill(dka.begin(), dka.end(), A(0));
        std::fill(dva.begin(), dva.end(), A(0));
        for (int64_t r = 0; r < rep; ++r) {
          const int64_t h = kvh * rep + r;
          const T* qh = q + g.rows.q.at(b, h, 0);
          const T* oh = out + g.rows.out.at(b, h, 0);
          const T* doh = dout + g.rows.dout.at(b, h, 0);
          const A* lp = lse + (b * g.H + h) * g.T;
          std::fill(dqa.begin(), dqa.end(), A(0));
          for (int64_t t = 0; t < g.T; ++t) {  // delta_t = rowsum(dO * O)
            A d = 0;
            for (int64_t c = 0; c < g.D; ++c)
              d += load(doh + t * g.rows.dout.row, c) * load(oh + t * g.rows.out.row, c);
            delta[t] = d;
          }
          for (int64_t t = 0; t < g.T; ++t) {
            if (lp[t] == -std::numeric_limits<A>::infinity()) continue;  // row attended nothing
            for (int64_t c = 0; c < g.D; ++c) {
              qrow[c] = load(qh + t * g.rows.q.row, c);
              dorow[c] = load(doh + t * g.rows.dout.row, c);
            }
            A* dqt = dqa.data() + t * g.D;
            const int64_t s_end = g.last_key(t) + 1;
            // The row's scores and dO.V first, then its probabilities in one vector exp (f32), then the
            // accumulation in key order.
            for (int64_t s = 0; s < s_end; ++s) {
              if (!g.visible(b, t, s)) {
                prow[s] = -std::numeric_limits<A>::infinity();
                continue;
              }
              const A* ks = kf.data() + s * g.D;
              const A* vs = vf.data() + s * g.D;
              A sc = 0, dp = 0;
#pragma omp simd reduction(+ : sc, dp)
              for (int64_t c = 0; c < g.D; ++c) {
                sc += qrow[c] * ks[c];
                dp += dorow[c] * vs[c];
              }
              prow[s] = sc * static_cast<A>(g.scale) - lp[t];
              dprow[s] = dp;
            }
            if constexpr (std::is_same_v<A, float>)
              unary_row<backend::UnaryOp::exp>(prow.data(), prow.data(), s_end);
            else
              for (int64_t s = 0; s < s_end; ++s) prow[s] = std::exp(prow[s]);
            if (g.dropout > 0) attn::drop_factors(g, b * g.H + h, t, 0, s_end, zrow.data());
            for (int64_t s = 0; s < s_end; ++s) {
              if (!g.visible(b, t, s)) continue;
              const A* ks = kf.data() + s * g.D;
              const A z = zrow[s], p = prow[s] * z, dp = dprow[s];  // p: the dropped probability (for dv)
              const A ds = prow[s] * (dp * z - delta[t]) * static_cast<A>(g.scale);
              A* dks = dka.data() + s * g.D;
              A* dvs = dva.data() + s * g.D;
#pragma omp simd
              for (int64_t c = 0; c < g.D; ++c) {
                dvs[c] += p * dorow[c];
                dks[c] += ds * qrow[c];
                dqt[c] += ds * ks[c];
              }
            }
          }
          T* dqh = dq + g.rows.dq.at(b, h, 0);
          for (int64_t t = 0; t < g.T; ++t)
            for (int64_t c = 0; c < g.D; ++c) store(dqh + t * g.rows.dq.row, c, dqa[t * g.D + c]);
        }
        T* dkp = dk + g.rows.dk.at(b, kvh, 0);
        T* dvp = dv + g.rows.dv.at(b, kvh, 0);
        for (int64_t s = 0; s < g.S; ++s)
          for (int64_t c = 0; c < g.D; ++c) {
            store(dkp + s * g.rows.dk.row, c, dka[s * g.D + c]);
            store(dvp + s * g.rows.dv.row, c, dva[s * g.D + c]);
          }
      }
  }
}

void check_dropout(const backend::AttentionDropout& drop) {
  TR_CHECK(drop.p >= 0 && drop.p < 1, "attention: dropout {} must be in [0, 1)", drop.p);
}

}  // namespace

// bf16 attention runs its tile products on AMX where this process may use the tiles, else on AVX512_BF16 dot
// products where bf16 matmuls run natively (AMD Zen 4 and later: NativeMatmul::preferred; Intel's
// AVX512_BF16 without AMX runs them slower than f32 FMAs), for head dims that fill whole 32-deep steps;
// elsewhere on widened sgemm tiles.
std::optional<Bf16Tiles> CpuBackend::bf16_attention_tiles(int64_t head_dim) const {
  if (head_dim % 32 != 0) return std::nullopt;
  if (native_.amx_tiles()) return Bf16Tiles::amx;
  if (native_.native_for(DType::bf16) && dpbf16::available()) return Bf16Tiles::avx512_bf16;
  return std::nullopt;
}

void CpuBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                           bool causal, int64_t window, double scale, const backend::AttentionDropout& drop,
                           const Tensor& out, const Tensor& lse) {
  check_dropout(drop);
  const Geo g = backend::attention_geometry(q, k, v, key_keep, causal, window, scale, drop, out);
  dispatch_float(q.dtype(), "attention", [&]<typename T>() {
    if constexpr (std::is_same_v<T, BFloat16>) {
      if (const auto tiles = bf16_attention_tiles(g.D)) {
        attention_bf16_forward(*tiles, g, q.data<BFloat16>(), k.data<BFloat16>(), v.data<BFloat16>(),
                               out.data<BFloat16>(), lse.data<float>());
        return;
      }
    }
    if constexpr (!std::is_same_v<T, double>) {
      attention_gemm_forward<T>(g, static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()),
                                static_cast<const T*>(v.data_ptr()), static_cast<T*>(out.data_ptr()),
                                static_cast<float*>(lse.data_ptr()));
    } else {
      forward_kernel<T>(g, static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()),
                        static_cast<const T*>(v.data_ptr()), static_cast<T*>(out.data_ptr()),
                        static_cast<acc_t<T>*>(lse.data_ptr()));
    }
  });
}

void CpuBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                                    bool causal, int64_t window, double scale,
                                    const backend::AttentionDropout& drop, const Tensor& out,
                                    const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                                    const Tensor& dv) {
  check_dropout(drop);
  const Geo g =
      backend::attention_geometry(q, k, v, key_keep, causal, window, scale, drop, out, dout, dq, dk, dv);
  dispatch_float(q.dtype(), "attention_backward", [&]<typename T>() {
    if constexpr (std::is_same_v<T, BFloat16>) {
      if (const auto tiles = bf16_attention_tiles(g.D)) {
        attention_bf16_backward(*tiles, g, q.data<BFloat16>(), k.data<BFloat16>(), v.data<BFloat16>(),
                                out.data<BFloat16>(), lse.data<float>(), dout.data<BFloat16>(),
                                dq.data<BFloat16>(), dk.data<BFloat16>(), dv.data<BFloat16>());
        return;
      }
    }
    if constexpr (!std::is_same_v<T, double>) {
      attention_gemm_backward<T>(g, static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()),
                                 static_cast<const T*>(v.data_ptr()), static_cast<const T*>(out.data_ptr()),
                                 static_cast<const float*>(lse.data_ptr()),
                                 static_cast<const T*>(dout.data_ptr()), static_cast<T*>(dq.data_ptr()),
                                 static_cast<T*>(dk.data_ptr()), static_cast<T*>(dv.data_ptr()));
    } else {
      backward_kernel<T>(g, static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()),
                         static_cast<const T*>(v.data_ptr()), static_cast<const T*>(out.data_ptr()),
                         static_cast<const acc_t<T>*>(lse.data_ptr()), static_cast<const T*>(dout.data_ptr()),
                         static_cast<T*>(dq.data_ptr()), static_cast<T*>(dk.data_ptr()),
                         static_cast<T*>(dv.data_ptr()));
    }
  });
}

namespace {

// a[i] = exp(a[i]): the AVX2 kernel for f32, libm for f64.
inline void exp_in_place(float* a, int64_t n) { unary_row<backend::UnaryOp::exp>(a, a, n); }
inline void exp_in_place(double* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = std::exp(a[i]);
}

// The geometry of a block's rows, and row -> (batch, query) (backend.h AttentionBlock).
struct BlockRows {
  backend::AttentionGeometry g;
  int64_t rows, per_group, t0, tq, sk;
  float dropout;
  double keep_scale;
  uint64_t seed, offset;
  explicit BlockRows(const backend::Backend::AttentionBlock& a)
      : g{a.B,      a.H,     a.KV,
          a.T,      a.S,     0,
          a.causal, a.scale, a.key_keep.defined() ? a.key_keep.data<bool>() : nullptr,
          a.window},
        rows(a.B * a.H * a.tq),
        per_group(a.H / a.KV * a.tq),
        t0(a.t0),
        tq(a.tq),
        sk(a.sk),
        dropout(static_cast<float>(a.dropout)),
        keep_scale(1.0 / (1.0 - a.dropout)),
        seed(a.seed),
        offset(a.offset) {}
  int64_t batch(int64_t row) const { return row / per_group / g.KV; }
  int64_t query(int64_t row) const { return t0 + row % per_group % tq; }
  // The dropout factor of (row, key s): 1 without dropout, else 0 or 1 / (1 - p) from the element's index in
  // the [B, H, T, S] probabilities (dropout() on that tensor draws the same).
  // A row's factors for keys 0 .. sk - 1 into z: one Philox block per four keys, the index found once.
  template <typename A>
  void factors(int64_t row, A* z) const {
    if (dropout == 0.0f) {
      std::fill(z, z + sk, A(1));
      return;
    }
    const int64_t grp = row / per_group, rr = row % per_group;
    const int64_t h = grp % g.KV * (g.H / g.KV) + rr / tq;
    const auto first = static_cast<uint64_t>(((batch(row) * g.H + h) * g.T + query(row)) * g.S);
    constexpr int64_t kRun = 256;  // words into L1, then the factors in vectors
    alignas(64) uint32_t w[kRun];
    const A keep = static_cast<A>(keep_scale);
    for (int64_t s0 = 0; s0 < sk; s0 += kRun) {
      const int64_t m = std::min(kRun, sk - s0);
      philox_fill(seed, offset, first + static_cast<uint64_t>(s0), m, w);
#pragma omp simd
      for (int64_t s = 0; s < m; ++s) z[s0 + s] = uniform_from_word(w[s]) >= dropout ? keep : A(0);
    }
  }
};

}  // namespace

void CpuBackend::attention_block_softmax(const Tensor& scores, const AttentionBlock& a, const Tensor& probs,
                                         const Tensor& lse) {
  const BlockRows br(a);
  dispatch_float(scores.dtype(), "attention_block_softmax", [&]<typename A>() {
    if constexpr (std::is_same_v<A, float> || std::is_same_v<A, double>) {
      dispatch_float(probs.dtype(), "attention_block_softmax", [&]<typename P>() {
        const A* sp = scores.data<A>();
        P* pp = probs.data<P>();
        A* lp = lse.data<A>();
        const A scale = static_cast<A>(a.scale);
        constexpr A kNegInf = -std::numeric_limits<A>::infinity();
#pragma omp parallel if (br.rows * br.sk > 65536)
        {
          std::vector<A> e(static_cast<size_t>(br.sk));  // a row's exponents, then their exponentials
          std::vector<A> z(static_cast<size_t>(br.sk));  // its dropout factors
#pragma omp for schedule(static)
          for (int64_t r = 0; r < br.rows; ++r) {
            const int64_t b = br.batch(r), t = br.query(r);
            const A* x = sp + r * br.sk;
            P* p = pp + r * br.sk;
            A m = kNegInf;
            for (int64_t s = 0; s < br.sk; ++s)
              if (br.g.visible(b, t, s)) m = std::max(m, x[s] * scale);
            if (m == kNegInf) {
              for (int64_t s = 0; s < br.sk; ++s) p[s] = P(A(0));
              lp[r] = m;
              continue;
            }
            // Masked keys get exp(-inf) = 0: they add nothing to the sum, in key order as before.
            for (int64_t s = 0; s < br.sk; ++s) e[s] = br.g.visible(b, t, s) ? x[s] * scale - m : kNegInf;
            exp_in_place(e.data(), br.sk);
            A sum = 0;
            for (int64_t s = 0; s < br.sk; ++s) sum += e[s];
            const A l = m + std::log(sum);
            lp[r] = l;
            for (int64_t s = 0; s < br.sk; ++s) e[s] = br.g.visible(b, t, s) ? x[s] * scale - l : kNegInf;
            exp_in_place(e.data(), br.sk);
            br.factors(r, z.data());
            for (int64_t s = 0; s < br.sk; ++s) p[s] = P(e[s] * z[s]);
          }
        }
      });
    } else {
      fail("attention_block_softmax: scores must be f32 or f64, got {}", dtype_name(scores.dtype()));
    }
  });
}

void CpuBackend::attention_block_grad(const Tensor& scores, const Tensor& dp, const Tensor& lse,
                                      const Tensor& delta, const AttentionBlock& a, const Tensor& probs,
                                      const Tensor& dscores) {
  const BlockRows br(a);
  dispatch_float(scores.dtype(), "attention_block_grad", [&]<typename A>() {
    if constexpr (std::is_same_v<A, float> || std::is_same_v<A, double>) {
      dispatch_float(probs.dtype(), "attention_block_grad", [&]<typename P>() {
        const A scale = static_cast<A>(a.scale);
        constexpr A kNegInf = -std::numeric_limits<A>::infinity();
#pragma omp parallel if (br.rows * br.sk > 65536)
        {
          std::vector<A> e(static_cast<size_t>(br.sk));   // the row's probabilities, by one vector exp
          std::vector<A> zr(static_cast<size_t>(br.sk));  // its dropout factors
#pragma omp for schedule(static)
          for (int64_t r = 0; r < br.rows; ++r) {
            const int64_t b = br.batch(r), t = br.query(r);
            const A l = lse.data<A>()[r], d = delta.data<A>()[r];
            const A* x = scores.data<A>() + r * br.sk;
            const A* g = dp.data<A>() + r * br.sk;
            P* p = probs.data<P>() + r * br.sk;
            P* ds = dscores.data<P>() + r * br.sk;
            for (int64_t s = 0; s < br.sk; ++s)
              e[s] = l != kNegInf && br.g.visible(b, t, s) ? x[s] * scale - l : kNegInf;
            exp_in_place(e.data(), br.sk);
            br.factors(r, zr.data());
            for (int64_t s = 0; s < br.sk; ++s) {
              const A pv = e[s], z = zr[s];
              p[s] = P(pv * z);
              ds[s] = P(pv * (g[s] * z - d) * scale);
            }
          }
        }
      });
    } else {
      fail("attention_block_grad: scores must be f32 or f64, got {}", dtype_name(scores.dtype()));
    }
  });
}

}  // namespace tr::cpu
