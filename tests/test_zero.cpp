// ZeRO-2 pieces on Gloo groups of threads: the reduce-scatter, the flat layout's uneven shards, the sharded
// optimizer against the unsharded one on the summed gradients (bitwise), and optimizer state saved by one
// world size reassembled for others.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <thread>

#include "autograd/node.h"
#include "dist_test_util.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "autograd/functions.h"
#include "models/causal_lm.h"
#include "train/comm_queue.h"
#include "train/zero.h"
#include "train/zero3.h"

namespace {

using namespace tr;
using test::test_port;
using test::with_group;
namespace fs = std::filesystem;

TEST(DistZero, ReduceScatterSumsEachRanksBlock) {
  with_group(3, test_port(40), [](int r, dist::ProcessGroup& g) {
    const size_t n = 5;
    std::vector<float> in(3 * n), out(n), scratch;
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) + 0.25f * static_cast<float>(r + 1);
    g.reduce_scatter_sum(in.data(), out.data(), n, scratch);
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int q = 0; q < 3; ++q)  // every rank's block r (exact in f32)
        want += static_cast<float>(static_cast<size_t>(r) * n + i) + 0.25f * static_cast<float>(q + 1);
      ASSERT_EQ(out[i], want) << "rank " << r << " element " << i;
    }
  });
}

TEST(DistZero, FlatLayoutCutsUnevenShardsAcrossParameters) {
  std::vector<Tensor> ps{ops::zeros({7}), ops::zeros({2, 3}), ops::zeros({3})};
  nn::ParamList list{{"a", &ps[0]}, {"b", &ps[1]}, {"c", &ps[2]}};
  const train::FlatLayout l(list, 3);  // 16 elements: shards of 6, the last padded by 2
  EXPECT_EQ(l.total, 16);
  EXPECT_EQ(l.shard, 6);
  const auto s = [&](int r) {
    std::string out;
    for (const auto& x : l.slices(list, r))
      out += x.param + std::to_string(x.begin) + "+" + std::to_string(x.count) + " ";
    return out;
  };
  EXPECT_EQ(s(0), "a0+6 ");
  EXPECT_EQ(s(1), "a6+1 b0+5 ");
  EXPECT_EQ(s(2), "b5+1 c0+3 ");
  EXPECT_EQ(s(3), "");  // past the end
}

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  Tensor t = ops::empty(shape, DType::f32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.5f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(rng);
  return t;
}

const std::vector<std::pair<std::string, Shape>> kShapes{
    {"h.0.attn.weight", {5, 3}}, {"h.0.attn.bias", {3}}, {"ln_f.weight", {4}}, {"lm_head.weight", {2, 5}}};

// Identical parameters on every caller; rank r's gradients differ.
struct Model {
  std::vector<Tensor> ps;
  nn::ParamList list;
  Model() {
    ps.reserve(kShapes.size());
    for (size_t i = 0; i < kShapes.size(); ++i) {
      ps.push_back(random_tensor(kShapes[i].second, 100 + static_cast<uint32_t>(i)));
      list.emplace_back(kShapes[i].first, &ps.back());
    }
  }
  static std::vector<Tensor> grads(int r, int step) {
    std::vector<Tensor> g;
    for (size_t i = 0; i < kShapes.size(); ++i)
      g.push_back(random_tensor(kShapes[i].second, static_cast<uint32_t>(1000 * step + 10 * r + i)));
    return g;
  }
};

optim::OptimizerOptions adamw_options() {
  optim::OptimizerOptions o;
  o.lr = 0.05;
  o.weight_decay = 0.1;
  return o;
}

// The unsharded AdamW on the gradients summed in rank order (the reduce-scatter's order): after three
// steps every parameter and every state entry is the sharded run's, bit for bit.
TEST(DistZero, ShardedAdamWEqualsAdamWOnTheSummedGradients) {
  const int world = 3;
  Model ref;
  auto ref_opt = optim::make_optimizer("adamw_torch_fused", ref.list, adamw_options());
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> sum = Model::grads(0, step);
    for (int r = 1; r < world; ++r) {
      const auto g = Model::grads(r, step);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = ops::binary(backend::BinaryOp::add, sum[i], g[i]);
    }
    ref_opt->step(sum, {}, {});
  }
  const fs::path dir = fs::temp_directory_path() / ("zero_state_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  with_group(world, test_port(41), [&](int r, dist::ProcessGroup& g) {
    Model m;
    // Buckets of 8 bytes: one element per rank per collective, many rounds.
    train::ShardedOptimizer opt(g, m.list, "adamw_torch_fused", adamw_options(), 8);
    for (int step = 0; step < 3; ++step) opt.step(Model::grads(r, step), {}, {});
    for (size_t i = 0; i < m.ps.size(); ++i)
      for (int64_t k = 0; k < m.ps[i].numel(); ++k)
        ASSERT_EQ(m.ps[i].data<float>()[k], ref.ps[i].data<float>()[k]) << kShapes[i].first << " " << k;
    EXPECT_EQ(opt.step_count(), 3);
    train::save_optimizer_state(dir.string(), opt);
  });
  ASSERT_TRUE(train::has_optimizer_state(dir.string()));
  std::map<std::string, Tensor> want;
  for (const auto& [k, t] : ref_opt->state_dict()) want[k] = t;
  const auto same_as_ref = [&](const std::map<std::string, Tensor>& got, const train::StateSlice* slice) {
    for (const auto& [k, t] : got) {
      if (k == "step") continue;
      Tensor w = ops::contiguous(want.at(k));
      const int64_t at = slice ? slice->begin : 0;
      ASSERT_LE(at + t.numel(), w.numel()) << k;
      for (int64_t e = 0; e < t.numel(); ++e)
        ASSERT_EQ(ops::contiguous(t).data<float>()[e], w.data<float>()[at + e]) << k << " " << e;
    }
  };
  {  // one process, unsharded, from the three rank files
    Model m;
    auto opt = optim::make_optimizer("adamw_torch", m.list, adamw_options());
    const auto state = train::load_optimizer_state(dir.string(), *opt, m.list);
    EXPECT_EQ(state.size(), want.size());
    same_as_ref(state, nullptr);
    opt->load_state_dict(state);
    EXPECT_EQ(opt->step_count(), 3);
  }
  // Two ranks from the files of three: each gets its own (different) slices.
  with_group(2, test_port(42), [&](int, dist::ProcessGroup& g) {
    Model m;
    train::ShardedOptimizer opt(g, m.list, "adamw_torch_fused", adamw_options(), 1 << 20);
    const auto state = train::load_optimizer_state(dir.string(), opt, m.list);
    for (const auto& s : opt.slices()) {
      std::map<std::string, Tensor> mine;
      for (const auto& [k, t] : state)
        if (k == "exp_avg." + s.param || k == "exp_avg_sq." + s.param) mine[k] = t;
      ASSERT_EQ(mine.size(), 2u) << s.param;
      same_as_ref(mine, &s);
    }
    opt.load_state_dict(state);
  });
  // A rank file missing: named, with the world size that saved them.
  fs::remove(dir / "optimizer.rank-2.safetensors");
  Model m;
  auto opt = optim::make_optimizer("adamw_torch", m.list, adamw_options());
  try {
    train::load_optimizer_state(dir.string(), *opt, m.list);
    ADD_FAILURE() << "loaded with a rank file missing";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("missing optimizer.rank-2.safetensors: its optimizer state was saved by 3 "
                                   "ranks"),
        std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// A streamed save's gather: each master whole on the chosen root, straight from the ranks' slices (4 ranks
// of 8 elements cut every parameter differently: one spans two ranks, some ranks hold none of one), with and
// without own masters; the other ranks get nothing.
TEST(DistZero, GatherMasterPutsEachParameterWholeOnTheRoot) {
  for (const bool own : {true, false})
    with_group(4, test_port(own ? 44 : 45), [&](int r, dist::ProcessGroup& g) {
      Model m;
      const Model ref;
      train::ShardedOptimizer opt(g, m.list, "adamw_torch_fused", adamw_options(), 1 << 20, own);
      if (own)  // the shard is a copy: the whole masters may go (MixedPrecision::shard_masters)
        for (auto& p : m.ps) p = ops::full(p.shape(), std::nan(""));
      for (const int root : {0, 3})
        for (size_t i = 0; i < m.ps.size(); ++i) {
          const Tensor t = opt.gather_master(i, root);
          if (r != root) {
            EXPECT_FALSE(t.defined());
            continue;
          }
          ASSERT_EQ(t.shape(), ref.ps[i].shape());
          for (int64_t k = 0; k < t.numel(); ++k)
            ASSERT_EQ(t.data<float>()[k], ref.ps[i].data<float>()[k]) << kShapes[i].first << " " << k;
        }
    });
}

TEST(DistZero, RefusesOptimizersThatNeedWholeTensors) {
  with_group(2, test_port(43), [](int, dist::ProcessGroup& g) {
    Model m;
    for (const char* name : {"adafactor", "adamw_8bit"}) {
      try {
        train::ShardedOptimizer opt(g, m.list, name, adamw_options(), 1 << 20);
        ADD_FAILURE() << name << " was sharded";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("only element-wise optimizers"), std::string::npos) << e.what();
      }
    }
  });
}

// backward_hook runs its hook when the gradient arrives, before anything upstream of it runs backward.
// ZeRO's communication thread: jobs in queue order off the caller's thread; a failure rethrown by the next
// wait, with the jobs queued after it skipped (a rank whose collective failed starts no other); the waits
// counted as blocked time.
TEST(DistZero, CommQueueRunsInOrderAndRethrowsAFailure) {
  const auto group = dist::dry_run_group(2);
  train::CommQueue q(Device::cpu(), *group);
  std::vector<int> order;
  std::thread::id ran_on;
  const uint64_t a = q.push([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    order.push_back(1);
    ran_on = std::this_thread::get_id();
  });
  const uint64_t b = q.push([&] { order.push_back(2); });
  EXPECT_EQ(b, a + 1);
  q.wait(a);
  q.drain();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_GT(q.blocked_seconds(), 0.03);
  EXPECT_GE(q.busy_seconds(), q.blocked_seconds() - 0.01);
  q.push([] { throw Error("the collective failed"); });
  const uint64_t skipped = q.push([&] { order.push_back(3); });
  try {
    q.wait(skipped);
    ADD_FAILURE() << "no rethrow";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the collective failed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(order.size(), 2u);
  EXPECT_THROW(q.drain(), Error);  // the failure stays
}

TEST(DistZero, BackwardHookRunsBeforeTheUpstreamBackward) {
  Tensor x = random_tensor({3}, 7);
  autograd::set_requires_grad(x, true);
  std::vector<std::string> order;
  Tensor y = backward_hook(x * x, [&] { order.push_back("hook"); });
  Tensor z = backward_hook(sum(y * 3.0), [&] { order.push_back("outer"); });
  autograd::backward({z});
  ASSERT_EQ(order, (std::vector<std::string>{"outer", "hook"}));
  for (int64_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(x.grad().data<float>()[i], 6.0f * x.data<float>()[i]);
}

// ZeRO-3 on a real GPT-2 (2 layers): parameters released between uses (a read throws), each layer gathered
// for forward and again for backward, every one released after, and the gradient shard equal bit for bit
// to the sum (in rank order) of the unsharded model's gradients on each rank's batch. Untied, the embeddings
// are a unit of their own, gathered for their lookup only (their backward needs no weights).
class FullShardModel : public ::testing::TestWithParam<bool> {};

TEST_P(FullShardModel, GathersEachLayerAndReducesItsGradients) {
  const bool tied = GetParam();
  const nlohmann::json cfg = {
      {"model_type", "gpt2"}, {"vocab_size", 61},           {"n_embd", 16},     {"n_layer", 2},
      {"n_head", 2},          {"n_positions", 16},          {"resid_pdrop", 0}, {"embd_pdrop", 0},
      {"attn_pdrop", 0},      {"tie_word_embeddings", tied}};
  const auto config = models::ModelConfig::from_json(cfg, "test");
  const auto ids = [](int r) {
    std::vector<int64_t> v(2 * 8);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<int64_t>((i * 7 + 13 * static_cast<size_t>(r)) % 61);
    return ops::from_vector<int64_t>(v, {2, 8});
  };
  const auto loss_of = [&](models::CausalLM& m, int r) {
    models::ForwardOptions fo;
    fo.labels = ids(r);
    fo.num_items_in_batch = 28;
    fo.return_logits = false;
    return m.forward(ids(r), fo).loss;
  };
  with_group(2, test_port(tied ? 44 : 45), [&](int r, dist::ProcessGroup& g) {
    Generator gen(3);
    auto ref = models::create_causal_lm(config, Device::cpu(), DType::f32, gen);
    const nn::ParamList rp = ref->named_parameters();
    std::vector<Tensor> want(rp.size());
    for (int q = 0; q < 2; ++q) {  // rank 0's gradients, then rank 1's added: the reduction's order
      autograd::backward({loss_of(*ref, q)});
      for (size_t i = 0; i < rp.size(); ++i) {
        const Tensor gq = ops::contiguous(rp[i].second->grad());
        want[i] =
            q == 0 ? ops::contiguous(ops::binary(backend::BinaryOp::mul, gq, ops::full({}, 1.0, DType::f32)))
                   : ops::binary(backend::BinaryOp::add, want[i], gq);
        autograd::zero_grad(*rp[i].second);
      }
    }
    Generator gen2(3);
    auto model = models::create_causal_lm(config, Device::cpu(), DType::f32, gen2);
    const nn::ParamList params = model->named_parameters();
    train::ShardedOptimizer opt(g, params, "adamw_torch", adamw_options(), 1 << 10, false, 3);
    train::FullShard full(opt, params, 1 << 10);  // 256-element chunks: several per unit
    model->set_layer_hooks(&full);
    EXPECT_EQ(full.units(), tied ? 3 : 4);
    EXPECT_TRUE(full.all_released());
    EXPECT_THROW(params.front().second->data_ptr(), Error);
    full.begin_step();
    full.begin_backward(1.0);
    {
      autograd::GradReadyScope ready([&](const TensorImpl* leaf) { full.grad_ready(leaf); });
      autograd::backward({loss_of(*model, r)});
    }
    full.finish_backward();
    // The root once (untied: the embeddings and the head once each); each layer for forward and backward.
    const int64_t root = tied ? 1 : 2;
    EXPECT_EQ(full.gathers(), root + 2 + 2);
    EXPECT_EQ(full.prefetched(), 2);  // backward_pre: layer 1 at the forward's end, layer 0 after it
    EXPECT_TRUE(full.all_released());
    for (const auto& [name, p] : params) EXPECT_FALSE(p->grad().defined()) << name;
    const float* shard = opt.grad_shard().data<float>();
    int64_t pos = 0;
    for (const auto& s : opt.slices()) {
      size_t i = 0;
      while (rp[i].first != s.param) ++i;
      for (int64_t k = 0; k < s.count; ++k)
        ASSERT_EQ(shard[pos + k], want[i].data<float>()[s.begin + k]) << s.param << " " << s.begin + k;
      pos += s.count;
    }
    // Evaluation (no grad): every unit gathered and released again.
    {
      autograd::NoGradGuard no_grad;
      loss_of(*model, r);
    }
    EXPECT_EQ(full.gathers(), (root + 4) + (root + 2));
    EXPECT_TRUE(full.all_released());
  });
}

INSTANTIATE_TEST_SUITE_P(DistZero, FullShardModel, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "tied" : "untied"; });

}  // namespace
