// Blocked attention: the fused attention's semantics (causal alignment, key padding, grouped-query heads,
// logsumexp saved for backward) computed a block of queries at a time with the two products as batched GEMMs
// (tensor cores on a GPU) and the softmax as a row kernel. Only a [B, H, block, S] score block ever exists;
// causal blocks stop at the last key their queries see. The backward recomputes each block from the saved
// logsumexp and accumulates dk / dv in f32 (f64 for f64), so no atomics and the result is deterministic.
#include <algorithm>

#include "ops/ops.h"

namespace tr::ops {

namespace {

struct Dims {
  int64_t B, H, KV, T, S, D, rep;
};

Dims dims_of(const Tensor& q, const Tensor& k) {
  return {q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), q.size(1) / k.size(1)};
}

// Queries per block: about 2^26 score elements per block (256 MiB of f32), a multiple of 64, at least 64.
int64_t block_rows(const Dims& d, int64_t requested) {
  if (requested > 0) return requested;
  const int64_t per_query = std::max<int64_t>(1, d.B * d.H * d.S);
  return std::max<int64_t>(64, (int64_t{1} << 26) / per_query / 64 * 64);
}

// Keys the block's queries may see: all S, or causally up to the last query's last key.
int64_t keys_seen(const Dims& d, bool causal, int64_t t0, int64_t tq) {
  if (!causal) return d.S;
  return std::clamp<int64_t>(t0 + tq + (d.S - d.T), 0, d.S);
}

// A [B, H, T, ...] tensor's query rows t0 .. t0 + tq - 1 as [B * KV, rep * tq, ...] (rows ordered by kv head,
// rep, query), contiguous.
Tensor rows_of(const Tensor& x, const Dims& d, int64_t t0, int64_t tq) {
  Shape s5{d.B, d.KV, d.rep, d.T};
  Shape flat{d.B * d.KV, d.rep * tq};
  for (int64_t i = 3; i < x.dim(); ++i) {
    s5.push_back(x.size(i));
    flat.push_back(x.size(i));
  }
  return reshape(contiguous(narrow(view(x, s5), 3, t0, tq)), flat);
}

// Writes a [B * KV, rep * tq, ...] block back into rows t0 .. t0 + tq - 1 of a [B, H, T, ...] tensor.
void put_rows(const Tensor& dst, const Tensor& block, const Dims& d, int64_t t0, int64_t tq) {
  Shape s5{d.B, d.KV, d.rep, d.T}, b5{d.B, d.KV, d.rep, tq};
  for (int64_t i = 3; i < dst.dim(); ++i) {
    s5.push_back(dst.size(i));
    b5.push_back(dst.size(i));
  }
  copy_(narrow(view(dst, s5), 3, t0, tq), view(block, b5));
}

backend::Backend::AttentionBlock block_of(const Dims& d, const Tensor& keep, bool causal, double scale,
                                          int64_t t0, int64_t tq, int64_t sk, const AttentionDropout& drop,
                                          int64_t window) {
  backend::Backend::AttentionBlock a{d.B, d.H,    d.KV,  d.T,  d.S,    t0,        tq,
                                     sk,  causal, scale, keep, drop.p, drop.seed, drop.offset};
  a.window = window;
  return a;
}

DType stat_of(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// What forward and backward share: keys and values flattened to [B * KV, S, D], the contiguous mask, and the
// walk over query blocks, fn(t0, tq, sk) with the keys sk the block sees.
struct Blocks {
  Tensor kf, vf, keep;
  int64_t bq;
  Blocks(const Dims& d, const Tensor& k, const Tensor& v, const Tensor& key_keep, int64_t block,
         const AttentionDropout& dropout)
      : kf(reshape(contiguous(k), {d.B * d.KV, d.S, d.D})),
        vf(reshape(contiguous(v), {d.B * d.KV, d.S, d.D})),
        keep(key_keep.defined() ? contiguous(key_keep) : key_keep),
        bq(block_rows(d, block)) {
    TR_CHECK(dropout.p >= 0 && dropout.p < 1, "attention: dropout {} must be in [0, 1)", dropout.p);
  }
  template <typename F>
  void each(const Dims& d, bool causal, F&& fn) const {
    for (int64_t t0 = 0; t0 < d.T; t0 += bq) {
      const int64_t tq = std::min(bq, d.T - t0);
      fn(t0, tq, keys_seen(d, causal, t0, tq));
    }
  }
};

}  // namespace

AttentionOut attention_blocked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                               bool causal, double scale, int64_t block, AttentionDropout dropout,
                               int64_t window) {
  TR_CHECK(window >= 0 && (window == 0 || causal), "attention: a sliding window of {} needs causal attention",
           window);
  const Dims d = dims_of(q, k);
  auto& be = backend::backend_for(q.device());
  AttentionOut o{empty(q.shape(), q.dtype(), q.device()),
                 empty({d.B, d.H, d.T}, stat_of(q.dtype()), q.device())};
  if (q.numel() == 0) return o;
  // On the meta device the walk allocates what a real run would (score blocks, probabilities, row copies:
  // a dry run's peak must see them) and only the row kernels are skipped.
  const bool meta = q.device().is_meta();
  const Blocks blocks(d, k, v, key_keep, block, dropout);
  blocks.each(d, causal, [&](int64_t t0, int64_t tq, int64_t sk) {
    if (sk == 0) {  // no query of the block sees a key: zero output, lse -inf (the fused kernel's rule)
      put_rows(o.out, zeros({d.B * d.KV, d.rep * tq, d.D}, q.dtype(), q.device()), d, t0, tq);
      put_rows(o.lse, full({d.B * d.KV, d.rep * tq}, -INFINITY, o.lse.dtype(), q.device()), d, t0, tq);
      return;
    }
    const Tensor kb = narrow(blocks.kf, 1, 0, sk), vb = narrow(blocks.vf, 1, 0, sk);
    Tensor scores = matmul_f32(rows_of(q, d, t0, tq), kb, false, true);  // [B*KV, rep*tq, sk]
    Tensor probs = empty(scores.shape(), q.dtype(), q.device());
    Tensor lse = empty({d.B * d.KV, d.rep * tq}, scores.dtype(), q.device());
    if (!meta)
      be.attention_block_softmax(scores, block_of(d, blocks.keep, causal, scale, t0, tq, sk, dropout, window),
                                 probs, lse);
    put_rows(o.out, matmul(probs, vb), d, t0, tq);
    put_rows(o.lse, lse, d, t0, tq);
  });
  return o;
}

AttentionGrads attention_blocked_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& key_keep, bool causal, double scale,
                                          const Tensor& out, const Tensor& lse, const Tensor& dout,
                                          int64_t block, AttentionDropout dropout, int64_t window) {
  const Dims d = dims_of(q, k);
  auto& be = backend::backend_for(q.device());
  const DType st = stat_of(q.dtype());
  AttentionGrads g{empty(q.shape(), q.dtype(), q.device()), empty(k.shape(), k.dtype(), k.device()),
                   empty(v.shape(), v.dtype(), v.device())};
  const bool meta = q.device().is_meta();  // allocations walked as a real run's; row kernels skipped
  // dk, dv summed over query blocks in f32 (f64), [B * KV, S, D]; rounded to k's dtype at the end.
  Tensor dk = zeros({d.B * d.KV, d.S, d.D}, st, q.device()),
         dv = zeros({d.B * d.KV, d.S, d.D}, st, q.device());
  if (q.numel() > 0) {
    // delta = rowsum(dout * out), as the fused kernel's backward.
    const Tensor delta =
        reduce(backend::ReduceOp::sum, binary(backend::BinaryOp::mul, to_dtype(dout, st), to_dtype(out, st)),
               {-1}, false);
    const Blocks blocks(d, k, v, key_keep, block, dropout);
    blocks.each(d, causal, [&](int64_t t0, int64_t tq, int64_t sk) {
      if (sk == 0) {
        put_rows(g.dq, zeros({d.B * d.KV, d.rep * tq, d.D}, q.dtype(), q.device()), d, t0, tq);
        return;
      }
      const Tensor kb = narrow(blocks.kf, 1, 0, sk), vb = narrow(blocks.vf, 1, 0, sk);
      const Tensor qb = rows_of(q, d, t0, tq), dob = rows_of(dout, d, t0, tq);
      const Tensor scores = matmul_f32(qb, kb, false, true), dp = matmul_f32(dob, vb, false, true);
      Tensor probs = empty(scores.shape(), q.dtype(), q.device()),
             ds = empty(scores.shape(), q.dtype(), q.device());
      {
        const Tensor lse_b = rows_of(lse, d, t0, tq), delta_b = rows_of(delta, d, t0, tq);
        if (!meta)
          be.attention_block_grad(scores, dp, lse_b, delta_b,
                                  block_of(d, blocks.keep, causal, scale, t0, tq, sk, dropout, window), probs,
                                  ds);
      }
      put_rows(g.dq, matmul(ds, kb), d, t0, tq);  // dq = ds k (ds carries the scale)
      const Tensor dkb = narrow(dk, 1, 0, sk), dvb = narrow(dv, 1, 0, sk);
      copy_(dkb, binary(backend::BinaryOp::add, dkb, matmul_f32(ds, qb, true, false)));      // dk += ds^T q
      copy_(dvb, binary(backend::BinaryOp::add, dvb, matmul_f32(probs, dob, true, false)));  // dv += p^T dout
    });
  }
  copy_(g.dk, view(dk, k.shape()));
  copy_(g.dv, view(dv, v.shape()));
  return g;
}

}  // namespace tr::ops
