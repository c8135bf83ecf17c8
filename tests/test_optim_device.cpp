// The optimizers off the CPU: Adafactor's tensor-op formulation (what runs on a GPU) against its CPU loops,
// on the CPU; and, with a GPU, 8-bit AdamW's, SGD's and the element-wise optimizers' kernels bit for bit and
// Adafactor within f32 rounding of the CPU, half weights' AdamW bit for bit (skipped loudly without one).
#include <algorithm>
#include <cmath>
#include <deque>
#include <utility>
#include <vector>

#include "backend/cuda_api.h"
#include "optim/adafactor.h"
#include "optim/adamw_8bit.h"
#include "test_util.h"

namespace tr {
namespace {

// Parameters with stable addresses and HF names, on one device.
struct Model {
  std::deque<Tensor> tensors;
  nn::ParamList list;
  std::vector<Shape> shapes;
  explicit Model(Device dev) {
    const std::vector<std::pair<std::string, Shape>> spec = {{"h.0.mlp.c_fc.weight", {48, 300}},
                                                             {"wte.weight", {70, 100}},
                                                             {"h.0.ln_1.bias", {300}},
                                                             {"h.0.attn.bias", {2, 6, 5}}};
    for (size_t i = 0; i < spec.size(); ++i) {
      tensors.push_back(test::randn(spec[i].second, 10 + i, DType::f32, dev));
      autograd::set_requires_grad(tensors.back(), true);
      list.emplace_back(spec[i].first, &tensors.back());
      shapes.push_back(spec[i].second);
    }
  }
  void set_grads(int step, Device dev, bool poison = false) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      Tensor g = test::randn(shapes[i], 100 * step + i);
      if (poison && i == 0) g.data<float>()[7] = INFINITY;  // 8-bit AdamW skips non-finite elements
      autograd::set_grad(tensors[i], ops::to_device(g, dev));
    }
  }
};

std::vector<double> host(const Tensor& t) { return test::values(ops::to_device(t, Device::cpu())); }

TEST(OptimDevice, AdafactorTensorOpsFollowTheLoops) {
  for (const char* args : {"", "beta1=0.9,clip_threshold=0.5", "scale_parameter=true",
                           "relative_step=true,warmup_init=true,scale_parameter=true"}) {
    Model loops(Device::cpu()), tensor_ops(Device::cpu());
    optim::OptimizerOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.05;
    o.args = optim::parse_optim_args(args);
    optim::Adafactor a(loops.list, o), b(tensor_ops.list, o);
    b.use_tensor_ops(true);
    for (int step = 0; step < 5; ++step) {
      loops.set_grads(step, Device::cpu());
      tensor_ops.set_grads(step, Device::cpu());
      a.step();
      b.step();
    }
    for (size_t i = 0; i < loops.tensors.size(); ++i)
      EXPECT_TRUE(test::all_close(tensor_ops.tensors[i], loops.tensors[i], 1e-5, 1e-7))
          << "'" << args << "' " << loops.list[i].first;
    auto sa = a.state_dict(), sb = b.state_dict();
    for (size_t k = 1; k < sa.size(); ++k) {
      // exp_avg is a running mean of signed updates: near-zero entries come from cancellation, so the
      // absolute tolerance follows the tensor's scale.
      double scale = 0;
      for (double v : test::values(sa[k].second)) scale = std::max(scale, std::abs(v));
      EXPECT_TRUE(test::all_close(sb[k].second, sa[k].second, 1e-5, 1e-6 * scale))
          << "'" << args << "' " << sa[k].first;
    }
  }
}

TEST(OptimDevice, EightBitAdamWKernelsMatchTheCpuBitForBit) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: the 8-bit AdamW kernels NOT tested";
  const Device gpu = Device::cuda(0);
  Model cpu(Device::cpu()), dev(gpu);
  optim::OptimizerOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.args = {{"min_8bit_size", "1000"}};  // the bias keeps 32-bit state, the embedding too
  optim::AdamW8bit a(cpu.list, o), b(dev.list, o);
  for (int step = 0; step < 4; ++step) {
    cpu.set_grads(step, Device::cpu(), step == 2);
    dev.set_grads(step, gpu, step == 2);
    a.step();
    b.step();
  }
  for (size_t i = 0; i < cpu.tensors.size(); ++i)
    EXPECT_EQ(host(dev.tensors[i]), host(cpu.tensors[i])) << cpu.list[i].first;
  auto sa = a.state_dict(), sb = b.state_dict();
  for (size_t k = 0; k < sa.size(); ++k) EXPECT_EQ(host(sb[k].second), host(sa[k].second)) << sa[k].first;
}

// Five steps of optimizer `name` (args, lr 1e-2, weight decay 0.05) on the CPU model and on `gpu`'s.
void five_steps_both(const char* name, const char* args, Model& cpu, Model& dev, Device gpu) {
  optim::OptimizerOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.05;
  o.args = optim::parse_optim_args(args);
  auto a = optim::make_optimizer(name, cpu.list, o), b = optim::make_optimizer(name, dev.list, o);
  for (int step = 0; step < 5; ++step) {
    a->set_train_mode(true, {});  // schedule-free: y for the steps, x after step 3 and at the end
    b->set_train_mode(true, {});
    cpu.set_grads(step, Device::cpu());
    dev.set_grads(step, gpu);
    a->step();
    b->step();
    if (step == 2 || step == 4) {
      a->set_train_mode(false, {});
      b->set_train_mode(false, {});
    }
  }
}

// Adafactor runs as tensor ops on a GPU: within f32 rounding of the CPU loops.
TEST(OptimDevice, AdafactorOnTheGpuFollowsTheCpu) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: Adafactor on the GPU NOT tested";
  const Device gpu = Device::cuda(0);
  Model cpu(Device::cpu()), dev(gpu);
  five_steps_both("adafactor", "beta1=0.9", cpu, dev, gpu);
  for (size_t i = 0; i < cpu.tensors.size(); ++i)
    EXPECT_TRUE(test::all_close(ops::to_device(dev.tensors[i], Device::cpu()), cpu.tensors[i], 1e-5, 1e-7))
        << cpu.list[i].first;
}

// SGD's kernel and the CPU loop share optim_math.h's sgd_element (fused multiply-adds as torch's CPU
// kernels): the same bits, with and without momentum, Nesterov, dampening and weight decay.
TEST(OptimDevice, SgdKernelMatchesTheCpuBitForBit) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: the SGD kernel NOT tested";
  const Device gpu = Device::cuda(0);
  for (const char* args : {"", "momentum=0.9", "momentum=0.9,nesterov=true", "momentum=0.8,dampening=0.3"}) {
    Model cpu(Device::cpu()), dev(gpu);
    five_steps_both("sgd", args, cpu, dev, gpu);
    for (size_t i = 0; i < cpu.tensors.size(); ++i)
      EXPECT_EQ(host(dev.tensors[i]), test::values(cpu.tensors[i])) << args << " " << cpu.list[i].first;
  }
}

TEST(OptimDevice, ElementwiseKernelsMatchTheCpuBitForBit) {
  if (!backend::cuda_available())
    GTEST_SKIP() << "no CUDA GPU here: the element-wise optimizer kernel NOT tested";
  const Device gpu = Device::cuda(0);
  for (const auto& [name, args] : std::vector<std::pair<const char*, const char*>>{
           {"adagrad", "lr_decay=0.1,initial_accumulator_value=0.2"},
           {"rmsprop", ""},
           {"rmsprop", "momentum=0.9"},
           {"rmsprop_bnb", ""},
           {"lion_32bit", ""},
           {"lion_8bit", "min_8bit_size=64"},
           {"rmsprop_bnb_8bit", "min_8bit_size=64"},
           {"paged_adamw_32bit", ""},
           {"ademamix", "t_alpha=3,t_beta3=4"},
           {"ademamix_8bit", "min_8bit_size=64,t_alpha=3,t_beta3=4"},
           {"schedule_free_adamw", ""},
           {"schedule_free_radam", ""},
           {"schedule_free_sgd", "r=1"},
           {"stable_adamw", "decouple_lr=true"}}) {
    Model cpu(Device::cpu()), dev(gpu);
    five_steps_both(name, args, cpu, dev, gpu);
    for (size_t i = 0; i < cpu.tensors.size(); ++i)
      EXPECT_EQ(host(dev.tensors[i]), test::values(cpu.tensors[i]))
          << name << " " << args << " " << cpu.list[i].first;
  }
}

// Half-precision weights (--torch_dtype bfloat16): AdamW's bf16 moments and the clip's in-place rounding on
// the GPU, against the CPU, bit for bit (both kernels: fused_adamw_half_kernel, transform_half_kernel).
TEST(OptimDevice, HalfWeightsAdamWMatchesTheCpuBitForBit) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: half-weight AdamW NOT tested";
  const Device gpu = Device::cuda(0);
  Model cpu(Device::cpu()), dev(gpu);
  for (Model* m : {&cpu, &dev})
    for (auto& t : m->tensors) t = ops::to_dtype(t, DType::bf16);
  optim::OptimizerOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  auto a = optim::make_optimizer("adamw_torch_fused", cpu.list, o),
       b = optim::make_optimizer("adamw_torch_fused", dev.list, o);
  for (int step = 0; step < 5; ++step) {
    std::vector<Tensor> gc, gd;
    for (size_t i = 0; i < cpu.tensors.size(); ++i) {
      gc.push_back(ops::to_dtype(test::randn(cpu.shapes[i], 100 * step + i), DType::bf16));
      gd.push_back(ops::to_device(gc.back(), gpu));
    }
    a->step(gc, {1.0, 0.5, ops::grad_stats(gc, 1.0, Device::cpu())}, {});
    b->step(gd, {1.0, 0.5, ops::grad_stats(gd, 1.0, gpu)}, {});
  }
  for (size_t i = 0; i < cpu.tensors.size(); ++i)
    EXPECT_EQ(host(dev.tensors[i]), test::values(cpu.tensors[i])) << cpu.list[i].first;
}

}  // namespace
}  // namespace tr
