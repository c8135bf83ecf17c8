// Attention operands placed as models lay them out, for the kernel tests (Backend::attention reads and
// writes every operand through HeadRows): dense [B, H, T, D]; sequence-major [B, T, H, D] (a projection
// viewed as heads, the output a model merges heads from); or q, k, v packed in one [B, T, 3, H, D]
// projection read in place with their gradients written alike (GPT-2's c_attn; multi-head, T = S only).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "backend/attention_geometry.h"

namespace tr::test {

enum class Layout { dense, seq_major, packed };

inline const char* layout_name(Layout l) {
  return l == Layout::dense ? "dense" : l == Layout::seq_major ? "seq_major" : "packed";
}

// The buffers of one layout, filled with `fill` (a value no kernel writes): q|k|v in one input buffer,
// dq|dk|dv in one gradient buffer, out and dout on their own.
template <typename E>
class Placement {
 public:
  Placement(Layout layout, int64_t B, int64_t H, int64_t KV, int64_t T, int64_t S, int64_t D, E fill)
      : B_(B), H_(H), KV_(KV), T_(T), S_(S), D_(D) {
    using backend::HeadRows;
    const int64_t nq = B * H * T * D, nk = B * KV * S * D;
    inputs_.assign(static_cast<size_t>(nq + 2 * nk), fill);
    grads_ = inputs_;
    out_.assign(static_cast<size_t>(nq), fill);
    dout_ = out_;
    auto seq = [&](int64_t heads, int64_t n) { return HeadRows{n * heads * D, D, heads * D}; };
    HeadRows qr = HeadRows::dense(H, T, D), kr = HeadRows::dense(KV, S, D), orow = qr;
    off_[0] = 0, off_[1] = nq, off_[2] = nq + nk;
    if (layout == Layout::seq_major) {
      qr = seq(H, T), kr = seq(KV, S), orow = qr;
    } else if (layout == Layout::packed) {
      if (H != KV || T != S) throw std::invalid_argument("packed q/k/v need H = KV and T = S");
      qr = kr = HeadRows{T * 3 * H * D, D, 3 * H * D};
      off_[0] = 0, off_[1] = H * D, off_[2] = 2 * H * D;
      orow = seq(H, T);
    }
    rows = {qr, kr, kr, orow, orow, qr, kr, kr};
  }

  E* q() { return inputs_.data() + off_[0]; }
  E* k() { return inputs_.data() + off_[1]; }
  E* v() { return inputs_.data() + off_[2]; }
  E* dq() { return grads_.data() + off_[0]; }
  E* dk() { return grads_.data() + off_[1]; }
  E* dv() { return grads_.data() + off_[2]; }
  E* out() { return out_.data(); }
  E* dout() { return dout_.data(); }

  // Dense [B, heads, n, D] values into the operand at p with rows r, and back.
  void put(E* p, backend::HeadRows r, const std::vector<E>& dense, bool kv) const {
    walk(r, kv, [&](int64_t at, int64_t i) { p[at] = dense[static_cast<size_t>(i)]; });
  }
  std::vector<E> take(const E* p, backend::HeadRows r, bool kv) const {
    std::vector<E> dense(static_cast<size_t>(B_ * (kv ? KV_ * S_ : H_ * T_) * D_));
    walk(r, kv, [&](int64_t at, int64_t i) { dense[static_cast<size_t>(i)] = p[at]; });
    return dense;
  }

  backend::AttentionRows rows;

 private:
  template <typename F>
  void walk(backend::HeadRows r, bool kv, F f) const {
    const int64_t heads = kv ? KV_ : H_, n = kv ? S_ : T_;
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t t = 0; t < n; ++t)
          for (int64_t d = 0; d < D_; ++d) f(r.at(b, h, t) + d, ((b * heads + h) * n + t) * D_ + d);
  }

  int64_t B_, H_, KV_, T_, S_, D_;
  int64_t off_[3];
  std::vector<E> inputs_, grads_, out_, dout_;
};

}  // namespace tr::test
