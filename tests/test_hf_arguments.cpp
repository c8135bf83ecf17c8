// HF's arguments beyond the guide's knobs: an HF TrainingArguments dump (every field of transformers 5.2,
// and run_clm's) loads as our defaults; the fields we do not have are refused with the reason when they are
// not at HF's default; data_seed, max_train_samples / max_eval_samples and num_input_tokens_seen in a run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "models/config.h"
#include "ops/ops.h"
#include "train/trainer.h"
#include "train/zero3.h"
#include "train_scratch.h"
#include "test_util.h"

namespace tr {
namespace {

namespace fs = std::filesystem;

using test::error_of;

nlohmann::json hf_dump() {
  std::ifstream in(std::string(TRAINER_SOURCE_DIR) + "/tests/data/hf_training_args_5_2.json");
  return nlohmann::json::parse(in);
}

TEST(HfArguments, AFullDumpOfHfsDefaultsLoadsAsOurs) {
  train::TrainingArguments a;
  a.update_from_json(hf_dump(), "hf_args.json");
  nlohmann::json got = a.to_json(), want = train::TrainingArguments().to_json();
  // The three fields whose HF default differs from ours, as the dump gives them.
  EXPECT_EQ(got["output_dir"], "trainer_output");
  EXPECT_EQ(got["optim"], "adamw_torch_fused");
  EXPECT_EQ(
      got["fsdp_config"],
      (nlohmann::json{
           {"min_num_params", 0}, {"xla", false}, {"xla_fsdp_v2", false}, {"xla_fsdp_grad_ckpt", false}})
          .dump());
  for (const char* k : {"output_dir", "optim", "fsdp_config"}) got.erase(k), want.erase(k);
  EXPECT_EQ(got, want);
  // It validates as a run, and HF's fsdp_config dict reads as options (the XLA keys at their defaults).
  a.config_name = "gpt2";
  a.train_file = "t.txt";
  EXPECT_NO_THROW(a.validate());
  EXPECT_NO_THROW(train::read_fsdp_config(a.fsdp_config));
}

TEST(HfArguments, FieldsWeDoNotHaveAreRefusedWithTheReason) {
  const auto refused = [](const nlohmann::json& j) {
    return error_of([&] { train::TrainingArguments().update_from_json(j, "hf_args.json"); });
  };
  EXPECT_EQ(
      refused({{"push_to_hub", true}}),
      "hf_args.json: 'push_to_hub': true is not supported here (the Hugging Face Hub needs the network and "
      "Python's huggingface_hub; upload output_dir with `huggingface-cli upload` or git); only HF's "
      "default, false, is accepted");
  EXPECT_NE(refused({{"fp16_opt_level", "O2"}}).find("apex AMP's levels"), std::string::npos);
  EXPECT_NE(refused({{"use_liger_kernel", true}}).find("--torch_compile fuses our own"), std::string::npos);
  EXPECT_NE(
      refused({{"accelerator_config", {{"split_batches", true}}}}).find("accelerate is a Python library"),
      std::string::npos);
  EXPECT_NE(refused({{"fsdp", {"full_shard", 3}}}).find("'fsdp'[1]: expected a string"), std::string::npos);
  EXPECT_NE(refused({{"no_such_field", 1}}).find("unknown argument 'no_such_field'"), std::string::npos);
  EXPECT_EQ(refused({{"accelerator_config", {{"even_batches", true}}}, {"debug", ""}, {"local_rank", -1}}),
            "(no error)");
  // HF's list and dict forms.
  train::TrainingArguments a;
  a.update_from_json({{"fsdp", {"full_shard", "offload"}},
                      {"lr_scheduler_kwargs", {{"min_lr_rate", 0.1}}},
                      {"include_num_input_tokens_seen", true},
                      {"gradient_checkpointing_kwargs", {{"use_reentrant", false}}}},
                     "hf_args.json");
  EXPECT_EQ(a.fsdp, "full_shard offload");
  a.update_from_json({{"label_smoothing_factor", 0.1}}, "hf_args.json");  // HF's LabelSmoother epsilon
  EXPECT_EQ(a.label_smoothing_factor, 0.1);
  a.label_smoothing_factor = 1.5;
  EXPECT_EQ(error_of([&] { a.validate_optimizer(); }),
            "--label_smoothing_factor 1.5: expected 0 to 1 (0: no smoothing)");
  a.label_smoothing_factor = 0;
  a.update_from_json({{"neftune_noise_alpha", nullptr}}, "hf_args.json");  // HF's None: off
  EXPECT_EQ(a.neftune_noise_alpha, 0.0);
  a.update_from_json({{"neftune_noise_alpha", 5.0}}, "hf_args.json");
  EXPECT_EQ(a.neftune_noise_alpha, 5.0);
  a.neftune_noise_alpha = -1;
  EXPECT_NE(error_of([&] {
              a.validate_optimizer();
            }).find("--neftune_noise_alpha -1: expected a finite number >= 0"),
            std::string::npos);
  a.neftune_noise_alpha = 0;
  EXPECT_EQ(a.include_num_input_tokens_seen, "all");
  EXPECT_EQ(a.to_json()["lr_scheduler_kwargs"], (nlohmann::json{{"min_lr_rate", 0.1}}));
  EXPECT_EQ(a.to_json()["gradient_checkpointing_kwargs"], (nlohmann::json{{"use_reentrant", false}}));
}

TEST(HfArguments, TheirRangesAndHfsOwnChecks) {
  train::TrainingArguments a;
  a.output_dir = "o";
  a.config_name = "gpt2";
  a.train_file = "t";
  const auto check = [&](auto&& set, const std::string& want) {
    train::TrainingArguments b = a;
    set(b);
    EXPECT_NE(error_of([&] { b.validate(); }).find(want), std::string::npos) << want;
  };
  check([](auto& b) { b.dataloader_prefetch_factor = 4; },
        "can only be set when data is loaded in a different");
  check([](auto& b) { b.include_num_input_tokens_seen = "some"; }, "is not one of no, all, non_padding");
  check([](auto& b) { b.gradient_checkpointing_kwargs = R"({"context_fn": 1})"; },
        "expected use_reentrant or");
  check([](auto& b) { b.save_safetensors = false; }, "weights are saved as safetensors only");
  check([](auto& b) { b.max_train_samples = -3; }, "--max_train_samples -3");
  check([](auto& b) { b.log_level = "verbose"; }, "--log_level 'verbose' is not one of");
  check([](auto& b) { b.do_train = false; }, "trainer train always trains");
  check([](auto& b) { b.metric_for_best_model = "eval_runtime"; }, "expected loss or perplexity");
  check(
      [](auto& b) {
        b.ignore_data_skip = true;
        b.save_strategy = "epoch";
      },
      "--ignore_data_skip restarts the resumed epoch's batches");
  a.dataloader_num_workers = 2;
  a.dataloader_prefetch_factor = 4;
  EXPECT_NO_THROW(a.validate());
}

// The first micro-batch's token ids of a 1-step run.
std::vector<int64_t> first_batch(const train::TrainingArguments& a) {
  std::vector<int64_t> ids;
  train::TrainHooks h;
  h.on_micro_batch = [&](int64_t step, const Tensor& t) {
    if (step != 0 || !ids.empty()) return;
    for (double v : ops::to_vector<double>(t)) ids.push_back(static_cast<int64_t>(v));
  };
  train::train(a, h);
  return ids;
}

TEST(HfArguments, DataSeedAloneSetsTheDataOrder) {
  Scratch s("hf_data_seed");
  auto a = s.args("a");
  a.max_steps = 1;
  a.seed = 1;
  a.data_seed = 5;
  const auto base = first_batch(a);
  a.output_dir = (s.dir / "b").string();
  a.seed = 2;  // another initialization, the same data order
  EXPECT_EQ(first_batch(a), base);
  a.output_dir = (s.dir / "c").string();
  a.seed = 1;
  a.data_seed = -1;  // the order from --seed 1
  EXPECT_NE(first_batch(a), base);
}

TEST(HfArguments, IgnoreDataSkipRestartsTheEpochsBatches) {
  Scratch s("hf_ignore_skip");
  auto a = s.args("out");
  a.max_steps = 4;
  a.save_steps = 2;
  std::vector<std::vector<int64_t>> first_run(4), resumed(4);
  const auto record = [](std::vector<std::vector<int64_t>>& into) {
    train::TrainHooks h;
    h.on_micro_batch = [&into](int64_t step, const Tensor& t) {
      for (double v : ops::to_vector<double>(t))
        into[static_cast<size_t>(step)].push_back(static_cast<int64_t>(v));
    };
    return h;
  };
  train::train(a, record(first_run));
  a.resume_from_checkpoint = (fs::path(a.output_dir) / "checkpoint-2").string();
  a.ignore_data_skip = true;
  train::train(a, record(resumed));
  EXPECT_EQ(resumed[2], first_run[0]) << "the epoch's data starts over";
  EXPECT_EQ(resumed[3], first_run[1]);
  EXPECT_TRUE(resumed[0].empty());
}

TEST(HfArguments, SampleLimitsAndInputTokensSeen) {
  Scratch s("hf_samples");
  auto a = s.args("out");
  a.max_steps = -1;
  a.num_train_epochs = 1;
  a.max_train_samples = 10;  // blocks: 3 batches of 4 (the last of 2) make the epoch
  a.max_eval_samples = 5;
  a.do_eval = true;
  a.include_num_input_tokens_seen = "all";
  const auto r = train::train(a);
  EXPECT_EQ(r.global_step, 3);
  EXPECT_EQ(r.evals.back().samples, 5);
  std::ifstream in(fs::path(a.output_dir) / "metrics.jsonl");
  std::vector<int64_t> seen;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) seen.push_back(j.at("num_input_tokens_seen").get<int64_t>());
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{4 * 32, 8 * 32, 10 * 32}));
  const auto state =
      nlohmann::json::parse(std::ifstream(fs::path(a.output_dir) / "checkpoint-3" / "trainer_state.json"));
  EXPECT_EQ(state["num_input_tokens_seen"], 10 * 32);
}

TEST(HfArguments, ModelTypeIsHfsConfigClassAndOverridesAreTyped) {
  // GPT2Config() is GPT-2 124M; LlamaConfig() the 6.7B Llama (its published count).
  EXPECT_EQ(models::ModelConfig::from_json(models::hf_default_config("gpt2"), "gpt2").num_parameters(),
            models::ModelConfig::builtin("gpt2").num_parameters());
  EXPECT_EQ(models::ModelConfig::from_json(models::hf_default_config("llama"), "llama").num_parameters(),
            6738415616);
  nlohmann::json j = models::hf_default_config("gpt2");
  models::apply_config_overrides(j,
                                 "n_embd=256,n_layer=4,resid_pdrop=0,scale_attn_weights=no,"
                                 "activation_function=gelu");
  EXPECT_EQ(j["n_embd"], 256);
  EXPECT_TRUE(j["n_embd"].is_number_integer());
  EXPECT_EQ(j["resid_pdrop"], 0.0);
  EXPECT_TRUE(j["resid_pdrop"].is_number_float());
  EXPECT_EQ(j["scale_attn_weights"], false);
  EXPECT_EQ(j["activation_function"], "gelu");
  // HF's hasattr sees GPT2Config's attribute_map names, and its bools read in any case.
  models::apply_config_overrides(j, "hidden_size=128,num_hidden_layers=3,tie_word_embeddings=False");
  EXPECT_EQ(j["n_embd"], 128);
  EXPECT_EQ(j["n_layer"], 3);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  const auto refused = [](const std::string& overrides) {
    return error_of([&] {
      nlohmann::json c = models::hf_default_config("gpt2");
      models::apply_config_overrides(c, overrides);
    });
  };
  EXPECT_NE(
      refused("n_embed=256").find("key n_embed isn't in the original config dict (did you mean 'n_embd'?)"),
      std::string::npos);
  EXPECT_NE(refused("n_layer=4.5").find("n_layer=4.5: expected an integer"), std::string::npos);
  EXPECT_NE(refused("use_cache=maybe").find("can't derive true or false from 'maybe'"), std::string::npos);
  EXPECT_NE(refused("n_inner=3072").find("only int, float, bool or string values can be updated"),
            std::string::npos);
  EXPECT_NE(refused("n_layer").find("is not key=value"), std::string::npos);
  EXPECT_NE(error_of([] { models::hf_default_config("gpt3"); }).find("expected gpt2 or llama"),
            std::string::npos);
  // One source of the model; overrides only with model_type (HF's rule).
  train::TrainingArguments a;
  a.output_dir = "o";
  a.train_file = "t";
  a.model_type = "gpt2";
  a.config_overrides = "n_layer=2";
  EXPECT_NO_THROW(a.validate());
  a.config_name = "gpt2";
  EXPECT_NE(error_of([&] { a.validate(); }).find("give exactly one of"), std::string::npos);
  a.model_type.clear();
  EXPECT_NE(error_of([&] { a.validate(); }).find("--config_overrides can't be used in combination"),
            std::string::npos);
}

}  // namespace
}  // namespace tr
