// device_map "auto" (issue 13): the placement by bytes over device budgets (table-driven), --device_memory's
// parser, and a model split across host partitions (cpu:1, cpu:2 - devices as distinct as two GPUs to every
// same-device check) giving the one-device run's logits, loss, gradients and generated tokens, bit for bit.
#include <gtest/gtest.h>

#include <filesystem>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "ops/ops.h"
#include "core/allocator.h"
#include "core/error.h"
#include "models/causal_lm.h"
#include "models/device_map.h"
#include "models/generate.h"
#include "test_util.h"

namespace tr {
namespace {

namespace fs = std::filesystem;

const Device kP1{DeviceType::cpu, 1}, kP2{DeviceType::cpu, 2};

nlohmann::json llama_json(bool tied) {
  return {{"model_type", "llama"},      {"vocab_size", 96},
          {"hidden_size", 16},          {"intermediate_size", 32},
          {"num_hidden_layers", 4},     {"num_attention_heads", 4},
          {"num_key_value_heads", 2},   {"max_position_embeddings", 32},
          {"tie_word_embeddings", tied}};
}

nlohmann::json gpt2_json() {
  return {{"model_type", "gpt2"}, {"vocab_size", 96}, {"n_embd", 16},
          {"n_layer", 4},         {"n_head", 4},      {"n_positions", 32}};
}

std::unique_ptr<models::CausalLM> meta_model(const nlohmann::json& j) {
  Generator g(0);
  return models::create_causal_lm(models::ModelConfig::from_json(j, "config.json"), Device::meta(),
                                  DType::f32, g);
}

std::string where(const models::DevicePlacement& p) {
  std::vector<std::string> layers;
  for (const Device d : p.layers) layers.push_back(d.str());
  return fmt::format("E {} | {} | H {}", p.embeddings.str(), fmt::join(layers, " "), p.head.str());
}

// The units' bytes (f32): embeddings 96*16*4 = 6144; a Llama layer 4 * 16*16... computed, not assumed.
TEST(DeviceMap, PlacesByBytesAcrossTheBudgetsInOrder) {
  auto untied = meta_model(llama_json(false));
  const auto units = models::placement_units(*untied, DType::f32);
  ASSERT_EQ(units.size(), 6u);
  int64_t total = 0;
  for (const auto& u : units) total += u.bytes;
  EXPECT_EQ(total, untied->num_parameters() * 4);
  const int64_t layer = units[1].bytes, emb = units[0].bytes, head = units[5].bytes;
  const auto place = [&](models::CausalLM& m, std::vector<models::DeviceBudget> b) {
    return where(models::infer_auto_device_map(m, DType::f32, b));
  };
  // Fits the first device: all there.
  EXPECT_EQ(place(*untied, {{Device::cuda(0), total}, {Device::cuda(1), total}}),
            "E cuda:0 | cuda:0 cuda:0 cuda:0 cuda:0 | H cuda:0");
  // Two GPUs, neither holds it all: balanced halves, the embeddings with layer 0, the head with layer 3.
  EXPECT_EQ(place(*untied, {{Device::cuda(0), total - 1}, {Device::cuda(1), total - 1}}),
            "E cuda:0 | cuda:0 cuda:0 cuda:1 cuda:1 | H cuda:1");
  // Too little on the GPUs: what is left goes to the host.
  EXPECT_EQ(place(*untied, {{Device::cuda(0), emb + layer}, {Device::cuda(1), 2 * layer}}),
            "E cuda:0 | cuda:0 cuda:1 cuda:1 cpu | H cpu");
  // A bounded host that cannot take the rest: refused, naming the unit without a place.
  try {
    place(*untied, {{Device::cuda(0), emb + layer}, {Device::cpu(), layer}});
    ADD_FAILURE() << "placed a model larger than its budgets";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
  }
  // A tied head reads the embeddings' table: it stays with them, wherever the last layer goes.
  auto tied = meta_model(llama_json(true));
  const int64_t tied_total = tied->num_parameters() * 4;
  // Balanced by bytes: the embeddings count in cpu:1's half, so layer 1 no longer fits there.
  EXPECT_EQ(place(*tied, {{kP1, tied_total - 1}, {kP2, tied_total}}),
            "E cpu:1 | cpu:1 cpu:2 cpu:2 cpu:2 | H cpu:1");
  // An unbounded accelerator in the middle still takes only its share.
  EXPECT_EQ(place(*untied, {{Device::cuda(0), total - 1}, {Device::cuda(1), 0}, {Device::cuda(2), total}}),
            "E cuda:0 | cuda:0 cuda:1 cuda:2 cuda:2 | H cuda:2");
  // Three accelerators: thirds, the head with the last layer.
  EXPECT_EQ(
      place(*untied, {{Device::cuda(0), total - 1}, {Device::cuda(1), total}, {Device::cuda(2), total}}),
      "E cuda:0 | cuda:0 cuda:1 cuda:2 cuda:2 | H cuda:2");
  // A chunk larger than a GPU's budget skips it: the embeddings with layer 0 go to the next one.
  EXPECT_EQ(place(*untied, {{Device::cuda(0), emb}, {Device::cuda(1), total}}),
            "E cuda:1 | cuda:1 cuda:1 cuda:1 cuda:1 | H cuda:1");
  // The head's unit holds the final norm and the untied lm_head: 16 + 96 * 16 floats.
  EXPECT_EQ(head, (16 + 96 * 16) * 4);
  auto gpt2 = meta_model(gpt2_json());
  EXPECT_EQ(models::placement_units(*gpt2, DType::bf16)[0].bytes, (96 + 32) * 16 * 2);  // wte + wpe, in bf16
  // One decoder layer: the embeddings, the layer and an untied head are one chunk.
  auto one = meta_model([] {
    auto j = llama_json(false);
    j["num_hidden_layers"] = 1;
    return j;
  }());
  const int64_t one_total = one->num_parameters() * 4;
  EXPECT_EQ(place(*one, {{Device::cuda(0), one_total - 1}, {Device::cuda(1), one_total}}),
            "E cuda:1 | cuda:1 | H cuda:1");
}

TEST(DeviceMap, ParsesDeviceMemoryAsHfsMaxMemory) {
  const auto b = models::parse_device_memory("24GB,24GiB", "device_memory");
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].device, Device::cuda(0));
  EXPECT_EQ(b[0].bytes, 24000000000);
  EXPECT_EQ(b[1].device, Device::cuda(1));
  EXPECT_EQ(b[1].bytes, int64_t{24} << 30);
  const auto c = models::parse_device_memory("1:8GB,cpu:64GB", "device_memory");
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].device, Device::cuda(1));
  EXPECT_EQ(c[1].device, Device::cpu());
  // Host partitions, placed like GPUs, before the host.
  const auto h = models::parse_device_memory("cpu:1:8MB,cpu:2:8MB,cpu:64GB", "max_memory");
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].device, (Device{DeviceType::cpu, 1}));
  EXPECT_EQ(h[0].bytes, 8000000);
  EXPECT_EQ(h[1].device, (Device{DeviceType::cpu, 2}));
  EXPECT_EQ(h[2].device, Device::cpu());
  for (const char* bad : {"24 parsecs", "cpu:8GB,24GB", "0:8GB,0:8GB", "x:8GB", "", "0GB", "cpu:8:1MB",
                          "cpu:0:1MB", "cpu:1:1MB,cpu:1:1MB", "cpu:64GB,cpu:1:1MB", "cpu:1:"}) {
    try {
      models::parse_device_memory(bad, "device_memory");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--device_memory"), std::string::npos) << e.what();
    }
  }
}

struct SplitCase {
  const char* name;
  nlohmann::json config;
};

class DeviceMapSplit : public ::testing::TestWithParam<SplitCase> {};

// A saved model loaded whole and loaded split over cpu:1, cpu:2 and the host: the same bits out of forward,
// backward and generation, each parameter on its part's device and the partitions holding their bytes.
TEST_P(DeviceMapSplit, RunsAsTheOneDeviceModelDoes) {
  const auto& c = GetParam();
  const fs::path dir = fs::temp_directory_path() / fmt::format("device_map_{}_{}", c.name, ::getpid());
  fs::remove_all(dir);
  {
    Generator g(7);
    auto m = models::create_causal_lm(models::ModelConfig::from_json(c.config, "config.json"), Device::cpu(),
                                      DType::f32, g);
    models::save_pretrained(*m, dir.string());
  }
  auto whole = models::from_pretrained(dir.string());
  const auto units = models::placement_units(*whole, DType::f32);
  const int64_t layer = units[1].bytes;
  models::PretrainedOptions split_opts;
  split_opts.device_map = "auto";
  // cpu:1 takes the embeddings and layer 0, cpu:2 two layers; the host the rest.
  split_opts.max_memory = {{kP1, units[0].bytes + layer + units[5].bytes}, {kP2, 2 * layer}};
  const int64_t before1 = cpu_allocator(1).stats().current_bytes;
  auto split = models::from_pretrained(dir.string(), split_opts);
  const auto& p = split->placement();
  ASSERT_FALSE(p.single());
  EXPECT_EQ(p.embeddings, kP1);
  EXPECT_EQ(p.layers[0], kP1);
  EXPECT_EQ(p.layers[1], kP2);
  EXPECT_EQ(p.layers[3], Device::cpu());
  EXPECT_EQ(split->device(), kP1);
  int64_t on1 = 0;
  for (const auto& [name, t] : split->named_parameters()) {
    EXPECT_EQ(t->device(), p.of(name)) << name;
    if (t->device() == kP1) on1 += static_cast<int64_t>(t->nbytes());
  }
  EXPECT_GE(cpu_allocator(1).stats().current_bytes - before1, on1);
  EXPECT_EQ(p.layers[2], kP2);
  EXPECT_EQ(p.head,
            c.config.value("tie_word_embeddings", c.config["model_type"] == "gpt2") ? kP1 : Device::cpu());
  // Forward with labels, then backward: logits, loss and every gradient equal.
  std::vector<int64_t> tokens(24);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 37 + 5) % 96);
  const Tensor ids = ops::from_vector<int64_t>(tokens, {2, 12});
  models::ForwardOptions fo;
  fo.labels = ids;
  auto a = whole->forward(ids, fo);
  auto b = split->forward(ids, fo);
  EXPECT_EQ(b.loss.device(), p.head);
  EXPECT_EQ(test::values(a.logits), test::values(b.logits));
  EXPECT_EQ(test::values(a.loss), test::values(b.loss));
  autograd::backward({a.loss});
  autograd::backward({b.loss});
  auto pa = whole->named_parameters(), pb = split->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    const Tensor ga = pa[i].second->grad(), gb = pb[i].second->grad();
    ASSERT_TRUE(gb.defined()) << pb[i].first;
    EXPECT_EQ(gb.device(), pb[i].second->device()) << pb[i].first;
    EXPECT_EQ(test::values(ga), test::values(gb)) << pb[i].first;
  }
  // Greedy generation with the KV cache (each layer's cache on its device).
  models::GenerateOptions go;
  go.max_new_tokens = 6;
  const Tensor prompt = ops::narrow(ids, 1, 0, 4);
  EXPECT_EQ(test::values(models::generate(*whole, prompt, go)),
            test::values(models::generate(*split, prompt, go)));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, DeviceMapSplit,
                         ::testing::Values(SplitCase{"llama_untied", llama_json(false)},
                                           SplitCase{"llama_tied", llama_json(true)},
                                           SplitCase{"gpt2", gpt2_json()}),
                         [](const auto& i) { return std::string(i.param.name); });

// Training a split model: the optimizer passes take tensors on several devices (one pass per device), and the
// gradient statistics continue one sum across them, so the clipped update has the one-device bits.
TEST(DeviceMapOps, OptimizerPassesOverSeveralDevicesGiveTheOneDeviceBits) {
  Generator gen(11);
  std::vector<Tensor> grads, params;
  for (int64_t i = 0; i < 5; ++i) {  // over 64K elements each: several chunks per tensor
    grads.push_back(ops::randn({70000 + 1000 * i}, gen));
    params.push_back(ops::randn({70000 + 1000 * i}, gen));
  }
  const std::vector<Device> where{kP1, kP1, kP2, kP2, Device::cpu()};
  auto on = [&](const std::vector<Tensor>& ts, bool split) {  // fresh copies: the update is in place
    std::vector<Tensor> out;
    for (size_t i = 0; i < ts.size(); ++i) {
      out.push_back(ops::empty(ts[i].shape(), DType::f32, split ? where[i] : Device::cpu()));
      ops::copy_(out.back(), ts[i]);
    }
    return out;
  };

  std::vector<std::vector<Tensor>> after;
  std::vector<double> norms;
  for (const bool split : {false, true}) {
    const auto g = on(grads, split), p = on(params, split);
    const Tensor stats = ops::grad_stats(g, 0.5, split ? kP1 : Device::cpu());
    EXPECT_EQ(stats.device(), split ? kP1 : Device::cpu());
    norms.push_back(ops::to_vector<double>(ops::to_device(stats, Device::cpu()))[0]);
    std::vector<backend::Backend::AdamWTensors> list;
    for (size_t i = 0; i < g.size(); ++i)
      list.push_back({p[i],
                      g[i],
                      ops::zeros(p[i].shape(), DType::f32, p[i].device()),
                      ops::zeros(p[i].shape(), DType::f32, p[i].device()),
                      true,
                      {}});
    ops::fused_adamw(list, {1e-2, 0.1, 0.9, 0.999, 1e-8, 1}, {0.5, 1.0, stats});  // clipped: norm >> 1
    std::vector<Tensor> host;
    for (const Tensor& t : p) host.push_back(ops::to_device(t, Device::cpu()));
    after.push_back(host);
  }
  EXPECT_EQ(norms[0], norms[1]);  // bitwise, not near
  EXPECT_GT(norms[0], 1.0);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(ops::to_vector<float>(after[0][i]), ops::to_vector<float>(after[1][i])) << i;
    EXPECT_NE(ops::to_vector<float>(after[0][i]), ops::to_vector<float>(params[i])) << i;
  }
}

}  // namespace
}  // namespace tr
