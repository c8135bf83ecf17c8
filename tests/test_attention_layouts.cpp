// Attention reads q/k/v where the model keeps them and writes out and the gradients where the model wants
// them (Backend::attention's HeadRows): GPT-2's packed c_attn projection [B, T, 3 D] viewed as heads, Llama's
// sequence-major heads with grouped k/v. Views give the contiguous inputs' bits (output, logsumexp, every
// gradient, with dropout); out comes back in the merge-heads layout, q/k/v's gradients in one buffer laid
// out as the projection, so a GPT-2 layer's forward and backward make no head copies at all.
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "backend/cuda_api.h"
#include "compile/recorder.h"
#include "models/causal_lm.h"

namespace tr {
namespace {

struct LayoutCase {
  const char* name;
  int64_t B, H, KV, T, D;
  double dropout;
  bool packed;  // q/k/v from one projection (GPT-2's c_attn), else one each (Llama's q/k/v_proj)
};

const LayoutCase kCases[] = {
    {"packed_mha", 2, 4, 4, 70, 16, 0.0, true},
    {"packed_mha_dropout", 2, 2, 2, 130, 32, 0.2, true},
    {"separate_gqa", 1, 4, 2, 65, 64, 0.1, false},
};

// q/k/v as views of [B, T, n D] projections, split and viewed as heads as GPT-2 and Llama do.
struct Views {
  Tensor q, k, v;
};

Views views_of(const LayoutCase& c, Device dev, DType dt, Generator& gen) {
  auto projection = [&](int64_t width) {
    return ops::to_dtype(ops::randn({c.B, c.T, width}, gen, DType::f32, dev), dt);
  };
  auto heads = [&](const Tensor& p, int64_t at, int64_t n) {
    return ops::transpose(ops::view(ops::narrow(p, 2, at, n * c.D), {c.B, c.T, n, c.D}), 1, 2);
  };
  const int64_t wq = c.H * c.D, wk = c.KV * c.D;
  if (c.packed) {
    const Tensor qkv = projection(wq + 2 * wk);
    return {heads(qkv, 0, c.H), heads(qkv, wq, c.KV), heads(qkv, wq + wk, c.KV)};
  }
  return {heads(projection(wq), 0, c.H), heads(projection(wk), 0, c.KV), heads(projection(wk), 0, c.KV)};
}

class AttentionLayouts : public ::testing::TestWithParam<std::tuple<Device, DType>> {};

TEST_P(AttentionLayouts, ViewsGiveTheContiguousInputsBitsAndGradientsComeBackInTheirLayout) {
  const auto [dev, dt] = GetParam();
  if (dev.is_cuda() && !backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: NOT tested";
  for (const LayoutCase& c : kCases) {
    SCOPED_TRACE(c.name);
    Generator gen(17);
    const Views in = views_of(c, dev, dt, gen);
    ASSERT_FALSE(in.q.is_contiguous());
    const Tensor dout_seq = ops::to_dtype(ops::randn({c.B, c.T, c.H, c.D}, gen, DType::f32, dev), dt);
    const Tensor dout = ops::transpose(dout_seq, 1, 2);  // as the merge-heads reshape hands it back
    const ops::AttentionDropout drop{c.dropout, 99, 1234};
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    const auto F = ops::AttentionForm::automatic;
    const Tensor keep = test::attention_keep_mask(c.B, c.T, true);
    const Tensor kp = dev.is_cuda() ? ops::to_device(keep, dev) : keep;

    const auto got = ops::attention(in.q, in.k, in.v, kp, true, scale, 0, F, drop);
    const auto gg =
        ops::attention_backward(in.q, in.k, in.v, kp, true, scale, got.out, got.lse, dout, 0, F, drop);
    const Tensor qc = ops::contiguous(in.q), kc = ops::contiguous(in.k), vc = ops::contiguous(in.v);
    const auto want = ops::attention(qc, kc, vc, kp, true, scale, 0, F, drop);
    const auto wg = ops::attention_backward(qc, kc, vc, kp, true, scale, want.out, want.lse,
                                            ops::contiguous(dout), 0, F, drop);
    auto same = [](const Tensor& a, const Tensor& b) { return test::host_values(a) == test::host_values(b); };
    EXPECT_TRUE(same(got.out, want.out)) << "out";
    EXPECT_TRUE(same(got.lse, want.lse)) << "lse";
    EXPECT_TRUE(same(gg.dq, wg.dq)) << "dq";
    EXPECT_TRUE(same(gg.dk, wg.dk)) << "dk";
    EXPECT_TRUE(same(gg.dv, wg.dv)) << "dv";

    if (ops::attention_form(in.q, in.k, c.dropout > 0) == ops::AttentionForm::blocked) continue;
    // The fused form's layouts: out merges heads as a view, the gradients sit as the inputs do.
    EXPECT_TRUE(ops::transpose(got.out, 1, 2).is_contiguous()) << "out is not in [B, T, H, D]";
    EXPECT_EQ(gg.dq.strides(), in.q.strides());
    EXPECT_EQ(gg.dk.strides(), in.k.strides());
    EXPECT_EQ(gg.dv.strides(), in.v.strides());
    if (!c.packed) continue;
    EXPECT_TRUE(gg.dq.storage() == gg.dk.storage() && gg.dk.storage() == gg.dv.storage())
        << "q/k/v's gradients are not one buffer";
    EXPECT_EQ(gg.dk.offset() - gg.dq.offset(), in.k.offset() - in.q.offset());
    EXPECT_EQ(gg.dv.offset() - gg.dq.offset(), in.v.offset() - in.q.offset());
  }
}

INSTANTIATE_TEST_SUITE_P(DevicesAndDtypes, AttentionLayouts,
                         ::testing::Combine(::testing::Values(Device::cpu(), Device::cuda(0)),
                                            ::testing::Values(DType::f64, DType::f32, DType::bf16,
                                                              DType::f16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).is_cpu() ? "cpu_" : "cuda_") +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

// Views the kernels cannot take as they are get copied: keys expanded along the sequence (row stride 0, which
// sgemm refuses as a leading dimension). And without queries the keys and values of one projection still get
// all-zero gradients (the joint buffer's every element).
TEST(AttentionLayouts, ExpandedKeysAreCopiedAndNoQueriesGiveZeroGradients) {
  Generator gen(5);
  const int64_t B = 2, H = 2, T = 9, S = 11, D = 16;
  const Tensor q = ops::randn({B, H, T, D}, gen);
  const Tensor k = ops::expand(ops::randn({B, H, 1, D}, gen), {B, H, S, D});
  const Tensor v = ops::randn({B, H, S, D}, gen);
  const double scale = 0.25;
  const auto got = ops::attention(q, k, v, Tensor(), true, scale);
  const auto want = ops::attention(q, ops::contiguous(k), v, Tensor(), true, scale);
  EXPECT_EQ(test::host_values(got.out), test::host_values(want.out));

  const Tensor kv = ops::randn({B, S, 2 * H * D}, gen);
  auto heads = [&](int64_t at) {
    return ops::transpose(ops::view(ops::narrow(kv, 2, at, H * D), {B, S, H, D}), 1, 2);
  };
  const Tensor none = ops::randn({B, H, 0, D}, gen);
  const auto o = ops::attention(none, heads(0), heads(H * D), Tensor(), false, scale);
  const auto g = ops::attention_backward(none, heads(0), heads(H * D), Tensor(), false, scale, o.out, o.lse,
                                         ops::randn({B, H, 0, D}, gen));
  for (double x : test::host_values(g.dk)) ASSERT_EQ(x, 0.0);
  for (double x : test::host_values(g.dv)) ASSERT_EQ(x, 0.0);
}

// Through autograd, the packed projection's gradient is the attention's own buffer: split's backward finds
// its pieces already side by side and hands that buffer on, and a whole GPT-2 step (forward, backward)
// records no copy of a head-sized tensor; nor does Llama's (sequence-major heads after rope, grouped k/v).
void expect_no_head_copies(const nlohmann::json& config_json, int64_t layers,
                           std::vector<int64_t> head_sizes) {
  const auto config = models::ModelConfig::from_json(config_json, "config.json");
  Generator init(7), drop(3), data(11);
  auto model = models::create_causal_lm(config, Device::cpu(), DType::f32, init, "sdpa");
  const int64_t B = 2, T = 16;
  const Tensor ids = ops::to_dtype(ops::rand({B, T}, data, DType::f32, Device::cpu(), 0.0, 60.0), DType::i64);
  compile::Recorder rec(backend::backend_for(Device::cpu()));
  {
    const backend::InterposeScope scope(Device::cpu(), rec);
    models::ForwardOptions o;
    o.labels = ids;
    o.training = true;
    o.dropout_gen = &drop;
    o.return_logits = false;
    autograd::backward({model->forward(ids, o).loss});
  }
  int head_sized_copies = 0, attention_calls = 0;
  for (const compile::Call& call : rec.take_calls()) {
    const std::string name = call.name;
    attention_calls += name == "attention" || name == "attention_backward";
    if (name != "copy") continue;
    for (const compile::Arg& a : call.args) {
      int64_t n = 1;
      for (int64_t e : a.shape) n *= e;
      for (int64_t h : head_sizes) head_sized_copies += n == B * T * h;  // q/k/v/out, or a projection
    }
  }
  EXPECT_EQ(attention_calls, 2 * layers)
      << "expected the fused attention, forward and backward, in each layer";
  EXPECT_EQ(head_sized_copies, 0) << "a head split/merge copy is back";
}

TEST(AttentionLayouts, GptAndLlamaStepsMakeNoHeadCopies) {
  expect_no_head_copies({{"model_type", "gpt2"},
                         {"vocab_size", 64},
                         {"n_embd", 32},
                         {"n_layer", 2},
                         {"n_head", 4},
                         {"n_positions", 32},
                         {"embd_pdrop", 0.0},
                         {"resid_pdrop", 0.0},
                         {"attn_pdrop", 0.1}},
                        2, {32, 96});
  expect_no_head_copies({{"model_type", "llama"},
                         {"vocab_size", 64},
                         {"hidden_size", 32},
                         {"intermediate_size", 48},
                         {"num_hidden_layers", 2},
                         {"num_attention_heads", 4},
                         {"num_key_value_heads", 2},
                         {"max_position_embeddings", 32},
                         {"attention_dropout", 0.1}},
                        2, {32, 16});
}

}  // namespace
}  // namespace tr
