// CPU fused attention for bf16 on AMX tiles: attention_gemm.cpp's tiling (64 queries against blocks of 256
// keys, online softmax forward, probabilities recomputed from the logsumexp backward) with every tile product
// an AMX bf16 dot product accumulating in f32, instead of an sgemm on operands widened to f32. As
// FlashAttention-2 on a GPU, the probabilities (and dS backward) are rounded to bf16 as the second product's
// operand; the softmax statistics stay f32. Bound by the f32 row work (mask, exp, rounding, transposes) once
// the products run on tiles: at T = 64 the five backward products of a tile take less time than its exp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/attention_kernels.h"
#include "backend/cpu/attention_rows.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vec_unary.h"

namespace tr::cpu {

using namespace attn;

namespace {

constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// A tile's first key block starts at a multiple of 32 (keys before the window's first are masked anyway), so
// blocks stay inside the packed buffers' padding and on whole VNNI pairs.
int64_t first_block(const backend::AttentionGeometry& g, int64_t t0) { return g.first_key(t0) / 32 * 32; }

// rows x D bf16 rows from p into a, rows rows .. rows_pad zeroed (a tile's A operand).
void load_rows(const BFloat16* p, int64_t rows, int64_t rows_pad, int64_t D, BFloat16* a) {
  std::copy(p, p + rows * D, a);
  std::fill(a + rows * D, a + rows_pad * D, BFloat16{});
}

// dst[i * ld + j] = bf16(src[i * lds + j]) for i < rows, j < cols; zero up to cols_pad and rows_pad.
void round_rows(const float* src, int64_t lds, int64_t rows, int64_t cols, int64_t rows_pad, int64_t cols_pad,
                BFloat16* dst) {
  for (int64_t i = 0; i < rows; ++i) {
    narrow_run(src + i * lds, dst + i * cols_pad, cols);
    std::fill(dst + i * cols_pad + cols, dst + (i + 1) * cols_pad, BFloat16{});
  }
  std::fill(dst + rows * cols_pad, dst + rows_pad * cols_pad, BFloat16{});
}

// dst = bf16(src)^T: dst[j * ld + i] for i < rows, j < cols; zero for i in rows .. ld and j in cols ..
// cols_pad.
void round_transposed(const float* src, int64_t lds, int64_t rows, int64_t cols, int64_t cols_pad, int64_t ld,
                      BFloat16* dst) {
  std::fill(dst, dst + cols_pad * ld, BFloat16{});
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * ld + i] = from_f32<BFloat16>(src[i * lds + j]);
}

}  // namespace

void attention_amx_forward(const backend::AttentionGeometry& g, const BFloat16* q, const BFloat16* k,
                           const BFloat16* v, BFloat16* out, float* lse) {
  const int64_t D = g.D, rep = g.H / g.KV, q_tiles = (g.T + kQ - 1) / kQ;
  const bool wide = cpu_has_avx512f();
  const float scale = static_cast<float>(g.scale);
#pragma omp parallel
  {
    std::vector<BFloat16> qa(static_cast<size_t>(kQ * D)), kt(static_cast<size_t>(kK * D)),
        vv(static_cast<size_t>(kK * D)), pb(static_cast<size_t>(kQ * kK));
    std::vector<float> s(static_cast<size_t>(kQ * kK)), acc(static_cast<size_t>(kQ * D)), m(kQ), l(kQ);
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t h = 0; h < g.H; ++h)
        for (int64_t tile = 0; tile < q_tiles; ++tile) {
          const int64_t t0 = tile * kQ, nt = std::min(kQ, g.T - t0), m16 = round_up(nt, 16), kvh = h / rep;
          const BFloat16* kp = k + (b * g.KV + kvh) * g.S * D;
          const BFloat16* vp = v + (b * g.KV + kvh) * g.S * D;
          load_rows(q + ((b * g.H + h) * g.T + t0) * D, nt, m16, D, qa.data());
          std::fill(acc.begin(), acc.begin() + m16 * D, 0.0f);
          std::fill(m.begin(), m.end(), kNegInf);
          std::fill(l.begin(), l.end(), 0.0f);
          const int64_t s_end = g.last_key(t0 + nt - 1) + 1;
          for (int64_t s0 = first_block(g, t0); s0 < s_end; s0 += kK) {
            const int64_t ns = std::min(kK, s_end - s0), n16 = round_up(ns, 16), k32 = round_up(ns, 32);
            amx::pack_transposed(kp + s0 * D, ns, D, D, n16, kt.data());
            amx::gemm(m16, n16, D, qa.data(), D, kt.data(), 2 * n16, s.data(), n16, false);  // s = q k^T
            for (int64_t i = 0; i < nt; ++i) {
              float* si = s.data() + i * n16;
              for (int64_t j = 0; j < ns; ++j) si[j] *= scale;
              mask_row(g, b, t0 + i, s0, ns, si);
              const float bm = max_of(si, ns, wide);
              const float mx = bm > m[i] || bm != bm ? bm : m[i];
              if (mx == kNegInf) {  // nothing visible yet: the row adds nothing to the product below
                std::fill(si, si + ns, 0.0f);
                continue;
              }
              const float corr = std::exp(m[i] - mx);
              const float rowsum = exp_sum_of(si, mx, ns, wide);
              if (m[i] != kNegInf && corr != 1.0f)
                for (int64_t c = 0; c < D; ++c) acc[i * D + c] *= corr;
              l[i] = l[i] * corr + rowsum;
              m[i] = mx;
            }
            round_rows(s.data(), n16, nt, ns, m16, k32, pb.data());
            amx::pack_pairs(vp + s0 * D, ns, D, D, k32, vv.data());
            amx::gemm(m16, D, k32, pb.data(), k32, vv.data(), 2 * D, acc.data(), D, true);  // acc += P V
          }
          BFloat16* op = out + ((b * g.H + h) * g.T + t0) * D;
          float* lp = lse + (b * g.H + h) * g.T + t0;
          for (int64_t i = 0; i < nt; ++i) {
            const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
            for (int64_t c = 0; c < D; ++c) store(op, i * D + c, acc[i * D + c] * inv);
            lp[i] = l[i] > 0.0f ? m[i] + std::log(l[i]) : kNegInf;
          }
        }
    amx::release();
  }
}

// Per (batch, kv head): k^T, v^T and k packed once for the whole sequence; per query tile: q and dout as A
// rows and as VNNI pairs (the B operands of dk += dS^T q, dv += P^T dout).
void attention_amx_backward(const backend::AttentionGeometry& g, const BFloat16* q, const BFloat16* k,
                            const BFloat16* v, const BFloat16* out, const float* lse, const BFloat16* dout,
                            BFloat16* dq, BFloat16* dk, BFloat16* dv) {
  const int64_t D = g.D, S = g.S, rep = g.H / g.KV, S16 = round_up(S, 16), S32 = round_up(S, 32);
  const float scale = static_cast<float>(g.scale);
#pragma omp parallel
  {
    std::vector<BFloat16> kt(static_cast<size_t>(S16 * D)), vt(kt.size()),
        kpairs(static_cast<size_t>(S32 * D)), qa(static_cast<size_t>(kQ * D)), doa(qa.size()),
        qpairs(qa.size()), dopairs(qa.size()), pt(static_cast<size_t>(kK * kQ)), dst(pt.size()),
        dsb(pt.size());
    std::vector<float> dka(static_cast<size_t>(S16 * D)), dva(dka.size()), dof(static_cast<size_t>(kQ * D)),
        of(dof.size()), dqt(dof.size()), p(static_cast<size_t>(kQ * kK)), ds(p.size()), delta(kQ);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t kvh = 0; kvh < g.KV; ++kvh) {
        const int64_t kv_off = (b * g.KV + kvh) * S * D;
        amx::pack_transposed(k + kv_off, S, D, D, S16, kt.data());
        amx::pack_transposed(v + kv_off, S, D, D, S16, vt.data());
        amx::pack_pairs(k + kv_off, S, D, D, S32, kpairs.data());
        std::fill(dka.begin(), dka.end(), 0.0f);
        std::fill(dva.begin(), dva.end(), 0.0f);
        for (int64_t r = 0; r < rep; ++r) {
          const int64_t h = kvh * rep + r;
          for (int64_t t0 = 0; t0 < g.T; t0 += kQ) {
            const int64_t nt = std::min(kQ, g.T - t0), m16 = round_up(nt, 16), q32 = round_up(nt, 32);
            const int64_t off = ((b * g.H + h) * g.T + t0) * D;
            const float* lp = lse + (b * g.H + h) * g.T + t0;
            load_rows(q + off, nt, m16, D, qa.data());
            load_rows(dout + off, nt, m16, D, doa.data());
            amx::pack_pairs(q + off, nt, D, D, q32, qpairs.data());
            amx::pack_pairs(dout + off, nt, D, D, q32, dopairs.data());
            to_f32(dout + off, nt * D, dof.data());
            to_f32(out + off, nt * D, of.data());
            for (int64_t i = 0; i < nt; ++i) delta[i] = row_dot(dof.data() + i * D, of.data() + i * D, D);
            std::fill(dqt.begin(), dqt.begin() + m16 * D, 0.0f);
            const int64_t s_end = g.last_key(t0 + nt - 1) + 1;
            for (int64_t s0 = first_block(g, t0); s0 < s_end; s0 += kK) {
              const int64_t ns = std::min(kK, s_end - s0), n16 = round_up(ns, 16), k32 = round_up(ns, 32);
              amx::gemm(m16, n16, D, qa.data(), D, kt.data() + 2 * s0, 2 * S16, p.data(), n16, false);
              amx::gemm(m16, n16, D, doa.data(), D, vt.data() + 2 * s0, 2 * S16, ds.data(), n16, false);
              for (int64_t i = 0; i < nt; ++i) {
                float* pi = p.data() + i * n16;
                float* di = ds.data() + i * n16;
                if (lp[i] == kNegInf) {  // the row attended nothing: no gradient through it
                  std::fill(pi, pi + ns, 0.0f);
                  std::fill(di, di + ns, 0.0f);
                  continue;
                }
                for (int64_t j = 0; j < ns; ++j) pi[j] = pi[j] * scale - lp[i];
                mask_row(g, b, t0 + i, s0, ns, pi);
                unary_row<backend::UnaryOp::exp>(pi, pi, ns);
                for (int64_t j = 0; j < ns; ++j) di[j] = pi[j] * (di[j] - delta[i]) * scale;
              }
              round_transposed(p.data(), n16, nt, ns, n16, q32, pt.data());
              round_transposed(ds.data(), n16, nt, ns, n16, q32, dst.data());
              round_rows(ds.data(), n16, nt, ns, m16, k32, dsb.data());
              amx::gemm(n16, D, q32, pt.data(), q32, dopairs.data(), 2 * D, dva.data() + s0 * D, D, true);
              amx::gemm(n16, D, q32, dst.data(), q32, qpairs.data(), 2 * D, dka.data() + s0 * D, D, true);
              amx::gemm(m16, D, k32, dsb.data(), k32, kpairs.data() + s0 * D, 2 * D, dqt.data(), D, true);
            }
            for (int64_t i = 0; i < nt * D; ++i) store(dq + off, i, dqt[i]);
          }
        }
        for (int64_t i = 0; i < S * D; ++i) {
          store(dk + kv_off, i, dka[i]);
          store(dv + kv_off, i, dva[i]);
        }
      }
    amx::release();
  }
}

}  // namespace tr::cpu
