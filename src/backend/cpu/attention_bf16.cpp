// CPU fused attention for bf16 with every tile product a native bf16 dot product accumulating in f32 - on AMX
// tiles (Xeon) or AVX512_BF16 dot products (AMD Zen 4 and later) - instead of an sgemm on operands widened to
// f32: attention_gemm.cpp's tiling (64 queries against blocks of 256 keys, online softmax forward,
// probabilities recomputed from the logsumexp backward). As FlashAttention-2 on a GPU, the probabilities
// (and dS backward) are rounded to bf16 as the second product's operand; the softmax statistics stay f32.
// Attention dropout scales the probabilities of the P V and P^T dO products (drop_factors). Bound by the f32
// row work (mask, exp, rounding, transposes) once the products are native: at T = 64 the five backward
// products of a tile take less time than its exp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/attention_kernels.h"
#include "backend/cpu/attention_rows.h"
#include "backend/cpu/bf16_dot.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vec_unary.h"

namespace tr::cpu {

using namespace attn;

namespace {

constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// A tile's first key block starts at a multiple of 32 (keys before the window's first are masked anyway), so
// blocks stay inside the packed buffers' padding and on whole VNNI pairs.
int64_t first_block(const backend::AttentionGeometry& g, int64_t t0) { return g.first_key(t0) / 32 * 32; }

// rows x D bf16 rows, ld apart from p, into dense rows of a, rows rows .. rows_pad zeroed (a tile's A
// operand).
void load_rows(const BFloat16* p, int64_t ld, int64_t rows, int64_t rows_pad, int64_t D, BFloat16* a) {
  for (int64_t r = 0; r < rows; ++r) std::copy(p + r * ld, p + r * ld + D, a + r * D);
  std::fill(a + rows * D, a + rows_pad * D, BFloat16{});
}

// dst[i * cols_pad + j] = bf16(src[i * lds + j]) for i < rows, j < cols; zero up to cols_pad and rows_pad.
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

// The two tile products the kernels need, on AMX tiles: c = a b (a rows, b VNNI pairs; amx::gemm's padding)
// and c += x^T b for an f32 x rounded to bf16 (transposed into rows: tiles load rows).
struct AmxTiles {
  void product(int64_t M, int64_t N, int64_t K, const BFloat16* a, int64_t lda, const BFloat16* b,
               int64_t ldb, float* c, int64_t ldc, bool accumulate) const {
    amx::gemm(M, N, K, a, lda, b, ldb, c, ldc, accumulate);
  }
  // c[n16 x D] += bf16(x[nt x ns])^T b, b the pairs of q32 rows of D columns; scratch n16 x q32.
  void product_xt(const float* x, int64_t lds, int64_t nt, int64_t ns, int64_t n16, int64_t q32,
                  const BFloat16* b, int64_t D, float* c, BFloat16* scratch) const {
    round_transposed(x, lds, nt, ns, n16, q32, scratch);
    amx::gemm(n16, D, q32, scratch, q32, b, 2 * D, c, D, true);
  }
  void release() const { amx::release(); }
};

// The same on AVX512_BF16 dot products, whose A operand may come as pairs of its transpose: x^T needs no
// transpose, only x's rows rounded in pairs.
struct DotProducts {
  void product(int64_t M, int64_t N, int64_t K, const BFloat16* a, int64_t lda, const BFloat16* b,
               int64_t ldb, float* c, int64_t ldc, bool accumulate) const {
    dpbf16::gemm(M, N, K, a, lda / 2, 1, b, ldb, c, ldc, accumulate);
  }
  void product_xt(const float* x, int64_t lds, int64_t nt, int64_t ns, int64_t n16, int64_t q32,
                  const BFloat16* b, int64_t D, float* c, BFloat16* scratch) const {
    dpbf16::pack_pairs_rounded(x, lds, nt, ns, q32, n16, scratch);
    dpbf16::gemm(n16, D, q32, scratch, 1, n16, b, 2 * D, c, D, true);
  }
  void release() const {}
};

template <class Tiles>
void forward(const Tiles& tiles, const backend::AttentionGeometry& g, const BFloat16* q, const BFloat16* k,
             const BFloat16* v, BFloat16* out, float* lse) {
  const int64_t D = g.D, rep = g.H / g.KV, q_tiles = (g.T + kQ - 1) / kQ;
  const bool wide = cpu_has_avx512f();
  const float scale = static_cast<float>(g.scale);
#pragma omp parallel
  {
    std::vector<BFloat16> qa(static_cast<size_t>(kQ * D)), kt(static_cast<size_t>(kK * D)),
        vv(static_cast<size_t>(kK * D)), pb(static_cast<size_t>(kQ * kK));
    std::vector<float> s(static_cast<size_t>(kQ * kK)), acc(static_cast<size_t>(kQ * D)), m(kQ), l(kQ),
        z(g.dropout > 0 ? kK : 0);
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t h = 0; h < g.H; ++h)
        for (int64_t tile = 0; tile < q_tiles; ++tile) {
          const int64_t t0 = tile * kQ, nt = std::min(kQ, g.T - t0), m16 = round_up(nt, 16), kvh = h / rep;
          const BFloat16* kp = k + g.rows.k.at(b, kvh, 0);
          const BFloat16* vp = v + g.rows.v.at(b, kvh, 0);
          const int64_t ldk = g.rows.k.row, ldv = g.rows.v.row;
          load_rows(q + g.rows.q.at(b, h, t0), g.rows.q.row, nt, m16, D, qa.data());
          std::fill(acc.begin(), acc.begin() + m16 * D, 0.0f);
          std::fill(m.begin(), m.end(), kNegInf);
          std::fill(l.begin(), l.end(), 0.0f);
          const int64_t s_end = g.last_key(t0 + nt - 1) + 1;
          for (int64_t s0 = first_block(g, t0); s0 < s_end; s0 += kK) {
            const int64_t ns = std::min(kK, s_end - s0), n16 = round_up(ns, 16), k32 = round_up(ns, 32);
            amx::pack_transposed(kp + s0 * ldk, ns, D, ldk, n16, kt.data());
            tiles.product(m16, n16, D, qa.data(), D, kt.data(), 2 * n16, s.data(), n16, false);  // s = q k^T
            for (int64_t i = 0; i < nt; ++i) {
              float* si = s.data() + i * n16;
              for (int64_t j = 0; j < ns; ++j) si[j] *= scale;
              mask_row(g, b, t0 + i, s0, ns, si);
              online_softmax_row(g, b * g.H + h, t0 + i, s0, ns, si, m[i], l[i], acc.data() + i * D, D,
                                 z.data(), wide);
            }
            round_rows(s.data(), n16, nt, ns, m16, k32, pb.data());
            amx::pack_pairs(vp + s0 * ldv, ns, D, ldv, k32, vv.data());
            tiles.product(m16, D, k32, pb.data(), k32, vv.data(), 2 * D, acc.data(), D, true);  // acc += P V
          }
          finish_rows(nt, D, acc.data(), m.data(), l.data(), out + g.rows.out.at(b, h, t0), g.rows.out.row,
                      lse + (b * g.H + h) * g.T + t0);
        }
    tiles.release();
  }
}

// Per (batch, kv head): k^T, v^T and k packed once for the whole sequence; per query tile: q and dout as A
// rows and as VNNI pairs (the B operands of dk += dS^T q, dv += P^T dout).
template <class Tiles>
void backward(const Tiles& tiles, const backend::AttentionGeometry& g, const BFloat16* q, const BFloat16* k,
              const BFloat16* v, const BFloat16* out, const float* lse, const BFloat16* dout, BFloat16* dq,
              BFloat16* dk, BFloat16* dv) {
  const int64_t D = g.D, S = g.S, rep = g.H / g.KV, S16 = round_up(S, 16), S32 = round_up(S, 32);
#pragma omp parallel
  {
    std::vector<BFloat16> kt(static_cast<size_t>(S16 * D)), vt(kt.size()),
        kpairs(static_cast<size_t>(S32 * D)), qa(static_cast<size_t>(kQ * D)), doa(qa.size()),
        qpairs(qa.size()), dopairs(qa.size()), xt(static_cast<size_t>(kK * kQ)), dsb(xt.size());
    std::vector<float> dka(static_cast<size_t>(S16 * D)), dva(dka.size()), dof(static_cast<size_t>(kQ * D)),
        of(dof.size()), dqt(dof.size()), p(static_cast<size_t>(kQ * kK)), ds(p.size()), delta(kQ),
        z(g.dropout > 0 ? kK : 0);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t kvh = 0; kvh < g.KV; ++kvh) {
        const BFloat16* kp = k + g.rows.k.at(b, kvh, 0);
        const BFloat16* vp = v + g.rows.v.at(b, kvh, 0);
        amx::pack_transposed(kp, S, D, g.rows.k.row, S16, kt.data());
        amx::pack_transposed(vp, S, D, g.rows.v.row, S16, vt.data());
        amx::pack_pairs(kp, S, D, g.rows.k.row, S32, kpairs.data());
        std::fill(dka.begin(), dka.end(), 0.0f);
        std::fill(dva.begin(), dva.end(), 0.0f);
        for (int64_t r = 0; r < rep; ++r) {
          const int64_t h = kvh * rep + r;
          for (int64_t t0 = 0; t0 < g.T; t0 += kQ) {
            const int64_t nt = std::min(kQ, g.T - t0), m16 = round_up(nt, 16), q32 = round_up(nt, 32);
            const BFloat16* qp = q + g.rows.q.at(b, h, t0);
            const BFloat16* dop = dout + g.rows.dout.at(b, h, t0);
            const int64_t ldq = g.rows.q.row, lddo = g.rows.dout.row;
            const float* lp = lse + (b * g.H + h) * g.T + t0;
            load_rows(qp, ldq, nt, m16, D, qa.data());
            load_rows(dop, lddo, nt, m16, D, doa.data());
            amx::pack_pairs(qp, nt, D, ldq, q32, qpairs.data());
            amx::pack_pairs(dop, nt, D, lddo, q32, dopairs.data());
            rows_to_f32(dop, nt, lddo, D, dof.data());
            rows_to_f32(out + g.rows.out.at(b, h, t0), nt, g.rows.out.row, D, of.data());
            for (int64_t i = 0; i < nt; ++i) delta[i] = row_dot(dof.data() + i * D, of.data() + i * D, D);
            std::fill(dqt.begin(), dqt.begin() + m16 * D, 0.0f);
            const int64_t s_end = g.last_key(t0 + nt - 1) + 1;
            for (int64_t s0 = first_block(g, t0); s0 < s_end; s0 += kK) {
              const int64_t ns = std::min(kK, s_end - s0), n16 = round_up(ns, 16), k32 = round_up(ns, 32);
              tiles.product(m16, n16, D, qa.data(), D, kt.data() + 2 * s0, 2 * S16, p.data(), n16, false);
              tiles.product(m16, n16, D, doa.data(), D, vt.data() + 2 * s0, 2 * S16, ds.data(), n16, false);
              tile_grads(g, b, h, t0, nt, s0, ns, n16, lp, delta.data(), p.data(), ds.data(), z.data());
              round_rows(ds.data(), n16, nt, ns, m16, k32, dsb.data());
              tiles.product_xt(p.data(), n16, nt, ns, n16, q32, dopairs.data(), D, dva.data() + s0 * D,
                               xt.data());  // dv += P^T dO
              tiles.product_xt(ds.data(), n16, nt, ns, n16, q32, qpairs.data(), D, dka.data() + s0 * D,
                               xt.data());  // dk += dS^T q
              tiles.product(m16, D, k32, dsb.data(), k32, kpairs.data() + s0 * D, 2 * D, dqt.data(), D, true);
            }
            store_rows(dqt.data(), nt, D, dq + g.rows.dq.at(b, h, t0), g.rows.dq.row);
          }
        }
        store_rows(dka.data(), S, D, dk + g.rows.dk.at(b, kvh, 0), g.rows.dk.row);
        store_rows(dva.data(), S, D, dv + g.rows.dv.at(b, kvh, 0), g.rows.dv.row);
      }
    tiles.release();
  }
}

}  // namespace

void attention_bf16_forward(Bf16Tiles tiles, const backend::AttentionGeometry& g, const BFloat16* q,
                            const BFloat16* k, const BFloat16* v, BFloat16* out, float* lse) {
  if (tiles == Bf16Tiles::amx)
    forward(AmxTiles{}, g, q, k, v, out, lse);
  else
    forward(DotProducts{}, g, q, k, v, out, lse);
}

void attention_bf16_backward(Bf16Tiles tiles, const backend::AttentionGeometry& g, const BFloat16* q,
                             const BFloat16* k, const BFloat16* v, const BFloat16* out, const float* lse,
                             const BFloat16* dout, BFloat16* dq, BFloat16* dk, BFloat16* dv) {
  if (tiles == Bf16Tiles::amx)
    backward(AmxTiles{}, g, q, k, v, out, lse, dout, dq, dk, dv);
  else
    backward(DotProducts{}, g, q, k, v, out, lse, dout, dq, dk, dv);
}

}  // namespace tr::cpu
