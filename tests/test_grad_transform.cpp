// The optimizer's gradient pipeline on every backend (the CPU, and the GPU when present, each against a
// hand computation on the host): grad_stats (global norm + inf count in one pass), transform_grads (unscale
// then clip), and AdamW reading half gradients through the transform and writing the half weight copy in
// its own pass, bit for bit equal to materialized f32 gradients + step() + a rounding copy.
#include <cmath>
#include <deque>

#include "backend/backend.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "test_util.h"

namespace tr {
namespace {

// Scaled gradients as a loss-scaled bf16 backward leaves them; one tensor spans several 64K chunks.
std::vector<Tensor> half_grads(Device dev, DType dt, double scale) {
  std::vector<Tensor> g;
  const std::vector<Shape> shapes = {{300, 517}, {517}, {3, 5}};
  for (size_t i = 0; i < shapes.size(); ++i)
    g.push_back(ops::to_device(test::randn(shapes[i], 40 + i, dt, Device::cpu(), scale), dev));
  return g;
}

// The host's reading of the pipeline: f32(g) * f32(inv), squares summed in double.
double host_sumsq(const std::vector<Tensor>& grads, double inv_scale) {
  double ss = 0;
  for (const Tensor& g : grads)
    for (double v : test::values(ops::to_device(g, Device::cpu()))) {
      const float x = static_cast<float>(v) * static_cast<float>(inv_scale);
      ss += static_cast<double>(x) * x;
    }
  return ss;
}

std::vector<double> stats_on_host(const Tensor& stats) {
  return test::values(ops::to_device(stats, Device::cpu()));
}

class GradTransformTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda() && !backend::cuda_available())
      GTEST_SKIP() << "no CUDA GPU here: the GPU gradient pipeline NOT tested";
  }
};

TEST_P(GradTransformTest, StatsGiveTheNormAndCountNonFiniteValues) {
  const Device dev = GetParam();
  auto& be = backend::backend_for(dev);
  auto grads = half_grads(dev, DType::bf16, 1024.0);
  // The pass adds to what stats holds (a split model's devices continue one sum): 0.25 and 3 come out on top.
  Tensor stats = ops::full({2}, 0.0, DType::f64, dev);
  ops::copy_(stats, ops::from_vector<double>({0.25, 3.0}, {2}));
  be.grad_stats(grads, 1.0 / 1024, stats);
  auto s = stats_on_host(stats);
  const double want = host_sumsq(grads, 1.0 / 1024);
  EXPECT_NEAR(s[0] - 0.25, want, 1e-12 * want);
  EXPECT_EQ(s[1], 3.0);
  // Deterministic: the same bits again.
  Tensor again = ops::zeros({2}, DType::f64, dev), twice = ops::zeros({2}, DType::f64, dev);
  be.grad_stats(grads, 1.0 / 1024, again);
  be.grad_stats(grads, 1.0 / 1024, twice);
  EXPECT_EQ(stats_on_host(again), stats_on_host(twice));
  EXPECT_NEAR(stats_on_host(again)[0], want, 1e-12 * want);
  // An inf and a NaN in different tensors are both counted (fp16 overflow detection).
  Tensor g0 = ops::to_device(grads[0], Device::cpu()), g1 = ops::to_device(grads[1], Device::cpu());
  ops::copy_(ops::narrow(ops::reshape(g0, {g0.numel()}), 0, 70000, 1), ops::full({1}, INFINITY, DType::bf16));
  ops::copy_(ops::narrow(g1, 0, 3, 1), ops::full({1}, NAN, DType::bf16));
  grads[0] = ops::to_device(g0, dev);
  grads[1] = ops::to_device(g1, dev);
  Tensor bad = ops::zeros({2}, DType::f64, dev);
  be.grad_stats(grads, 1.0 / 1024, bad);
  s = stats_on_host(bad);
  EXPECT_EQ(s[1], 2.0);
  EXPECT_FALSE(std::isfinite(s[0]));
}

TEST_P(GradTransformTest, TransformUnscalesThenClipsWithTwoRoundings) {
  const Device dev = GetParam();
  auto& be = backend::backend_for(dev);
  const auto grads = half_grads(dev, DType::f16, 256.0);
  Tensor stats = ops::zeros({2}, DType::f64, dev);
  const double inv = 1.0 / 256;
  be.grad_stats(grads, inv, stats);
  const double norm = std::sqrt(stats_on_host(stats)[0]);
  for (double max_norm : {0.5 * norm, 2.0 * norm}) {
    std::vector<std::pair<Tensor, Tensor>> pairs;
    for (const Tensor& g : grads) pairs.emplace_back(g, ops::full(g.shape(), NAN, DType::f32, dev));
    be.transform_grads(pairs, {inv, max_norm, stats});
    const bool clips = max_norm / (norm + 1e-6) < 1.0;
    const float coef = static_cast<float>(max_norm / (norm + 1e-6));
    for (const auto& [g, out] : pairs) {
      const auto gv = test::values(ops::to_device(g, Device::cpu()));
      const auto ov = ops::to_vector<float>(ops::to_device(out, Device::cpu()));
      for (size_t i = 0; i < gv.size(); ++i) {
        float want = static_cast<float>(gv[i]) * static_cast<float>(inv);
        if (clips) want *= coef;
        ASSERT_EQ(ov[i], want) << "element " << i << " max_norm " << max_norm;
      }
    }
  }
}

// Parameters with stable addresses and HF names.
struct Model {
  std::deque<Tensor> tensors;
  nn::ParamList list;
  Model(Device dev) {
    const std::vector<std::pair<std::string, Shape>> shapes = {
        {"h.0.mlp.c_fc.weight", {300, 517}}, {"h.0.ln_1.bias", {517}}, {"h.0.attn.c_proj.weight", {3, 5}}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      tensors.push_back(test::randn(shapes[i].second, 10 + i, DType::f32, dev));
      autograd::set_requires_grad(tensors.back(), true);
      list.emplace_back(shapes[i].first, &tensors.back());
    }
  }
};

// AdamW through the transform (and the generic path of any other optimizer) against the long way round:
// f32 gradients materialized on the host rule, step(), then a rounding copy.
TEST_P(GradTransformTest, OptimizersThroughTheTransformEqualTheLongWayBitForBit) {
  const Device dev = GetParam();
  auto& be = backend::backend_for(dev);
  for (std::string name : {"adamw_torch", "adamw_torch_fused", "sgd"}) {
    if (name == "sgd" && dev.is_cuda()) continue;  // CPU-only optimizer: the generic path is tested there
    Model fused(dev), plain(dev);
    optim::OptimizerOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.1;
    if (name == "sgd") o.args = {{"momentum", "0.9"}};
    auto of = optim::make_optimizer(name, fused.list, o), op = optim::make_optimizer(name, plain.list, o);
    std::vector<Tensor> copies;
    for (Tensor& t : fused.tensors) copies.push_back(ops::to_dtype(t, DType::bf16));
    for (int step = 0; step < 3; ++step) {
      const double scale = 4096.0, inv = 1.0 / scale;
      std::vector<Tensor> grads = half_grads(dev, DType::bf16, scale);
      for (auto& g : grads) g = ops::affine(g, 1.0 + step, 0.0);  // different each step
      Tensor stats = ops::zeros({2}, DType::f64, dev);
      be.grad_stats(grads, inv, stats);
      const double max_norm = step == 1 ? 1e9 : 0.3;  // clip on steps 0 and 2
      of->step(grads, {inv, max_norm, stats}, copies);
      // The long way: the host applies unscale and clip, the optimizer reads f32 .grad.
      const double norm = std::sqrt(host_sumsq(grads, inv));
      const double c = max_norm / (norm + 1e-6);
      for (size_t i = 0; i < grads.size(); ++i) {
        Tensor g = ops::to_dtype(ops::to_device(grads[i], Device::cpu()), DType::f32);
        g = ops::affine(g, static_cast<float>(inv), 0.0);
        if (c < 1.0) g = ops::affine(g, static_cast<float>(c), 0.0);
        autograd::set_grad(plain.tensors[i], ops::to_device(g, dev));
      }
      op->step();
      of->zero_grad();
      op->zero_grad();
    }
    for (size_t i = 0; i < fused.tensors.size(); ++i) {
      EXPECT_EQ(test::values(ops::to_device(fused.tensors[i], Device::cpu())),
                test::values(ops::to_device(plain.tensors[i], Device::cpu())))
          << name << " " << fused.list[i].first;
      EXPECT_EQ(test::values(ops::to_device(copies[i], Device::cpu())),
                test::values(ops::to_dtype(ops::to_device(plain.tensors[i], Device::cpu()), DType::bf16)))
          << name << " copy of " << fused.list[i].first;
    }
    auto sf = of->state_dict(), sp = op->state_dict();
    for (size_t k = 0; k < sf.size(); ++k)
      EXPECT_EQ(test::values(ops::to_device(sf[k].second, Device::cpu())),
                test::values(ops::to_device(sp[k].second, Device::cpu())))
          << name << " " << sf[k].first;
  }
}

TEST(GradTransform, ClippingWithoutStatisticsIsAnError) {
  auto& be = backend::backend_for(Device::cpu());
  Tensor g = test::randn({4}, 1), d = ops::zeros({4});
  EXPECT_THROW(be.transform_grads({{g, d}}, {1.0, 1.0, Tensor()}), Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, GradTransformTest, ::testing::Values(Device::cpu(), Device::cuda(0)),
                         [](const auto& info) { return info.param.is_cpu() ? std::string("cpu") : "cuda"; });

}  // namespace
}  // namespace tr
