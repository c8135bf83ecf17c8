// Autograd: accumulation, no_grad, detach, release of saved tensors, checkpointing (identical gradients,
// frozen inputs, replayed dropout, lower peak memory) and the meta-device dry run.
#include "autograd/checkpoint.h"
#include "test_util.h"
#include "transformer_block.h"

namespace tr {
namespace {

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = ops::from_vector<double>({1.0, -2.0, 3.0}, {3});
  requires_grad_(x);
  for (int rep = 1; rep <= 2; ++rep) {
    Tensor y = sum(x * x + x);
    autograd::backward({y});
    auto g = test::values(x.grad());
    for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(g[i], rep * (2 * test::values(x)[i] + 1));
  }
  autograd::zero_grad(x);
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, NoGradAndDetachRecordNothing) {
  Tensor x = test::randn({4}, 1, DType::f64);
  requires_grad_(x);
  {
    NoGradGuard ng;
    EXPECT_FALSE((x * x).requires_grad());
  }
  Tensor d = detach(x);
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.storage().get(), x.storage().get());
  Tensor y = sum(x * d);  // d is a constant: dy/dx = d
  autograd::backward({y});
  EXPECT_EQ(test::values(x.grad()), test::values(x));
}

TEST(Autograd, SharedInputGetsBothGradients) {
  Tensor x = test::randn({2, 3}, 2, DType::f64);
  requires_grad_(x);
  Tensor y = sum(x + x);  // the same tensor feeds both inputs of add
  autograd::backward({y});
  for (double g : test::values(x.grad())) EXPECT_DOUBLE_EQ(g, 2.0);
}

TEST(Autograd, SavedTensorsAreFreedByBackwardAndSecondBackwardThrows) {
  CpuAllocator& a = cpu_allocator();
  Tensor x = test::randn({256, 256}, 3);
  requires_grad_(x);
  const int64_t before = a.stats().current_bytes;
  Tensor y = sum(gelu(gelu(gelu(x))));
  const int64_t with_graph = a.stats().current_bytes;
  EXPECT_GE(with_graph - before, 2 * 256 * 256 * 4);  // the inputs of the 2nd and 3rd gelu are saved
  autograd::backward({y});
  // Left: y (4 bytes) and x.grad; every saved activation is gone although y (and its graph) is alive.
  EXPECT_LE(a.stats().current_bytes - before, 256 * 256 * 4 + 64);
  EXPECT_THROW(autograd::backward({y}), Error);
}

// Ops that save one of their own outputs (softmax, the fused add + norms) must save an alias without history:
// holding the output itself makes a cycle through its grad_fn, and the whole graph would leak.
TEST(Autograd, OpsSavingTheirOutputsLeaveNoGraphBehind) {
  CpuAllocator& a = cpu_allocator();
  const int64_t before = a.stats().current_bytes;
  {
    Tensor x = test::randn({64, 32}, 4), r = test::randn({64, 32}, 5), w = test::randn({32}, 6),
           b = test::randn({32}, 7);
    for (Tensor* t : {&x, &r, &w, &b}) requires_grad_(*t);
    auto [s1, y1] = add_layer_norm(x, r, w, b, 1e-5);
    auto [s2, y2] = add_rms_norm(s1, y1, w, 1e-6);
    Tensor loss = sum(add(mul(softmax(s2, -1), y2), s2));
    (void)loss;
  }  // never backpropagated: the graph must still go away with its last handle
  EXPECT_EQ(a.stats().current_bytes, before);
}

TEST(Autograd, NonScalarRootNeedsAGradient) {
  Tensor x = test::randn({3}, 4, DType::f64);
  requires_grad_(x);
  EXPECT_THROW(autograd::backward({x * x}), Error);
}

// Two-layer MLP with dropout, optionally inside checkpoint regions.
struct Mlp {
  Tensor w1, w2, w3;
};

std::vector<Tensor> grads_of(bool use_checkpoint, bool input_requires_grad) {
  Generator init(1);
  Mlp m{ops::randn({16, 8}, init, DType::f64), ops::randn({16, 16}, init, DType::f64),
        ops::randn({4, 16}, init, DType::f64)};
  for (Tensor* t : {&m.w1, &m.w2, &m.w3}) requires_grad_(*t);
  Tensor x = ops::randn({5, 8}, init, DType::f64);
  if (input_requires_grad) requires_grad_(x);
  Generator drop(77);
  auto layer = [&](const Tensor& in, const Tensor& w) { return dropout(gelu(linear(in, w)), 0.3, drop); };
  Tensor h = x;
  for (const Tensor* w : {&m.w1, &m.w2}) {
    if (use_checkpoint) {
      const Tensor wt = *w;
      h = autograd::checkpoint(
          [&, wt](const std::vector<Tensor>& in) -> std::vector<Tensor> { return {layer(in[0], wt)}; }, {h},
          {{&drop}})[0];
    } else {
      h = layer(h, *w);
    }
  }
  autograd::backward({sum(square(linear(h, m.w3)))});
  std::vector<Tensor> g{m.w1.grad(), m.w2.grad(), m.w3.grad()};
  if (input_requires_grad) g.push_back(x.grad());
  return g;
}

TEST(Checkpoint, GradientsEqualTheUncheckpointedOnesBitForBit) {
  for (bool input_grad : {true, false}) {  // false: a frozen input, as with a frozen embedding
    auto plain = grads_of(false, input_grad), ckpt = grads_of(true, input_grad);
    ASSERT_EQ(plain.size(), ckpt.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      ASSERT_TRUE(ckpt[i].defined()) << "gradient " << i << " missing with checkpointing";
      EXPECT_EQ(test::values(plain[i]), test::values(ckpt[i]))
          << "gradient " << i << " input_grad=" << input_grad;
    }
  }
}

// Peak bytes of one forward+backward of `layers` blocks, measured on `dev`'s allocator.
int64_t block_stack_peak(Device dev, int layers, bool use_checkpoint, int64_t batch = 2, int64_t seq = 16) {
  Generator gen(3);
  std::vector<test::BlockParams> blocks;
  for (int i = 0; i < layers; ++i) blocks.push_back(test::make_block(32, 4, gen, dev));
  Tensor x = ops::randn({batch, seq, 32}, gen, DType::f32, dev);
  Tensor mask = test::causal_mask_on(seq, dev);
  Allocator& alloc = ops::allocator_for(dev);
  const int64_t base = alloc.stats().current_bytes;
  alloc.reset_peak();
  {
    Tensor h = x;
    for (auto& b : blocks) {
      if (use_checkpoint) {
        h = autograd::checkpoint(
            [&b, &mask](const std::vector<Tensor>& in) -> std::vector<Tensor> {
              return {test::block_forward(b, in[0], mask)};
            },
            {h})[0];
      } else {
        h = test::block_forward(b, h, mask);
      }
    }
    autograd::backward({mean(h)});
  }
  return alloc.stats().peak_bytes - base;
}

TEST(MetaDevice, DryRunReportsTheSamePeakAsTheCpuRun) {
  for (bool ck : {false, true}) {
    const int64_t cpu = block_stack_peak(Device::cpu(), 3, ck);
    const int64_t meta = block_stack_peak(Device::meta(), 3, ck);
    EXPECT_GT(cpu, 0);
    EXPECT_EQ(cpu, meta) << "checkpoint=" << ck;
  }
}

TEST(Checkpoint, LowersPeakMemoryOfADeepStack) {
  // Activations dominate at this size (attention scores are 4x4x64x64 per block), as in real training.
  const int64_t plain = block_stack_peak(Device::meta(), 6, false, 4, 64);
  const int64_t ckpt = block_stack_peak(Device::meta(), 6, true, 4, 64);
  std::printf("peak bytes, 6 blocks B=4 T=64 d=32: plain %lld, checkpointed %lld (ratio %.3f)\n",
              static_cast<long long>(plain), static_cast<long long>(ckpt), static_cast<double>(ckpt) / plain);
  RecordProperty("peak_ratio", std::to_string(static_cast<double>(ckpt) / static_cast<double>(plain)));
  EXPECT_LT(ckpt * 2, plain) << "checkpointed peak " << ckpt << " vs " << plain;
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

TEST(Autograd, MeanOverARepeatedDimCountsItOnce) {
  Tensor x = test::randn({3, 4}, 5, DType::f64);
  requires_grad_(x);
  autograd::backward({sum(mean(x, {1, -1}))});
  for (double g : test::values(x.grad())) EXPECT_DOUBLE_EQ(g, 0.25);
}

TEST(Checkpoint, UnusedInputsAndOutputsWithoutGradientsPassThrough) {
  Tensor w = test::randn({3}, 6, DType::f64), h = test::randn({3}, 7, DType::f64);
  requires_grad_(w);
  requires_grad_(h);
  Tensor a = w + 1.0;  // an input the region never uses
  auto outs = autograd::checkpoint(
      [](const std::vector<Tensor>& in) -> std::vector<Tensor> {
        return {in[0] * 2.0, ops::argmax(in[0], 0), Tensor()};
      },
      {h, a});
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_TRUE(outs[0].requires_grad());
  EXPECT_FALSE(outs[1].requires_grad());
  EXPECT_EQ(outs[1].dtype(), DType::i64);
  EXPECT_FALSE(outs[2].defined());
  autograd::backward({sum(outs[0])});
  for (double g : test::values(h.grad())) EXPECT_DOUBLE_EQ(g, 2.0);
  EXPECT_FALSE(w.grad().defined());  // no gradient flowed through the unused input
}

}  // namespace
}  // namespace tr
