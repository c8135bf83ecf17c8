// A GPT-2-style pre-LayerNorm transformer block built from the differentiable ops; used by the autograd
// tests (memory dry run, checkpointing) and by bench/bench_block.cpp (against the same block in PyTorch).
#pragma once
#include <cmath>

#include "autograd/checkpoint.h"
#include "autograd/functions.h"

namespace tr::test {

struct BlockParams {
  int64_t d = 0, heads = 0;
  Tensor ln1_w, ln1_b, w_qkv, b_qkv, w_proj, b_proj, ln2_w, ln2_b, w_fc, b_fc, w_fc2, b_fc2;
  std::vector<Tensor*> all() {
    return {&ln1_w, &ln1_b, &w_qkv, &b_qkv, &w_proj, &b_proj, &ln2_w, &ln2_b, &w_fc, &b_fc, &w_fc2, &b_fc2};
  }
};

inline BlockParams make_block(int64_t d, int64_t heads, Generator& gen, Device dev = Device::cpu(),
                              DType dt = DType::f32) {
  BlockParams p;
  p.d = d;
  p.heads = heads;
  auto normal = [&](Shape s) { return ops::randn(s, gen, dt, dev, 0.0, 0.02); };
  p.ln1_w = ops::ones({d}, dt, dev);
  p.ln1_b = ops::zeros({d}, dt, dev);
  p.w_qkv = normal({3 * d, d});
  p.b_qkv = ops::zeros({3 * d}, dt, dev);
  p.w_proj = normal({d, d});
  p.b_proj = ops::zeros({d}, dt, dev);
  p.ln2_w = ops::ones({d}, dt, dev);
  p.ln2_b = ops::zeros({d}, dt, dev);
  p.w_fc = normal({4 * d, d});
  p.b_fc = ops::zeros({4 * d}, dt, dev);
  p.w_fc2 = normal({d, 4 * d});
  p.b_fc2 = ops::zeros({d}, dt, dev);
  for (Tensor* t : p.all()) autograd::set_requires_grad(*t, true);
  return p;
}

inline Tensor causal_mask_on(int64_t t, Device dev) {
  if (dev.is_meta()) return ops::empty({t, t}, DType::boolean, dev);
  std::vector<uint8_t> m(static_cast<size_t>(t * t));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < t; ++j) m[static_cast<size_t>(i * t + j)] = j > i;
  return ops::to_device(ops::to_dtype(ops::from_vector<uint8_t>(m, {t, t}), DType::boolean), dev);
}

inline Tensor block_forward(const BlockParams& p, const Tensor& x, const Tensor& mask) {
  const int64_t B = x.size(0), T = x.size(1), d = p.d, H = p.heads, hd = d / H;
  Tensor h = layer_norm(x, p.ln1_w, p.ln1_b, 1e-5);
  auto qkv = split(linear(h, p.w_qkv, p.b_qkv), {d, d, d}, -1);
  auto heads = [&](const Tensor& t) { return transpose(view(t, {B, T, H, hd}), 1, 2); };
  Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  Tensor att = mul_scalar(matmul(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(hd)));
  att = softmax(masked_fill(att, mask, -INFINITY), -1);
  Tensor y = reshape(transpose(matmul(att, v), 1, 2), {B, T, d});
  Tensor x1 = x + linear(y, p.w_proj, p.b_proj);
  Tensor m = linear(gelu(linear(layer_norm(x1, p.ln2_w, p.ln2_b, 1e-5), p.w_fc, p.b_fc)), p.w_fc2, p.b_fc2);
  return x1 + m;
}

}  // namespace tr::test
