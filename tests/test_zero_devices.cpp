// ZeRO off the host: the sharded optimizer and ZeRO-3's gathers with the model on another device (cpu:1, a
// host partition that every copy treats as distinct as a GPU; cuda:0 too where a GPU is) and the shard either
// beside it or offloaded to the host (--fsdp offload). Every variant must give the host run's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "backend/cuda_api.h"
#include "dist_test_util.h"
#include "models/causal_lm.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "test_util.h"
#include "train/zero.h"
#include "train/zero3.h"

namespace {

using namespace tr;
using test::test_port;
using test::with_group;

// Where the model lives and where its shard does (nullopt: beside the model); `staged`: the group declines
// the model device's memory, so the collectives go through host copies (as a GPU's under Gloo) where they
// would run on the device's memory (the Gloo group reads a host partition's).
struct Placement {
  std::string name;
  Device model;
  std::optional<Device> offload;
  bool staged = false;
};

std::vector<Placement> placements() {
  std::vector<Placement> out{{"host", Device::cpu(), std::nullopt},
                             {"partition", Device{DeviceType::cpu, 1}, std::nullopt},
                             {"partition_staged", Device{DeviceType::cpu, 1}, std::nullopt, true},
                             {"partition_offload", Device{DeviceType::cpu, 1}, Device::cpu()}};
  if (backend::cuda_device_count() > 0) {
    out.push_back({"cuda", Device::cuda(0), std::nullopt});
    out.push_back({"cuda_offload", Device::cuda(0), Device::cpu()});
  }
  return out;
}

// Bit for bit, or within `rel` of the largest magnitude where a GPU computes part of it (its reductions and
// GEMMs sum in other orders than the host's).
void expect_same(const std::vector<float>& got, const std::vector<float>& want, double rel,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (rel == 0) {
    EXPECT_EQ(got, want) << what;
    return;
  }
  double scale = 0;
  for (float w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel * scale) << what << " element " << i;
}

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  return test::randn(shape, seed, DType::f32, Device::cpu(), 0.5);
}

const std::vector<std::pair<std::string, Shape>> kShapes{
    {"h.0.attn.weight", {5, 3}}, {"h.0.attn.bias", {3}}, {"ln_f.weight", {4}}, {"lm_head.weight", {2, 5}}};

std::vector<Tensor> gradients(int rank, int step, Device d) {
  std::vector<Tensor> g;
  for (size_t i = 0; i < kShapes.size(); ++i)
    g.push_back(ops::to_device(
        random_tensor(kShapes[i].second, static_cast<uint32_t>(1000 * step + 10 * rank + i)), d));
  return g;
}

optim::OptimizerOptions adamw_options() {
  optim::OptimizerOptions o;
  o.lr = 0.05;
  o.weight_decay = 0.1;
  return o;
}

// After three sharded steps: the model's weights (fp32, or the bf16 copies under mixed precision) as host
// floats, and each master gathered whole on rank 0.
struct Outcome {
  std::vector<std::vector<float>> weights, masters;
  int on_training_thread = 0, gate_timeouts = 0;  // as FullShardOutcome's (gated)
};

// A gate for the reductions to owners of one rank (`g.before_reduce`): the k-th waits until the call that
// queued it has returned (`returned(queued so far)` after each grad_ready) - which it never does when the
// reduction runs inside that call - counting timeouts (5 s) and reductions on the training thread.
struct ReduceGate {
  std::mutex mu;
  std::condition_variable cv;
  int64_t queued = 0, calls = 0;
  std::atomic<int> on_training{0}, timeouts{0};
  std::thread::id training = std::this_thread::get_id();
  void install(test::CountingGroup& g) {
    g.before_reduce = [this] {
      on_training += std::this_thread::get_id() == training ? 1 : 0;
      std::unique_lock<std::mutex> lock(mu);
      const int64_t k = ++calls;
      if (!cv.wait_for(lock, std::chrono::seconds(5), [&] { return queued >= k; })) ++timeouts;
    };
  }
  void returned(int64_t queued_so_far) {
    {
      std::lock_guard<std::mutex> lock(mu);
      queued = queued_so_far;
    }
    cv.notify_all();
  }
};

enum class Path { one_pass, buckets };

// Whether the collectives run over the model's device's memory: a partition the Gloo group reads, or the
// GPU under NCCL; everything else stages through host memory.
bool device_path(const Placement& pl, dist::CommBackend backend) {
  return pl.name == "partition" ||
         (backend == dist::CommBackend::nccl && pl.model.is_cuda() && !pl.offload && !pl.staged);
}

// Three steps of `world` ranks (3 unless NCCL's one GPU) over 8-byte rounds (one element per rank per
// collective): the compiled step's one-pass reduce-scatter, or the eager step's buckets completed by
// grad-ready reports in backward's order. `gated` (buckets): 64-byte buckets - two, each completed by its
// own report - held by a ReduceGate.
Outcome train_sharded(const Placement& pl, bool mixed, Path path, int port, int world = 3,
                      dist::CommBackend backend = dist::CommBackend::gloo, bool gated = false) {
  Outcome out;
  with_group(
      world, port,
      [&](int r, dist::ProcessGroup& inner) {
        test::CountingGroup g(inner, pl.staged);
        if (pl.model.is_cuda()) backend::cuda_use_device(pl.model.index);
        std::vector<Tensor> ps, copies;
        nn::ParamList list;
        ps.reserve(kShapes.size());
        for (size_t i = 0; i < kShapes.size(); ++i) {
          ps.push_back(
              ops::to_device(random_tensor(kShapes[i].second, 100 + static_cast<uint32_t>(i)), pl.model));
          list.emplace_back(kShapes[i].first, &ps.back());
        }
        ReduceGate gate;  // before the optimizer: it outlives the reductions
        if (gated) gate.install(g);
        train::ShardedOptimizer opt(g, list, "adamw_torch_fused", adamw_options(), gated ? 64 : 8, mixed, 2,
                                    std::nullopt, pl.offload);
        EXPECT_EQ(opt.shard_device(), pl.offload ? *pl.offload : pl.model);
        if (mixed)  // the half weights the model computes with; the masters are the shard's alone
          for (auto& p : ps) copies.push_back(ops::to_dtype(p, DType::bf16));
        for (int step = 0; step < 3; ++step) {
          const std::vector<Tensor> grads = gradients(r, step, pl.model);
          if (path == Path::one_pass) {
            opt.reduce_scatter(grads, 0.5);
          } else {
            for (size_t i = 0; i < ps.size(); ++i) autograd::set_grad(ps[i], grads[i]);
            opt.begin_backward(0.5);
            for (size_t i = ps.size(); i-- > 0;) {
              opt.grad_ready(ps[i].impl_ptr().get());
              gate.returned(static_cast<int64_t>(step * 2 + opt.buckets_queued()));
            }
            opt.finish_backward();
            for (const Tensor& p : ps) EXPECT_FALSE(p.grad().defined());  // dropped once reduced
          }
          if (gated) {
            EXPECT_EQ(opt.buckets_queued(), 2u);
          }
          opt.update({1.0, 0.3, opt.global_stats(1.0)}, copies);  // clipped at 0.3: the global norm matters
        }
        g.before_reduce = nullptr;
        // Only the model's memory on a partition the group reads moves without host copies: there every
        // reduction and gather is a device collective, and the host's are global_stats' (one a step).
        EXPECT_EQ(g.on_device > 0, device_path(pl, backend));
        if (device_path(pl, backend)) {
          EXPECT_EQ(g.on_host, 3);
        }
        std::vector<std::vector<float>> masters;
        for (size_t i = 0; i < ps.size(); ++i) {
          const Tensor m = opt.gather_master(i, 0);
          if (r == 0) masters.push_back(ops::to_vector<float>(m));
        }
        if (r != 0) return;
        out.masters = masters;
        out.on_training_thread = gate.on_training;
        out.gate_timeouts = gate.timeouts;
        for (size_t i = 0; i < ps.size(); ++i)
          out.weights.push_back(ops::to_vector<float>(mixed ? copies[i] : ps[i]));
      },
      {}, backend);
  return out;
}

TEST(ZeroDevices, ShardedAdamWGivesTheHostBitsOnEveryPlacement) {
  int port = 60;
  for (const bool mixed : {false, true})
    for (const Path path : {Path::one_pass, Path::buckets}) {
      const Outcome want = train_sharded(placements().front(), mixed, path, test_port(port++));
      ASSERT_EQ(want.weights.size(), kShapes.size());
      for (const Placement& pl : placements()) {
        if (pl.name == "host") continue;
        SCOPED_TRACE(pl.name + (mixed ? " bf16" : " fp32") +
                     (path == Path::buckets ? " buckets" : " one pass"));
        const Outcome got = train_sharded(pl, mixed, path, test_port(port++));
        ASSERT_EQ(got.weights.size(), want.weights.size());
        // A shard on a GPU takes the gradient norm (clipping) there; offloaded, everything but the copies
        // runs on the host: the host's bits.
        const bool gpu_math = pl.model.is_cuda() && !pl.offload;
        for (size_t i = 0; i < want.weights.size(); ++i) {
          expect_same(got.weights[i], want.weights[i], gpu_math ? (mixed ? 1e-2 : 1e-5) : 0,
                      kShapes[i].first);
          expect_same(got.masters[i], want.masters[i], gpu_math ? 1e-5 : 0, kShapes[i].first);
        }
      }
    }
}

// The fp32 weights moved at all: a run that updated nothing would pass the comparison above.
TEST(ZeroDevices, TheUpdateMovesTheWeights) {
  int port = 130;
  for (const Placement& pl : placements()) {
    if (pl.name != "partition" && pl.name != "partition_offload") continue;
    SCOPED_TRACE(pl.name);
    const Outcome o = train_sharded(pl, false, Path::one_pass, test_port(port++));
    ASSERT_FALSE(o.weights.empty());
    const std::vector<float> before = ops::to_vector<float>(random_tensor(kShapes[0].second, 100));
    EXPECT_NE(o.weights[0], before);
    EXPECT_EQ(o.weights[0], o.masters[0]);  // fp32: the weights are the masters
  }
}

// ZeRO-3 on GPT-2 (2 layers): the gradient shard after one backward, and the loss of a forward gathered from
// the updated shard, equal to the host run's on every placement.
struct FullShardOutcome {
  std::vector<float> grad_shard;
  double loss_after = 0;
  // With `gated`: reductions run on the training thread, and those whose gate did not open within 5 s.
  int on_training_thread = 0, gate_timeouts = 0;
};

// One step of `world` ranks (2 unless NCCL's one GPU); the last rank's gradient shard and loss. `gated`:
// one chunk per unit, and the k-th reduction to owners waits until the grad_ready call that queued it has
// returned to the autograd engine - which it never does if the reduction runs inside that call.
FullShardOutcome train_full_shard(const Placement& pl, bool tied, int port, int world = 2,
                                  dist::CommBackend backend = dist::CommBackend::gloo, bool gated = false) {
  const nlohmann::json cfg = {
      {"model_type", "gpt2"}, {"vocab_size", 61},           {"n_embd", 16},     {"n_layer", 2},
      {"n_head", 2},          {"n_positions", 16},          {"resid_pdrop", 0}, {"embd_pdrop", 0},
      {"attn_pdrop", 0},      {"tie_word_embeddings", tied}};
  const auto config = models::ModelConfig::from_json(cfg, "test");
  const auto ids = [&](int r) {
    std::vector<int64_t> v(2 * 8);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<int64_t>((i * 7 + 13 * static_cast<size_t>(r)) % 61);
    return ops::from_vector<int64_t>(v, {2, 8}, pl.model);
  };
  FullShardOutcome out;
  with_group(
      world, port,
      [&](int r, dist::ProcessGroup& inner) {
        test::CountingGroup g(inner, pl.staged);
        if (pl.model.is_cuda()) backend::cuda_use_device(pl.model.index);
        const auto loss_of = [&](models::CausalLM& m) {
          models::ForwardOptions fo;
          fo.labels = ids(r);
          fo.num_items_in_batch = 28;
          fo.return_logits = false;
          return m.forward(ids(r), fo).loss;
        };
        ReduceGate gate;  // before the optimizer and FullShard: it outlives the reductions
        if (gated) gate.install(g);
        Generator gen(3);
        auto model = models::create_causal_lm(config, pl.model, DType::f32, gen);
        const nn::ParamList params = model->named_parameters();
        train::ShardedOptimizer opt(g, params, "adamw_torch", adamw_options(), 1 << 10, false, 3,
                                    std::nullopt, pl.offload);
        // 256-element chunks: several per unit (gated: one, at most 2 KB here).
        train::FullShard full(opt, params, gated ? 1 << 20 : 1 << 10);
        model->set_layer_hooks(&full);
        EXPECT_TRUE(full.all_released());
        full.begin_step();
        full.begin_backward(1.0);
        {
          autograd::GradReadyScope ready([&](const TensorImpl* leaf) {
            full.grad_ready(leaf);
            gate.returned(full.reductions());
          });
          autograd::backward({loss_of(*model)});
        }
        full.finish_backward();
        g.before_reduce = nullptr;
        if (gated) {
          EXPECT_EQ(full.reductions(), full.units()) << "one chunk per unit";
        }
        EXPECT_TRUE(full.all_released());
        const std::vector<float> shard = ops::to_vector<float>(opt.grad_shard());
        opt.update({1.0, 1.0, opt.global_stats(1.0)}, {});
        double loss = 0;
        {
          autograd::NoGradGuard no_grad;
          loss = ops::to_vector<double>(loss_of(*model))[0];
        }
        EXPECT_TRUE(full.all_released());
        // On a partition the group reads, every gather and reduction runs over its memory; the host's one
        // collective is global_stats'.
        EXPECT_EQ(g.on_device > 0, device_path(pl, backend));
        if (device_path(pl, backend)) {
          EXPECT_EQ(g.on_host, 1);
        }
        if (r == world - 1) {  // the last rank's shard: the end of the flat space
          out.grad_shard = shard;
          out.loss_after = loss;
          out.on_training_thread = gate.on_training;
          out.gate_timeouts = gate.timeouts;
        }
      },
      {}, backend);
  return out;
}

TEST(ZeroDevices, FullShardGathersAndReducesOffTheHost) {
  int port = 91;
  for (const bool tied : {true, false}) {
    const FullShardOutcome want = train_full_shard(placements().front(), tied, test_port(port++));
    ASSERT_FALSE(want.grad_shard.empty());
    for (const Placement& pl : placements()) {
      if (pl.name == "host") continue;
      SCOPED_TRACE(pl.name + (tied ? " tied" : " untied"));
      const FullShardOutcome got = train_full_shard(pl, tied, test_port(port++));
      // On a GPU the model's own forward and backward run there: close, not the same bits.
      const double rel = pl.model.is_cuda() ? 1e-4 : 0;
      expect_same(got.grad_shard, want.grad_shard, rel, "gradient shard");
      if (rel == 0)
        EXPECT_EQ(got.loss_after, want.loss_after);
      else
        EXPECT_NEAR(got.loss_after, want.loss_after, 1e-4 * std::abs(want.loss_after));
    }
  }
}

// ZeRO-3's gradient reductions run on its communication thread beside the backward of the layers below: each
// reduction is held until the call that queued it has returned to the autograd engine, which a reduction on
// the training thread would wait for in vain. On every placement (the host path, the device path over a
// partition, staged, offloaded) the shard keeps the ungated run's bits.
TEST(ZeroDevices, FullShardReducesBesideTheBackward) {
  int port = 170;
  for (const bool tied : {true, false})
    for (const Placement& pl : placements()) {
      SCOPED_TRACE(pl.name + (tied ? " tied" : " untied"));
      const FullShardOutcome want = train_full_shard(pl, tied, test_port(port++));
      const FullShardOutcome got =
          train_full_shard(pl, tied, test_port(port++), 2, dist::CommBackend::gloo, true);
      EXPECT_EQ(got.on_training_thread, 0);
      EXPECT_EQ(got.gate_timeouts, 0);
      expect_same(got.grad_shard, want.grad_shard, 0, "gradient shard");
      EXPECT_EQ(got.loss_after, want.loss_after);
    }
}

// ZeRO-2's buckets the same way: each reduced on the communication thread after the grad_ready call that
// packed it returned, with the ungated run's bits (other bucket bounds: the sums are per element).
TEST(ZeroDevices, ShardedBucketsReduceBesideTheBackward) {
  int port = 200;
  for (const Placement& pl : placements()) {
    SCOPED_TRACE(pl.name);
    const Outcome want = train_sharded(pl, true, Path::buckets, test_port(port++));
    const Outcome got =
        train_sharded(pl, true, Path::buckets, test_port(port++), 3, dist::CommBackend::gloo, true);
    EXPECT_EQ(got.on_training_thread, 0);
    EXPECT_EQ(got.gate_timeouts, 0);
    EXPECT_EQ(got.weights, want.weights);
    EXPECT_EQ(got.masters, want.masters);
  }
}

// A world of one still runs every collective of the device paths (the reduce-scatter, the per-owner reduce,
// the all-gather, ZeRO-3's grouped broadcasts): NCCL's over the GPU's memory where there is one (two ranks
// need two GPUs: NCCL refuses a GPU twice), else Gloo's over a partition - against the host's run.
TEST(ZeroDevices, AWorldOfOneRunsTheDevicePaths) {
  const bool gpu = backend::cuda_device_count() > 0;
  const Placement host = placements().front();
  const Placement dev = gpu ? Placement{"cuda", Device::cuda(0), std::nullopt} : placements()[1];
  const auto comm = gpu ? dist::CommBackend::nccl : dist::CommBackend::gloo;
  ASSERT_TRUE(device_path(dev, comm));
  int port = 140;
  for (const bool mixed : {false, true})
    for (const Path path : {Path::one_pass, Path::buckets}) {
      SCOPED_TRACE(std::string(mixed ? "bf16" : "fp32") + (path == Path::buckets ? " buckets" : " one pass"));
      const Outcome want = train_sharded(host, mixed, path, test_port(port++), 1);
      const Outcome got = train_sharded(dev, mixed, path, test_port(port++), 1, comm);
      ASSERT_EQ(got.weights.size(), want.weights.size());
      for (size_t i = 0; i < want.weights.size(); ++i) {
        expect_same(got.weights[i], want.weights[i], gpu ? (mixed ? 1e-2 : 1e-5) : 0, kShapes[i].first);
        expect_same(got.masters[i], want.masters[i], gpu ? 1e-5 : 0, kShapes[i].first);
      }
    }
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "full shard, tied" : "full shard, untied");
    const FullShardOutcome want = train_full_shard(host, tied, test_port(port++), 1);
    const FullShardOutcome got = train_full_shard(dev, tied, test_port(port++), 1, comm);
    ASSERT_FALSE(want.grad_shard.empty());
    expect_same(got.grad_shard, want.grad_shard, gpu ? 1e-4 : 0, "gradient shard");
    EXPECT_NEAR(got.loss_after, want.loss_after, gpu ? 1e-4 * std::abs(want.loss_after) : 0);
  }
}

}  // namespace
