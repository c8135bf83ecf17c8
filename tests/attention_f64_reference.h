// An f64 attention forward and backward for the emulated CUDA kernels' tests: any case type with the
// shape fields (B, H, KV, T, S, D), the geometry's masking rule, inputs read through `in` (q, k, v, dout by
// row, position, dim) and dropout factors z(bh, t, s) as the kernel under test applies them.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/attention_geometry.h"

namespace tr::test {

using Geo = backend::AttentionGeometry;

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// f64 attention forward and backward on the rounded inputs (values as read by `in`), dropout factors z.
template <typename Case, typename In, typename Z>
Reference reference(const Case& c, const Geo& g, In in, Z z) {
  const int64_t T = c.T, S = c.S, D = c.D, rep = c.H / c.KV;
  Reference r{std::vector<double>(c.B * c.H * T * D), std::vector<double>(c.B * c.H * T),
              std::vector<double>(c.B * c.H * T * D), std::vector<double>(c.B * c.KV * S * D),
              std::vector<double>(c.B * c.KV * S * D)};
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t bh = b * c.H + h, bkv = b * c.KV + h / rep;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> sc(S, -INFINITY), p(S, 0.0), o(D, 0.0);
        double m = -INFINITY;
        for (int64_t s = 0; s < S; ++s) {
          if (!g.visible(b, t, s)) continue;
          double a = 0;
          for (int64_t d = 0; d < D; ++d) a += in.q(bh, t, d) * in.k(bkv, s, d);
          sc[s] = a * g.scale;
          m = std::max(m, sc[s]);
        }
        double l = 0;
        for (int64_t s = 0; s < S; ++s)
          if (sc[s] != -INFINITY) l += std::exp(sc[s] - m);
        r.lse[bh * T + t] = l > 0 ? m + std::log(l) : -INFINITY;
        if (l == 0) continue;
        for (int64_t s = 0; s < S; ++s) p[s] = sc[s] == -INFINITY ? 0 : std::exp(sc[s] - m) / l;
        for (int64_t s = 0; s < S; ++s)
          for (int64_t d = 0; d < D && p[s] != 0; ++d) o[d] += p[s] * z(bh, t, s) * in.v(bkv, s, d);
        double delta = 0;
        for (int64_t d = 0; d < D; ++d) {
          r.out[(bh * T + t) * D + d] = o[d];
          delta += o[d] * in.dout(bh, t, d);
        }
        for (int64_t s = 0; s < S; ++s) {
          if (p[s] == 0) continue;
          double dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += in.dout(bh, t, d) * in.v(bkv, s, d);
          const double ds = p[s] * (dp * z(bh, t, s) - delta) * g.scale;
          for (int64_t d = 0; d < D; ++d) {
            r.dq[(bh * T + t) * D + d] += ds * in.k(bkv, s, d);
            r.dk[(bkv * S + s) * D + d] += ds * in.q(bh, t, d);
            r.dv[(bkv * S + s) * D + d] += p[s] * z(bh, t, s) * in.dout(bh, t, d);
          }
        }
      }
    }
  return r;
}

}  // namespace tr::test
