// Golden parity with PyTorch (tools/make_golden.py, HF modeling code in plain torch): logits, loss, every
// parameter's gradient and the losses of 10 AdamW steps, for GPT-2 (tied), Llama (GQA, llama3 rope, untied)
// and Qwen2 (q/k/v biases, tied, linear rope); then save/reload and bit-exact continuation; config errors
// (the loss through the models: test_models_loss.cpp).
#include <cstring>
#include <filesystem>

#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "optim/adamw.h"
#include "test_util.h"

namespace tr {
namespace {

namespace fs = std::filesystem;
const std::string kGolden = TRAINER_GOLDEN_DIR;

// (golden model, attn_implementation)
class Golden : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  std::string name() const { return std::get<0>(GetParam()); }
  std::string dir() const { return kGolden + "/" + name(); }
  io::SafetensorsFile golden() const { return io::SafetensorsFile::open(dir() + "/golden.safetensors"); }
  std::unique_ptr<models::CausalLM> load(const std::string& d) const {
    models::PretrainedOptions po;
    po.attn_implementation = std::get<1>(GetParam());
    return models::from_pretrained(d, po);
  }
};

TEST_P(Golden, LogitsLossAndEveryGradientMatchPyTorch) {
  auto model = load(dir());
  auto g = golden();
  models::ForwardOptions o;
  o.labels = g.load("labels");
  auto out = model->forward(g.load("input_ids"), o);
  EXPECT_TRUE(test::all_close(out.logits, g.load("logits"), 1e-5, 1e-6)) << "logits";
  EXPECT_NEAR(out.loss.item(), g.load("loss").item(), 1e-5 * std::abs(g.load("loss").item()));
  autograd::backward({out.loss});
  int n = 0;
  for (auto& [name, p] : model->named_parameters()) {
    Tensor want = g.load("grad." + name);
    Tensor got = p->grad();
    ASSERT_TRUE(got.defined()) << name;
    if (model->transposed_on_disk(name)) got = ops::contiguous(ops::transpose(got, 0, 1));
    EXPECT_TRUE(test::all_close(got, want, 1e-4, 1e-6)) << "gradient of " << name;
    ++n;
  }
  EXPECT_GT(n, 10);
}

std::vector<double> train_steps(models::CausalLM& model, optim::AdamW& opt, const Tensor& ids,
                                const Tensor& labels, int steps) {
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    models::ForwardOptions o;
    o.labels = labels;
    o.return_logits = false;
    Tensor loss = model.forward(ids, o).loss;
    autograd::backward({loss});
    opt.step();
    losses.push_back(loss.item());
  }
  return losses;
}

optim::AdamWOptions adamw_opts() {
  optim::AdamWOptions a;
  a.lr = 3e-3;
  a.weight_decay = 0.01;
  return a;
}

TEST_P(Golden, TenAdamWStepsFollowPyTorchAndResumeBitExactly) {
  auto g = golden();
  const Tensor ids = g.load("input_ids"), labels = g.load("labels");
  auto want = test::values(g.load("adamw_losses"));
  auto model = load(dir());
  optim::AdamW opt(model->named_parameters(), adamw_opts());
  auto full = train_steps(*model, opt, ids, labels, 10);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(full[i], want[i], 2e-5 * std::abs(want[i])) << "step " << i;

  // 5 steps, save model + optimizer, reload both, 5 more: the losses equal the uninterrupted run bit for bit.
  const fs::path tmp = fs::temp_directory_path() /
                       ("trainer_resume_" + name() + std::get<1>(GetParam()) + std::to_string(::getpid()));
  auto m1 = load(dir());
  optim::AdamW o1(m1->named_parameters(), adamw_opts());
  auto first = train_steps(*m1, o1, ids, labels, 5);
  models::save_pretrained(*m1, tmp.string());
  io::save_safetensors((tmp / "optimizer.safetensors").string(), o1.state_dict());
  m1.reset();
  auto m2 = load(tmp.string());
  optim::AdamW o2(m2->named_parameters(), adamw_opts());
  std::map<std::string, Tensor> st;
  auto f = io::SafetensorsFile::open((tmp / "optimizer.safetensors").string());
  for (const auto& t : f.header().tensors) st[t.name] = f.load(t.name);
  o2.load_state_dict(st);
  auto second = train_steps(*m2, o2, ids, labels, 5);
  fs::remove_all(tmp);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(first[i], full[i]) << "step " << i;
    EXPECT_EQ(second[i], full[5 + i]) << "step " << 5 + i << " after reload";
  }
}

TEST_P(Golden, SaveThenLoadGivesIdenticalTensorsAlsoSharded) {
  auto model = load(dir());
  for (const char* shard : {"5GB", "20KB"}) {
    const fs::path tmp = fs::temp_directory_path() /
                         ("trainer_save_" + name() + std::get<1>(GetParam()) + std::to_string(::getpid()));
    models::save_pretrained(*model, tmp.string(), shard);
    EXPECT_EQ(fs::exists(tmp / "model.safetensors.index.json"), std::string(shard) == "20KB");
    // The saved files hold exactly the tensors of the original HF-layout checkpoint.
    io::CheckpointReader a(tmp.string()), b(dir());
    EXPECT_EQ(a.names(), b.names());
    for (const auto& n : b.names()) EXPECT_EQ(test::values(a.load(n)), test::values(b.load(n))) << n;
    auto again = models::from_pretrained(tmp.string());
    EXPECT_EQ(again->num_parameters(), model->num_parameters());
    EXPECT_EQ(again->num_parameters(), model->config().num_parameters());
    fs::remove_all(tmp);
  }
}

// A sharded run's set-up makes one parameter at a time: each is the tensor the whole model would hold (the
// fresh init's bits, the checkpoint's values in f32), and the placeholders hold no memory anywhere.
TEST_P(Golden, DeferredParametersAreTheWholeModelsOneAtATime) {
  const int64_t meta_before = meta_allocator().stats().current_bytes;
  auto d = models::deferred_pretrained(dir());
  EXPECT_EQ(meta_allocator().stats().current_bytes, meta_before);
  models::PretrainedOptions po;
  po.dtype = DType::f32;
  auto whole = models::from_pretrained(dir(), po);
  const auto want = whole->named_parameters();
  const auto placeholders = d.model->named_parameters();
  ASSERT_EQ(placeholders.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(placeholders[i].first, want[i].first);
    EXPECT_TRUE(placeholders[i].second->device().is_meta());
    const Tensor t = d.load(i);
    EXPECT_EQ(t.dtype(), DType::f32);
    EXPECT_TRUE(t.requires_grad());
    EXPECT_EQ(test::values(t), test::values(*want[i].second)) << want[i].first;
  }
  // Fresh: the generator's draws land where create_causal_lm's do, whatever order they are made in.
  Generator g1(7), g2(7);
  auto fresh = models::create_causal_lm(whole->config(), Device::cpu(), DType::f32, g1);
  auto lazy = models::deferred_causal_lm(whole->config(), Device::cpu(), g2);
  EXPECT_EQ(g1.state(), g2.state());
  const auto f = fresh->named_parameters();
  for (size_t i = f.size(); i-- > 0;)
    EXPECT_EQ(test::values(lazy.load(i)), test::values(*f[i].second)) << f[i].first;
}

INSTANTIATE_TEST_SUITE_P(Models, Golden,
                         ::testing::Combine(::testing::Values("gpt2_tied", "llama_gqa_llama3rope",
                                                              "qwen2_tied_linearrope", "qwen3_qknorm_untied"),
                                            ::testing::Values("eager", "sdpa", "flash_attention_2")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

// HF's mean_resizing: the old rows stay, the new ones sit at the old rows' mean with a spread of sqrt(1e-9)
// of theirs (the mean alone when the old rows cannot span a positive-definite covariance); an untied head
// grows the same way; the config says the new size and the model trains.
TEST(ResizeTokenEmbeddings, NewRowsFollowTheOldRowsMeanAsHfs) {
  for (const char* name : {"gpt2_tied", "llama_gqa_llama3rope"}) {
    auto model = models::from_pretrained(kGolden + "/" + name);
    std::map<std::string, std::vector<double>> before;
    for (const auto& [n, p] : model->named_parameters()) before[n] = test::values(*p);
    const int64_t old = model->config().vocab_size, D = model->config().hidden_size, V = old + 37;
    Generator gen(7);
    model->resize_token_embeddings(V, gen);
    EXPECT_EQ(model->config().vocab_size, V);
    EXPECT_EQ(model->config().to_json()["vocab_size"], V);
    int grown = 0;
    for (const auto& [n, p] : model->named_parameters()) {
      const auto now = test::values(*p);
      const auto& was = before.at(n);
      if (now.size() == was.size()) {
        EXPECT_EQ(now, was) << n;
        continue;
      }
      ++grown;
      ASSERT_EQ(now.size(), static_cast<size_t>(V * D)) << n;
      for (size_t i = 0; i < was.size(); ++i) ASSERT_EQ(now[i], was[i]) << n << " old element " << i;
      for (int64_t d = 0; d < D; ++d) {
        double mean = 0, spread = 0;
        for (int64_t r = 0; r < old; ++r) mean += was[static_cast<size_t>(r * D + d)];
        mean /= static_cast<double>(old);
        for (int64_t r = 0; r < old; ++r)
          spread = std::max(spread, std::abs(was[static_cast<size_t>(r * D + d)] - mean));
        for (int64_t r = old; r < V; ++r)
          ASSERT_NEAR(now[static_cast<size_t>(r * D + d)], mean, 1e-3 * spread + 1e-6) << n << " row " << r;
      }
    }
    EXPECT_EQ(grown, std::string(name) == "gpt2_tied" ? 1 : 2) << name;  // tied: one matrix; untied: two
    // More old rows than columns: each new row is a draw of its own (HF's multivariate normal), not the mean.
    const auto emb = test::values(*model->named_parameters().front().second);
    EXPECT_FALSE(std::equal(emb.begin() + (V - 1) * D, emb.begin() + V * D, emb.begin() + (V - 2) * D))
        << name;
    const Tensor ids = ops::from_vector<int64_t>({0, V - 1, 3, V - 2}, {1, 4});
    models::ForwardOptions fo;
    fo.labels = ids;
    EXPECT_TRUE(std::isfinite(model->forward(ids, fo).loss.item()));
  }
  // Fewer old rows than columns: HF's fallback, the mean exactly.
  nlohmann::json small = {{"model_type", "llama"},   {"vocab_size", 8},        {"hidden_size", 16},
                          {"intermediate_size", 16}, {"num_hidden_layers", 1}, {"num_attention_heads", 2}};
  Generator init(3), gen(4);
  auto m = models::create_causal_lm(models::ModelConfig::from_json(small, "small"), Device::cpu(), DType::f32,
                                    init);
  const auto was = test::values(*m->named_parameters().front().second);
  m->resize_token_embeddings(10, gen);
  const auto now = test::values(*m->named_parameters().front().second);
  for (int64_t d = 0; d < 16; ++d) {
    double mean = 0;
    for (int64_t r = 0; r < 8; ++r) mean += was[static_cast<size_t>(r * 16 + d)];
    EXPECT_EQ(now[static_cast<size_t>(9 * 16 + d)], static_cast<double>(static_cast<float>(mean / 8))) << d;
  }
  EXPECT_THROW(m->resize_token_embeddings(9, gen), Error);
}

TEST(ModelConfig, MissingAndContradictoryFieldsNameTheField) {
  auto expect = [](nlohmann::json j, const std::string& needle) {
    try {
      models::ModelConfig::from_json(j, "cfg.json");
      ADD_FAILURE() << "accepted: " << j.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
    }
  };
  nlohmann::json llama = {{"model_type", "llama"},   {"vocab_size", 10},       {"hidden_size", 8},
                          {"intermediate_size", 16}, {"num_hidden_layers", 1}, {"num_attention_heads", 2}};
  EXPECT_NO_THROW(models::ModelConfig::from_json(llama, "cfg.json"));
  auto without = [](nlohmann::json j, const char* k) {
    j.erase(k);
    return j;
  };
  auto with = [](nlohmann::json j, const char* k, nlohmann::json v) {
    j[k] = v;
    return j;
  };
  expect(without(llama, "hidden_size"), "missing field 'hidden_size'");
  expect(without(llama, "model_type"), "missing field 'model_type'");
  expect(with(llama, "model_type", "bert"), "model_type 'bert' is not supported");
  expect(with(llama, "num_key_value_heads", 3), "not a multiple of num_key_value_heads");
  expect(with(llama, "num_attention_heads", 3), "not divisible by num_attention_heads");
  expect(with(llama, "vocab_size", -5), "'vocab_size' must be positive");
  // Qwen3: head_dim defaults to Qwen3Config's 128 (not hidden / heads), q/k norms on, biases as configured.
  const auto q3 = models::ModelConfig::from_json(with(llama, "model_type", "qwen3"), "cfg.json");
  EXPECT_EQ(q3.head_dim, 128);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.attention_bias);
  EXPECT_FALSE(models::ModelConfig::from_json(llama, "cfg.json").qk_norm);
  expect(with(llama, "rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}), "low_freq_factor");
  expect(with(llama, "rope_scaling", {{"rope_type", "yarn"}, {"factor", 8.0}}), "rope_type 'yarn'");
  expect(with(llama, "hidden_act", "relu"), "hidden_act 'relu'");
  nlohmann::json gpt2 = {{"model_type", "gpt2"}, {"vocab_size", 10}, {"n_embd", 8},
                         {"n_layer", 1},         {"n_head", 3},      {"n_positions", 4}};
  expect(gpt2, "n_embd 8 is not divisible by n_head 3");
  EXPECT_EQ(models::ModelConfig::builtin("gpt2").num_parameters(), 124439808);  // GPT-2 small, as HF counts
  EXPECT_THROW(models::ModelConfig::builtin("gpt5"), Error);
}

TEST(Pretrained, BrokenFoldersFailClearly) {
  const fs::path tmp = fs::temp_directory_path() / ("trainer_broken_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  EXPECT_THROW(models::from_pretrained(tmp.string()), Error);  // no config.json
  fs::copy_file(kGolden + "/gpt2_tied/config.json", tmp / "config.json");
  // A checkpoint missing a tensor names it.
  auto f = io::SafetensorsFile::open(kGolden + "/gpt2_tied/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const auto& t : f.header().tensors)
    if (t.name != "transformer.ln_f.bias") ts.emplace_back(t.name, f.load(t.name));
  io::save_safetensors((tmp / "model.safetensors").string(), ts);
  try {
    models::from_pretrained(tmp.string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("transformer.ln_f.bias"), std::string::npos) << e.what();
  }
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// Run by tools/check_interop.sh: writes each golden model with save_pretrained (one file and sharded) into
// $TRAINER_INTEROP_DIR for the generator's own Python safetensors reader to compare.
TEST(Interop, DISABLED_WriteSavedModels) {
  const char* out = std::getenv("TRAINER_INTEROP_DIR");
  ASSERT_NE(out, nullptr) << "set TRAINER_INTEROP_DIR";
  for (const char* name :
       {"gpt2_tied", "llama_gqa_llama3rope", "qwen2_tied_linearrope", "qwen3_qknorm_untied"}) {
    auto model = models::from_pretrained(kGolden + "/" + name);
    models::save_pretrained(*model, std::string(out) + "/" + name);
    models::save_pretrained(*model, std::string(out) + "/" + name + "_sharded", "20KB");
  }
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// NEFTune (neftune_noise_alpha): HF's hook's uniform noise of half-width alpha / sqrt(T * hidden) on the
// token embeddings, each element its own draw from the step's generator (so resume and DDP shards follow the
// generator), a constant to autograd; only in training.
TEST(Neftune, UniformNoiseOnTheTokenEmbeddingsInTrainingOnly) {
  const int64_t B = 4, T = 32, D = 64;
  const double alpha = 5.0, mag = alpha / std::sqrt(static_cast<double>(T * D));
  Tensor e = test::randn({B, T, D}, 7);
  autograd::set_requires_grad(e, true);
  Generator gen(11), same(11);
  const Tensor out = models::neftune_noise(e, alpha, gen);
  const Tensor want = add(e, ops::rand({B, T, D}, same, DType::f32, Device::cpu(), -mag, mag));
  EXPECT_EQ(test::values(out), test::values(want));
  EXPECT_EQ(gen.state(), same.state());
  const std::vector<double> a = test::values(out), b = test::values(e);
  double total = 0, sq = 0, top = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double n = a[i] - b[i];
    total += n, sq += n * n, top = std::max(top, std::abs(n));
  }
  const double n = static_cast<double>(a.size());
  EXPECT_LE(top, mag * (1 + 1e-6));
  EXPECT_GT(top, 0.99 * mag);
  EXPECT_NEAR(total / n, 0.0, 4 * mag / std::sqrt(3 * n));   // the mean of U(-m, m): 0 +- 4 sigma
  EXPECT_NEAR(sq / n, mag * mag / 3, 0.05 * mag * mag / 3);  // its variance m^2 / 3
  autograd::backward({sum(out)});
  for (double g : test::values(e.grad())) ASSERT_EQ(g, 1.0);
  // In either model family: training forwards see noise, evaluations do not.
  const nlohmann::json llama = {{"model_type", "llama"},  {"vocab_size", 64},
                                {"hidden_size", D},       {"intermediate_size", 64},
                                {"num_hidden_layers", 1}, {"num_attention_heads", 4}};
  const nlohmann::json gpt2 = {{"model_type", "gpt2"}, {"vocab_size", 64},  {"n_embd", D},
                               {"n_layer", 1},         {"n_head", 4},       {"n_positions", 16},
                               {"resid_pdrop", 0.0},   {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0}};
  for (const auto& cfg : {llama, gpt2}) {
    Generator init(3);
    auto m =
        models::create_causal_lm(models::ModelConfig::from_json(cfg, "cfg"), Device::cpu(), DType::f32, init);
    const Tensor ids = ops::from_vector<int64_t>({1, 5, 9, 13, 2, 6, 10, 14}, {2, 4});
    const auto loss = [&](bool training, double a) {
      autograd::NoGradGuard ng;
      Generator g(5);
      models::ForwardOptions fo;
      fo.labels = ids;
      fo.training = training;
      fo.dropout_gen = &g;
      fo.neftune_noise_alpha = a;
      return m->forward(ids, fo).loss.item();
    };
    EXPECT_NE(loss(true, 15.0), loss(true, 0.0)) << cfg.dump();
    EXPECT_EQ(loss(true, 0.0), loss(false, 0.0)) << cfg.dump();  // no dropout: training alone changes nothing
    EXPECT_EQ(loss(false, 15.0), loss(false, 0.0)) << cfg.dump();
  }
}

}  // namespace
}  // namespace tr

#include "models/generate.h"

namespace tr {
namespace {

class Generation : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Generation, KvCacheMatchesFullRecompute) {
  models::PretrainedOptions po;
  po.attn_implementation = std::get<1>(GetParam());
  auto model = models::from_pretrained(kGolden + "/" + std::get<0>(GetParam()), po);
  Tensor prompt = ops::from_vector<int64_t>({5, 9, 2, 7, 1, 3}, {2, 3});
  models::GenerateOptions g;
  g.max_new_tokens = 6;
  Tensor with_cache = models::generate(*model, prompt, g);
  g.use_cache = false;
  Tensor without = models::generate(*model, prompt, g);
  EXPECT_EQ(with_cache.shape(), (Shape{2, 9}));
  EXPECT_EQ(test::values(with_cache), test::values(without));
  // Step logits: incremental decoding against the full forward over the same tokens.
  NoGradGuard ng;
  models::KVCache cache;
  models::ForwardOptions fo;
  fo.cache = &cache;
  model->forward(ops::contiguous(ops::narrow(with_cache, 1, 0, 5)), fo);
  Tensor inc = model->forward(ops::contiguous(ops::narrow(with_cache, 1, 5, 4)), fo).logits;
  Tensor full = model->forward(with_cache).logits;
  EXPECT_TRUE(test::all_close(inc, ops::narrow(full, 1, 5, 4), 1e-5, 1e-6));
  EXPECT_EQ(cache.length, 9);
}

INSTANTIATE_TEST_SUITE_P(Models, Generation,
                         ::testing::Combine(::testing::Values("gpt2_tied", "llama_gqa_llama3rope"),
                                            ::testing::Values("eager", "sdpa")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

// Mistral's sliding_window (HF: key > query - window): with one layer, a token changes the logits of the
// window's positions only; sdpa (the fused kernel, attention dropout inside it) equals eager's
// band mask in loss and every gradient; incremental decoding past the window equals the full forward; a
// window as long as the sequence is plain causal attention. Qwen2's max_window_layers keeps the first
// layers full.
std::unique_ptr<models::CausalLM> windowed(const std::string& type, int64_t layers, int64_t window,
                                           double attn_dropout = 0.0) {
  nlohmann::json j = {{"model_type", type},
                      {"vocab_size", 50},
                      {"hidden_size", 16},
                      {"intermediate_size", 32},
                      {"num_hidden_layers", layers},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"max_position_embeddings", 32},
                      {"attention_dropout", attn_dropout}};
  if (window > 0) j["sliding_window"] = window;  // 0: none (HF's null)
  if (type == "qwen2") {
    j["use_sliding_window"] = true;
    j["max_window_layers"] = 1;
  }
  Generator init(11);
  return models::create_causal_lm(models::ModelConfig::from_json(j, "sliding.json"), Device::cpu(),
                                  DType::f32, init);
}

TEST(SlidingWindow, MasksKeysOutsideTheWindowInEveryAttentionImplementation) {
  const Tensor ids = ops::from_vector<int64_t>({3, 17, 5, 9, 41, 2, 8, 30, 12, 7, 1, 44}, {1, 12});
  {  // one layer: position t sees tokens t - 2 .. t
    NoGradGuard ng;
    for (const char* impl : {"eager", "sdpa"}) {
      auto m = windowed("mistral", 1, 3);
      m->set_attn_implementation(impl);
      Tensor other = ops::from_vector<int64_t>({25, 17, 5, 9, 41, 2, 8, 30, 12, 7, 1, 44}, {1, 12});
      const auto a = test::values(m->forward(ids).logits), b = test::values(m->forward(other).logits);
      for (int64_t t = 0; t < 12; ++t) {
        bool same = true;
        for (int64_t v = 0; v < 50; ++v)
          same = same && a[static_cast<size_t>(t * 50 + v)] == b[static_cast<size_t>(t * 50 + v)];
        EXPECT_EQ(same, t >= 3) << impl << " position " << t;
      }
    }
  }
  const auto loss_and_grads = [&](models::CausalLM& m, const char* impl, Generator* drop) {
    m.set_attn_implementation(impl);
    models::ForwardOptions fo;
    fo.labels = ids;
    fo.training = drop != nullptr;
    fo.dropout_gen = drop;
    Tensor loss = m.forward(ids, fo).loss;
    autograd::backward({loss});
    std::vector<Tensor> g;
    for (auto& [name, p] : m.named_parameters()) {
      g.push_back(ops::contiguous(p->grad()));
      autograd::zero_grad(*p);
    }
    return std::make_pair(loss.item(), g);
  };
  for (const std::string type : {"mistral", "qwen2"}) {
    for (double p : {0.0, 0.25}) {  // attention dropout: drawn inside sdpa's kernel as eager's
      SCOPED_TRACE(type + " attention_dropout " + std::to_string(p));
      auto m = windowed(type, 2, 3, p);
      Generator g1(5), g2(5);
      const auto [le, ge] = loss_and_grads(*m, "eager", p > 0 ? &g1 : nullptr);
      const auto [ls, gs] = loss_and_grads(*m, "sdpa", p > 0 ? &g2 : nullptr);
      EXPECT_NEAR(le, ls, 1e-5 * std::abs(le));
      for (size_t i = 0; i < ge.size(); ++i) EXPECT_TRUE(test::all_close(gs[i], ge[i], 1e-4, 1e-6)) << i;
      // The window changes the result (it is applied), and one as long as the sequence is plain causal.
      auto wide = windowed(type, 2, 12, p), causal = windowed(type, 2, 0, p);
      Generator g3(5), g4(5);
      const double lw = loss_and_grads(*wide, "sdpa", p > 0 ? &g3 : nullptr).first;
      const double lc = loss_and_grads(*causal, "sdpa", p > 0 ? &g4 : nullptr).first;
      EXPECT_EQ(lw, lc);
      EXPECT_GT(std::abs(ls - lc), 1e-6);
    }
  }
  // Incremental decoding past the window: the cached keys beyond it are masked as in the full forward.
  for (const char* impl : {"eager", "sdpa"}) {
    NoGradGuard ng;
    auto m = windowed("mistral", 2, 3);
    m->set_attn_implementation(impl);
    models::KVCache cache;
    models::ForwardOptions fo;
    fo.cache = &cache;
    m->forward(ops::contiguous(ops::narrow(ids, 1, 0, 7)), fo);
    Tensor inc = m->forward(ops::contiguous(ops::narrow(ids, 1, 7, 5)), fo).logits;
    Tensor full = m->forward(ids).logits;
    EXPECT_TRUE(test::all_close(inc, ops::narrow(full, 1, 7, 5), 1e-5, 1e-6)) << impl;
  }
}

TEST(Generation, SamplingRules) {
  std::vector<double> logits = {1.0, 3.0, 2.0, -1.0};
  models::GenerateOptions g;
  EXPECT_EQ(models::choose_token(logits, g, 0.99), 1);  // greedy
  g.do_sample = true;
  g.top_k = 1;
  EXPECT_EQ(models::choose_token(logits, g, 0.99), 1);
  g.top_k = 2;  // tokens 1 and 2 only
  for (double u : {0.0, 0.5, 0.999}) {
    int64_t t = models::choose_token(logits, g, u);
    EXPECT_TRUE(t == 1 || t == 2);
  }
  g.top_k = 0;
  g.top_p = 0.5;  // token 1 alone holds > 50%
  EXPECT_EQ(models::choose_token(logits, g, 0.999), 1);
  g.top_p = 1.0;
  g.temperature = 1e-3;  // nearly greedy
  EXPECT_EQ(models::choose_token(logits, g, 0.7), 1);
  g.temperature = 1.0;
  // the empirical distribution follows softmax
  std::vector<int> count(4, 0);
  for (int i = 0; i < 20000; ++i) count[models::choose_token(logits, g, (i + 0.5) / 20000)]++;
  double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(-1.0);
  EXPECT_NEAR(count[1] / 20000.0, std::exp(3.0) / z, 1e-3);
  EXPECT_NEAR(count[3] / 20000.0, std::exp(-1.0) / z, 1e-3);
  g.temperature = 0;
  EXPECT_THROW(models::choose_token(logits, g, 0.5), Error);
}

TEST(Padding, LeftAndRightPaddedRowsMatchTheUnpaddedSequence) {
  for (const char* impl : {"eager", "sdpa"}) {
    models::PretrainedOptions po;
    po.attn_implementation = impl;
    auto model = models::from_pretrained(kGolden + "/llama_gqa_llama3rope", po);
    NoGradGuard ng;
    Tensor alone = model->forward(ops::from_vector<int64_t>({4, 8, 15, 16}, {1, 4})).logits;
    // right padding: positions are unchanged, the pad keys are masked
    models::ForwardOptions o;
    o.attention_mask = ops::from_vector<int64_t>({1, 1, 1, 1, 0, 0}, {1, 6});
    Tensor right = model->forward(ops::from_vector<int64_t>({4, 8, 15, 16, 0, 0}, {1, 6}), o).logits;
    EXPECT_TRUE(test::all_close(ops::narrow(right, 1, 0, 4), alone, 1e-5, 1e-6)) << impl;
    // left padding shifts positions (as in HF without explicit position_ids), so compare two left-padded rows
    // that differ only in their pad tokens: masked keys must change nothing.
    o.attention_mask = ops::from_vector<int64_t>({0, 0, 1, 1, 1, 1}, {1, 6});
    Tensor l1 = model->forward(ops::from_vector<int64_t>({0, 0, 4, 8, 15, 16}, {1, 6}), o).logits;
    Tensor l2 = model->forward(ops::from_vector<int64_t>({7, 3, 4, 8, 15, 16}, {1, 6}), o).logits;
    EXPECT_TRUE(test::all_close(ops::narrow(l1, 1, 2, 4), ops::narrow(l2, 1, 2, 4), 1e-6, 1e-7)) << impl;
  }
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

TEST(GradientCheckpointing, ModelGradientsAreIdenticalWithAndWithoutIt) {
  for (const char* name : {"gpt2_tied", "llama_gqa_llama3rope"}) {
    auto g = io::SafetensorsFile::open(kGolden + "/" + name + "/golden.safetensors");
    std::vector<std::vector<double>> grads[2];
    for (int ck = 0; ck < 2; ++ck) {
      auto m = models::from_pretrained(kGolden + "/" + name);
      models::ForwardOptions o;
      o.labels = g.load("labels");
      o.gradient_checkpointing = ck == 1;
      o.return_logits = false;
      autograd::backward({m->forward(g.load("input_ids"), o).loss});
      for (auto& [n, p] : m->named_parameters()) grads[ck].push_back(test::values(p->grad()));
    }
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i)
      EXPECT_EQ(grads[0][i], grads[1][i]) << name << " parameter " << i;
  }
}

}  // namespace
}  // namespace tr
