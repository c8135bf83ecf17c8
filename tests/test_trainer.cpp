// The Trainer's features end to end on tiny models: args files and flag suggestions, accumulation with
// padding, evaluation, mixed precision (bf16, fp16 loss scaling and skipped steps), every optimizer,
// torch_empty_cache_steps, auto_find_batch_size, gradient checkpointing memory, crash-safe saves, bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>
#include <fstream>
#include <limits>

#include "autograd/node.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/half.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "optim/optimizer.h"
#include "test_util.h"
#include "train_scratch.h"
#include "train/trainer.h"

namespace tr {
namespace {

namespace fs = std::filesystem;

std::vector<nlohmann::json> read_metrics(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::ifstream in(fs::path(out) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) v.push_back(nlohmann::json::parse(line));
  return v;
}

TEST(TrainerArgs, JsonFileFlagsAndSuggestions) {
  train::TrainingArguments a;
  a.update_from_json({{"learning_rate", 3e-4},
                      {"bf16", true},
                      {"max_steps", 100},
                      {"optim", "sgd"},
                      {"resume_from_checkpoint", true},
                      {"torch_empty_cache_steps", nullptr}},
                     "args.json");
  EXPECT_EQ(a.learning_rate, 3e-4);
  EXPECT_TRUE(a.bf16);
  EXPECT_EQ(a.max_steps, 100);
  EXPECT_EQ(a.optim, "sgd");
  EXPECT_EQ(a.resume_from_checkpoint, "true");
  auto error_of = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(error_of([&] {
              a.update_from_json({{"learning_rat", 1.0}}, "args.json");
            }),
            "args.json: unknown argument 'learning_rat' (did you mean 'learning_rate'?)");
  EXPECT_EQ(error_of([&] {
              a.update_from_json({{"max_steps", "ten"}}, "args.json");
            }),
            "args.json: 'max_steps' has the wrong type (string): expected an integer");
  // The round trip through training_args.json is lossless.
  train::TrainingArguments b;
  b.update_from_json(a.to_json(), "training_args.json");
  EXPECT_EQ(b.to_json(), a.to_json());
  train::TrainingArguments c;
  c.output_dir = "o";
  c.config_name = "gpt2";
  c.train_file = "t";
  c.optim = "adamw_torh";
  EXPECT_NE(error_of([&] { c.validate(); }).find("(did you mean 'adamw_torch'?)"), std::string::npos);
  c.optim = "adamw_torch";
  c.lr_scheduler_type = "cosin";
  EXPECT_NE(error_of([&] { c.validate(); }).find("(did you mean 'cosine'?)"), std::string::npos);
  c.lr_scheduler_type = "linear";
  c.fp16 = c.bf16 = true;
  EXPECT_NE(error_of([&] { c.validate(); }).find("--fp16 and --bf16 are mutually exclusive"),
            std::string::npos);
}

// --tf32 is HF's Optional[bool]: unset is null in training_args.json and means off, except that compile turns
// TF32 on for a GPU run without fp16; a given value always wins.
TEST(TrainerArgs, Tf32IsAnOptionalBoolThatCompileTurnsOnForAGpu) {
  const Device cpu = Device::cpu(), gpu = Device::cuda(0);
  train::TrainingArguments a;
  EXPECT_TRUE(a.to_json()["tf32"].is_null());
  EXPECT_FALSE(a.tf32_on(cpu));
  EXPECT_FALSE(a.tf32_on(gpu));
  a.torch_compile = true;
  EXPECT_TRUE(a.tf32_on(gpu));
  EXPECT_FALSE(a.tf32_on(cpu));  // the CPU only emulates TF32: compile leaves it off
  a.fp16 = true;
  EXPECT_FALSE(a.tf32_on(gpu));
  a.fp16 = false;
  train::TrainingArguments m;  // a mode alone turns compile on, and with it TF32
  m.torch_compile_mode = "reduce-overhead";
  EXPECT_TRUE(m.tf32_on(gpu));
  a.update_from_json({{"tf32", false}}, "args.json");
  EXPECT_FALSE(a.tf32_on(gpu));
  EXPECT_EQ(a.to_json()["tf32"], false);
  a.update_from_json({{"tf32", nullptr}}, "args.json");  // HF's None keeps what is set
  EXPECT_EQ(a.to_json()["tf32"], false);
  train::TrainingArguments b;
  b.update_from_json({{"tf32", true}}, "training_args.json");
  EXPECT_TRUE(b.tf32_on(cpu));
  EXPECT_TRUE(b.tf32_on(gpu));
  train::TrainingArguments c;  // round trips: unset stays unset
  c.update_from_json(train::TrainingArguments().to_json(), "training_args.json");
  EXPECT_FALSE(c.tf32.has_value());
  EXPECT_THROW(c.update_from_json({{"tf32", "yes"}}, "args.json"), Error);
}

// What each torch_compile backend and mode adds to the planned replay: inductor fuses; inductor, cudagraphs
// and aot_cudagraphs replay as CUDA graphs unless the mode says no cudagraphs; the two max-autotune modes
// time GEMM candidates; the debugging backends do neither; nothing without compile.
TEST(TrainerArgs, CompileBackendsAndModesChooseFusionGraphsAndAutotuning) {
  struct Row {
    const char* backend;
    const char* mode;
    bool fuses, graphs, autotunes;
  };
  for (const Row r :
       {Row{"inductor", "", true, true, false}, Row{"inductor", "reduce-overhead", true, true, false},
        Row{"inductor", "max-autotune", true, true, true},
        Row{"inductor", "max-autotune-no-cudagraphs", true, false, true},
        Row{"cudagraphs", "", false, true, false}, Row{"aot_cudagraphs", "", false, true, false},
        Row{"aot_eager", "", false, false, false}, Row{"eager", "max-autotune", false, false, true}}) {
    train::TrainingArguments a;
    a.torch_compile_backend = r.backend;
    a.torch_compile_mode = r.mode;
    a.apply_compile_defaults();
    EXPECT_EQ(a.compile_fuses(), r.fuses) << r.backend << " " << r.mode;
    EXPECT_EQ(a.compile_device_graphs(), r.graphs) << r.backend << " " << r.mode;
    EXPECT_EQ(a.compile_autotunes(), r.autotunes) << r.backend << " " << r.mode;
  }
  const train::TrainingArguments off;
  EXPECT_FALSE(off.compile_fuses() || off.compile_device_graphs() || off.compile_autotunes());
}

TEST(TrainerArgs, TheFlagReferenceIsGeneratedFromTheTable) {
  std::ifstream in(std::string(TRAINER_SOURCE_DIR) + "/docs/FLAGS.md");
  std::stringstream doc;
  doc << in.rdbuf();
  EXPECT_EQ(doc.str(), train::flags_markdown()) << "regenerate: build/release/trainer flags > docs/FLAGS.md";
  for (const auto& n : train::argument_names())
    EXPECT_NE(doc.str().find("`--" + n + "`"), std::string::npos) << n;
}

TEST(TrainerLoss, AccumulationWithPaddingEqualsOneBigBatch) {
  // Two micro-batches padded differently (-100 labels) normalized by the label tokens of the whole step give
  // the gradient of one big batch holding both.
  Scratch s("trainer_accum");
  Generator g(1);
  auto model = models::create_causal_lm(models::ModelConfig::from_file((s.dir / "config.json").string()),
                                        Device::cpu(), DType::f64, g);
  auto ids = [](std::vector<int64_t> v, int64_t B) {
    return ops::from_vector<int64_t>(v, {B, static_cast<int64_t>(v.size()) / B});
  };
  Tensor x1 = ids({5, 9, 13, 17, 21, 25, 29, 33, 1, 2, 3, 4, 6, 7, 8, 10}, 2);
  Tensor l1 = ids({5, 9, 13, 17, -100, -100, -100, -100, 1, 2, 3, 4, 6, 7, -100, -100}, 2);
  Tensor x2 = ids({40, 41, 42, 43, 44, 45, 46, 47}, 1);
  Tensor l2 = ids({40, 41, 42, 43, 44, 45, 46, -100}, 1);
  const double items = static_cast<double>(train::count_label_tokens(l1) + train::count_label_tokens(l2));
  EXPECT_EQ(items, 3 + 5 + 6);
  auto params = model->named_parameters();
  for (auto [x, l] : {std::pair{x1, l1}, std::pair{x2, l2}}) {
    models::ForwardOptions fo;
    fo.labels = l;
    fo.num_items_in_batch = items;
    autograd::backward({model->forward(x, fo).loss});
  }
  std::vector<Tensor> accumulated;
  for (auto& [n, p] : params) {
    accumulated.push_back(ops::contiguous(p->grad()));
    autograd::zero_grad(*p);
  }
  models::ForwardOptions fo;
  fo.labels = ops::cat({l1, l2}, 0);
  autograd::backward({model->forward(ops::cat({x1, x2}, 0), fo).loss});  // mean over the 14 label tokens
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(test::all_close(accumulated[i], params[i].second->grad(), 1e-10, 1e-13)) << params[i].first;
}

// `trainer eval`'s arguments for the final model of run `a`, writing into `out`.
train::TrainingArguments eval_args_of(const train::TrainingArguments& a, const fs::path& out) {
  train::TrainingArguments e = a;
  e.model_name_or_path = a.output_dir;
  e.config_name.clear();
  e.output_dir = out.string();
  return e;
}

// label_smoothing_factor: the smoothed loss normalized by the label tokens of the whole step (HF's
// LabelSmoother given num_items_in_batch, transformers#47261): two micro-batches of 2 train as one batch of
// 4 (packed blocks hold equal label counts; unequal ones are test_models' Loss.LabelSmoothing...); the loss
// and the eval_loss are the smoothed ones (HF's prediction_step runs the same compute_loss),
// `trainer eval` with the factor gives the run's eval_loss again.
TEST(TrainerLoss, LabelSmoothingTrainsAccumulatesAndEvaluatesSmoothed) {
  Scratch s("trainer_smoothing");
  auto a = s.args("one_batch");
  a.max_steps = 4;
  a.per_device_train_batch_size = 4;
  a.label_smoothing_factor = 0.1;
  a.do_eval = true;
  const auto one = train::train(a);
  auto b = a;
  b.output_dir = (s.dir / "accumulated").string();
  b.per_device_train_batch_size = 2;
  b.gradient_accumulation_steps = 2;
  const auto acc = train::train(b);
  ASSERT_EQ(one.losses.size(), 4u);
  ASSERT_EQ(acc.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(acc.losses[i], one.losses[i], 1e-5 * one.losses[i]) << i;
  auto c = a;
  c.output_dir = (s.dir / "plain").string();
  c.label_smoothing_factor = 0;
  const auto plain = train::train(c);
  EXPECT_GT(std::abs(plain.losses[0] - one.losses[0]), 1e-4) << "the first step's loss is the smoothed one";
  ASSERT_FALSE(one.evals.empty());
  train::TrainingArguments e = eval_args_of(a, s.dir / "eval");
  EXPECT_NEAR(train::evaluate_command(e).loss, one.evals.back().loss, 1e-6);
  e.label_smoothing_factor = 0;
  EXPECT_GT(std::abs(train::evaluate_command(e).loss - one.evals.back().loss), 1e-4);
}

// neftune_noise_alpha: the training steps' embeddings are noised (the losses differ from a plain run's),
// evaluations are not (the run's eval_loss is `trainer eval`'s of its final model; models::ForwardOptions
// adds noise only in training, test_models' Neftune), and the noise comes from the checkpointed generator: a
// run resumed after a crash takes the uninterrupted run's steps bit for bit.
TEST(TrainerNeftune, NoisyStepsCleanEvaluationsExactResume) {
  Scratch s("trainer_neftune");
  auto a = s.args("run");
  a.max_steps = 6;
  a.save_steps = 2;
  a.neftune_noise_alpha = 10;
  a.do_eval = true;
  const auto full = train::train(a);
  auto c = a;
  c.output_dir = (s.dir / "plain").string();
  c.neftune_noise_alpha = 0;
  const auto plain = train::train(c);
  ASSERT_EQ(full.losses.size(), 6u);
  EXPECT_NE(full.losses[0], plain.losses[0]);
  train::TrainingArguments e = eval_args_of(a, s.dir / "eval");
  EXPECT_NEAR(train::evaluate_command(e).loss, full.evals.back().loss, 1e-6);
  auto b = a;
  b.output_dir = (s.dir / "crashed").string();
  const train::TrainHooks hooks = crash_at_save(2);  // checkpoint-4 dies after its optimizer
  EXPECT_THROW(train::train(b, hooks), std::runtime_error);
  b.resume_from_checkpoint = "true";
  const auto resumed = train::train(b);
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed.losses[i], full.losses[2 + i]) << i;
}

TEST(TrainerEval, EvalLossPerplexityAndHfResultFiles) {
  Scratch s("trainer_eval");
  auto a = s.args("run");
  a.max_steps = 20;
  a.eval_strategy = "steps";
  a.eval_steps = 10;
  a.do_eval = true;
  a.per_device_eval_batch_size = 3;
  auto r = train::train(a);
  ASSERT_EQ(r.evals.size(), 2u);  // steps 10 and 20 (the final eval reuses step 20's)
  EXPECT_LT(r.evals[1].loss, r.evals[0].loss);
  EXPECT_NEAR(r.evals[1].perplexity, std::exp(r.evals[1].loss), 1e-9 * r.evals[1].perplexity);
  EXPECT_GT(r.unigram_baseline, 5.0);
  for (const char* f : {"eval_results.json", "all_results.json", "train_results.json", "trainer_state.json",
                        "model.safetensors", "tokenizer.json", "training_args.json"})
    EXPECT_TRUE(fs::exists(fs::path(a.output_dir) / f)) << f;
  auto ev = train::read_json_file((fs::path(a.output_dir) / "eval_results.json").string());
  EXPECT_DOUBLE_EQ(ev["eval_loss"].get<double>(), r.evals[1].loss);
  auto all = train::read_json_file((fs::path(a.output_dir) / "all_results.json").string());
  EXPECT_TRUE(all.contains("train_loss") && all.contains("eval_loss") && all.contains("eval_perplexity"));
  // evaluate() is the mean token loss over the held-out blocks: recompute it with full logits by hand.
  train::TrainingArguments e = eval_args_of(a, s.dir / "eval");
  auto again = train::evaluate_command(e);
  EXPECT_NEAR(again.loss, r.evals[1].loss, 1e-6);
  auto tok = tokenizers::Tokenizer::from_pretrained(a.output_dir);
  auto ids =
      tok.encode(std::string(std::istreambuf_iterator<char>(std::ifstream(a.train_file).rdbuf()), {}), false);
  const int64_t nv = static_cast<int64_t>(ids.size() + 1) * 5 / 100;  // +1: the EOS after the document
  auto m = models::from_pretrained(a.output_dir);
  double sum = 0;
  int64_t count = 0;
  for (int64_t b = 0; b + a.block_size <= nv; b += a.block_size) {
    std::vector<int64_t> blk(ids.begin() + b, ids.begin() + b + a.block_size);
    Tensor x = ops::from_vector<int64_t>(blk, {1, a.block_size});
    models::ForwardOptions fo;
    fo.labels = x;
    autograd::NoGradGuard ng;
    sum += m->forward(x, fo).loss.item() * (a.block_size - 1);
    count += a.block_size - 1;
  }
  EXPECT_EQ(count, r.evals[1].tokens);
  EXPECT_NEAR(sum / count, again.loss, 1e-5);
}

TEST(TrainerPrecision, Bf16FollowsFp32AndSavesFp32Masters) {
  Scratch s("trainer_bf16");
  auto a = s.args("fp32");
  a.max_steps = 12;
  auto ref = train::train(a);
  auto b = a;
  b.output_dir = (s.dir / "bf16").string();
  b.bf16 = true;
  auto half = train::train(b);
  ASSERT_EQ(half.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(half.losses[i], ref.losses[i], 0.02 * ref.losses[i]) << "step " << i;  // bf16: 8-bit mantissa
  EXPECT_NE(half.losses.back(), ref.losses.back());  // it really computed in bf16
  auto f = io::SafetensorsFile::open((fs::path(b.output_dir) / "model.safetensors").string());
  for (const auto& t : f.header().tensors) EXPECT_EQ(t.dtype, DType::f32) << t.name;
}

// With gradient accumulation, bf16 micro-batch gradients are summed into f32 (as HF's fp32 parameters under
// autocast): the optimizer sees f32 gradients, and the curve stays with fp32's.
TEST(TrainerPrecision, Bf16AccumulatesMicroBatchGradientsInFp32) {
  Scratch s("trainer_bf16_ga");
  auto a = s.args("fp32");
  a.max_steps = 6;
  a.per_device_train_batch_size = 2;
  a.gradient_accumulation_steps = 4;
  auto ref = train::train(a);
  auto b = a;
  b.output_dir = (s.dir / "bf16").string();
  b.bf16 = true;
  train::TrainHooks hooks;
  std::set<DType> seen;
  hooks.after_backward = [&](int64_t, const nn::ParamList& params) {
    for (const auto& [name, p] : params)
      if (p->grad().defined()) seen.insert(p->grad().dtype());
  };
  auto half = train::train(b, hooks);
  EXPECT_EQ(seen, std::set<DType>{DType::f32});
  ASSERT_EQ(half.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(half.losses[i], ref.losses[i], 0.02 * ref.losses[i]) << "step " << i;
}

TEST(TrainerPrecision, Tf32RoundsMatmulInputsAndStaysCloseToFp32) {
  // The op: with TF32 on, a matmul equals the fp32 matmul of inputs rounded to 10 mantissa bits.
  Tensor x = test::randn({7, 33}, 1), w = test::randn({33, 5}, 2);
  auto round10 = [](const Tensor& t) {
    Tensor r = ops::clone(t);
    for (int64_t i = 0; i < r.numel(); ++i) {
      uint32_t u;
      std::memcpy(&u, r.data<float>() + i, 4);
      u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
      std::memcpy(r.data<float>() + i, &u, 4);
    }
    return r;
  };
  Tensor plain = ops::matmul(x, w), emulated = ops::matmul(round10(x), round10(w));
  {
    backend::Tf32Scope on(true);
    EXPECT_EQ(test::values(ops::matmul(x, w)), test::values(emulated));
  }
  EXPECT_EQ(test::values(ops::matmul(x, w)), test::values(plain));  // the scope restored fp32
  EXPECT_NE(test::values(plain), test::values(emulated));
  // The Trainer's --tf32: a loss curve close to fp32's (TF32 keeps 10 mantissa bits), not equal to it.
  Scratch s("trainer_tf32");
  auto a = s.args("fp32");
  auto ref = train::train(a);
  auto b = a;
  b.output_dir = (s.dir / "tf32").string();
  b.tf32 = true;
  auto t = train::train(b);
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(t.losses[i], ref.losses[i], 2e-3 * ref.losses[i]) << i;
  EXPECT_NE(t.losses, ref.losses);
  EXPECT_FALSE(backend::allow_tf32());
}

TEST(TrainerPrecision, GradScalerFollowsTorchDefaults) {
  train::GradScaler s;
  EXPECT_EQ(s.scale, 65536.0);
  s.update(true);
  EXPECT_EQ(s.scale, 32768.0);
  for (int i = 0; i < 1999; ++i) s.update(false);
  EXPECT_EQ(s.scale, 32768.0);
  s.update(false);  // the 2000th clean step
  EXPECT_EQ(s.scale, 65536.0);
  EXPECT_EQ(s.growth_tracker, 0);
}

TEST(TrainerPrecision, Fp16SkipsOverflowingStepsWithoutSteppingTheScheduler) {
  Scratch s("trainer_fp16");
  auto a = s.args("fp16");
  a.fp16 = true;
  a.max_steps = 6;
  a.warmup_steps = 10;  // the lr rises every scheduler step: a skipped step shows as a repeated lr
  train::TrainHooks hooks;
  std::vector<std::vector<float>> master_before(1);
  hooks.after_backward = [&](int64_t step, const nn::ParamList& params) {
    if (step != 2) return;
    Tensor g = params[0].second->grad();  // poison one gradient element with inf
    ASSERT_EQ(g.dtype(), DType::f16);
    g.data<Half>()[0] = Half(std::numeric_limits<float>::infinity());
  };
  auto r = train::train(a, hooks);
  EXPECT_EQ(r.skipped_steps, 1);
  auto m = read_metrics(a.output_dir);
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[1]["loss_scale"].get<double>(), 65536.0);
  EXPECT_EQ(m[2]["loss_scale"].get<double>(), 32768.0);  // backed off at the skip
  EXPECT_EQ(m[2]["skipped_steps"].get<int64_t>(), 1);
  // lr of a step is the scheduler's value before it steps: step 3 (0-based) repeats step 2's lr.
  EXPECT_DOUBLE_EQ(m[3]["learning_rate"].get<double>(), m[2]["learning_rate"].get<double>());
  EXPECT_GT(m[4]["learning_rate"].get<double>(), m[3]["learning_rate"].get<double>());
  for (const auto& e : m) EXPECT_TRUE(std::isfinite(e["loss"].get<double>()));
  EXPECT_LT(r.losses.back(), r.losses.front());
}

TEST(TrainerOptim, EveryOptimizerTrainsTheModel) {
  Scratch s("trainer_optims");
  for (const auto& name : optim::optimizer_names()) {
    auto a = s.args("run_" + name);
    a.max_steps = 10;
    a.lr_scheduler_type = "constant";
    a.learning_rate = 1e-2;
    if (name == "sgd") {
      a.learning_rate = 1.0;
      a.optim_args = "momentum=0.9";
    }
    if (name == "adagrad") a.learning_rate = 0.1;  // its steps shrink as 1/sqrt(step) from lr
    if (name == "lomo") a.learning_rate = 0.5;     // SGD without momentum or clipping
    // AdaLomo's first steps are sign-like (its second moment is the first gradient's square) and scaled by
    // each weight's RMS - the norms' weights (RMS 1) move by lr per step: a rate that trains in 10 constant
    // steps without diverging moves it less far
    if (name == "adalomo") a.learning_rate = 0.5;
    if (name == "schedule_free_sgd") a.learning_rate = 1.0;    // SGDScheduleFree's default
    if (name == "schedule_free_radam") a.learning_rate = 0.5;  // rectified: lr x 0 to 0.05 in 10 steps
    if (name.starts_with("galore_") || name.starts_with("apollo_")) a.optim_target_modules = "all-linear";
    a.optim = name;
    a.weight_decay = 0.01;
    auto r = train::train(a);
    EXPECT_LT(r.losses.back(), r.losses.front() - (name == "adalomo" ? 1.0 : 1.5))
        << name;  // from 10.84 (= ln 50257) to ~8.8 here
    // and it resumes: the optimizer state goes through the checkpoint
    EXPECT_TRUE(fs::exists(fs::path(a.output_dir) / "checkpoint-10" / "optimizer.safetensors")) << name;
  }
}

TEST(TrainerMemory, EmptyCacheStepsReleaseAtHfsPointWithoutChangingResults) {
  Scratch s("trainer_empty_cache");
  auto a = s.args("plain");
  a.block_size = 64;
  a.per_device_train_batch_size = 8;  // logits chunks of >= 1 MiB go through the block cache
  a.max_steps = 6;
  auto ref = train::train(a);
  auto b = a;
  b.output_dir = (s.dir / "emptied").string();
  b.torch_empty_cache_steps = 2;
  auto r = train::train(b);
  EXPECT_EQ(r.cache_releases, 3);
  EXPECT_GT(r.cache_bytes_released, 0);
  EXPECT_EQ(r.losses, ref.losses);
}

TEST(TrainerMemory, AutoFindBatchSizeKeepsTheEffectiveBatch) {
  Scratch s("trainer_auto_bs");
  auto a = s.args("free");
  a.per_device_train_batch_size = 8;
  a.max_steps = 4;
  auto ref = train::train(a);
  // A cap between the peak of batch 4 and that of batch 8: batch 8 runs out of memory.
  auto probe = a;
  probe.output_dir = (s.dir / "probe").string();
  probe.per_device_train_batch_size = 4;
  probe.gradient_accumulation_steps = 2;
  const auto peak4 = train::train(probe).peak_bytes;
  ASSERT_GT(ref.peak_bytes, peak4);
  auto b = a;
  b.output_dir = (s.dir / "capped").string();
  b.auto_find_batch_size = true;
  const int64_t cap = (ref.peak_bytes + peak4) / 2;  // peaks are absolute bytes in use
  cpu_allocator().set_limit(cap);
  train::TrainResult r;
  try {
    r = train::train(b);
  } catch (...) {
    cpu_allocator().set_limit(0);
    throw;
  }
  cpu_allocator().set_limit(0);
  EXPECT_EQ(r.per_device_train_batch_size, 4);
  EXPECT_EQ(r.gradient_accumulation_steps, 2);
  EXPECT_EQ(r.batch_retries, 0) << "the estimate picks the fitting split before any out-of-memory";
  ASSERT_EQ(r.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) EXPECT_NEAR(r.losses[i], ref.losses[i], 1e-5) << i;
  // A prediction that is wrong (here: a hook holds extra memory while batch-4 steps run) still ends in the
  // out-of-memory retries: batch 4 fails, batch 2 with 4 accumulation steps trains.
  train::TrainHooks ballast;
  Tensor held;
  ballast.on_micro_batch = [&](int64_t, const Tensor& ids) {
    held = ids.size(0) == 4 ? ops::empty({cap - peak4 + (1 << 20)}, DType::u8, Device::cpu()) : Tensor();
  };
  auto c = b;
  c.output_dir = (s.dir / "mispredicted").string();
  cpu_allocator().set_limit(cap);
  try {
    r = train::train(c, ballast);
  } catch (...) {
    cpu_allocator().set_limit(0);
    throw;
  }
  cpu_allocator().set_limit(0);
  held = Tensor();
  EXPECT_EQ(r.per_device_train_batch_size, 2);
  EXPECT_EQ(r.gradient_accumulation_steps, 4);
  EXPECT_EQ(r.batch_retries, 1);
  b.auto_find_batch_size = false;  // without it, the cap is an error naming the memory
  b.output_dir = (s.dir / "capped_plain").string();
  cpu_allocator().set_limit(cap);
  EXPECT_THROW(train::train(b), OutOfMemoryError);
  cpu_allocator().set_limit(0);
}

TEST(TrainerMemory, GradientCheckpointingLowersPeakWithIdenticalLosses) {
  Scratch s("trainer_ckpt_mem");
  auto a = s.args("plain");
  std::ofstream(s.dir / "config.json") << R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 128,
    "n_layer": 8, "n_head": 4, "n_positions": 128, "embd_pdrop": 0.1, "resid_pdrop": 0.1, "attn_pdrop": 0.0})";
  a.block_size = 128;
  a.per_device_train_batch_size = 8;
  a.max_steps = 3;
  auto ref = train::train(a);
  auto b = a;
  b.output_dir = (s.dir / "ckpt").string();
  b.gradient_checkpointing = true;
  auto r = train::train(b);
  EXPECT_EQ(r.losses, ref.losses);  // dropout replayed exactly in the recompute
  const double ratio = static_cast<double>(r.peak_bytes) / static_cast<double>(ref.peak_bytes);
  std::printf("gradient checkpointing peak: %.1f MiB vs %.1f MiB (ratio %.3f)\n", r.peak_bytes / 1048576.0,
              ref.peak_bytes / 1048576.0, ratio);
  EXPECT_LT(ratio, 0.9);
}

TEST(TrainerSave, ACrashMidSaveKeepsTheLastCheckpointAndResumeIsExact) {
  Scratch s("trainer_crash", 0.1);  // dropout on: the RNG state must come back too
  auto a = s.args("run");
  a.max_steps = 6;
  a.save_steps = 2;
  a.save_total_limit = 1;
  auto full = train::train(a);
  auto b = a;
  b.output_dir = (s.dir / "crashed").string();
  const train::TrainHooks hooks = crash_at_save(2);  // checkpoint-4 dies after its optimizer
  EXPECT_THROW(train::train(b, hooks), std::runtime_error);
  EXPECT_TRUE(fs::exists(fs::path(b.output_dir) / "checkpoint-2" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(fs::path(b.output_dir) / "checkpoint-4"));
  b.resume_from_checkpoint = "true";
  auto resumed = train::train(b);
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed.losses[i], full.losses[2 + i]) << i;
  // metrics.jsonl: the lines the crashed run logged after checkpoint-2 were dropped, so each step appears
  // once
  std::vector<int64_t> steps;
  for (const auto& m : read_metrics(b.output_dir)) steps.push_back(m["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

TEST(TrainerBadInput, ClearErrorsBeforeWorkIsLost) {
  Scratch s("trainer_bad");
  auto error_of = [](const train::TrainingArguments& a) -> std::string {
    try {
      train::train(a);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  auto a = s.args("run");
  a.max_steps = 2;
  train::train(a);
  // the output_dir now holds a run
  EXPECT_NE(error_of(a).find("already holds a run (checkpoint-2); pass --resume_from_checkpoint true"),
            std::string::npos);
  // a checkpoint with a corrupt or missing file
  const fs::path ck = fs::path(a.output_dir) / "checkpoint-2";
  auto r = a;
  r.resume_from_checkpoint = ck.string();
  auto split = r;  // evaluation holds out 5% of the tokens: other training data than the checkpoint's
  split.do_eval = true;
  EXPECT_NE(error_of(split).find("saved while training on"), std::string::npos) << error_of(split);
  std::ofstream(ck / "trainer_state.json") << "{\"global_st";
  EXPECT_NE(error_of(r).find("trainer_state.json: corrupt"), std::string::npos) << error_of(r);
  fs::remove(ck / "optimizer.safetensors");
  EXPECT_NE(error_of(r).find("missing optimizer.safetensors"), std::string::npos) << error_of(r);
  // a dataset shorter than one batch
  auto d = s.args("short");
  std::ofstream(s.dir / "short.txt") << "Call me Ishmael. Some years ago, never mind how long.";
  d.train_file = (s.dir / "short.txt").string();
  EXPECT_NE(error_of(d).find("fewer than one block of --block_size 32"), std::string::npos) << error_of(d);
}

TEST(TrainerGpu, Bf16OnTheGpuFollowsTheCpuFp32Curve) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: GPU training NOT tested";
  Scratch s("trainer_gpu");
  auto a = s.args("cpu");
  a.max_steps = 12;
  a.optim = "adamw_torch_fused";
  auto ref = train::train(a);
  auto b = a;
  b.output_dir = (s.dir / "gpu").string();
  b.use_cpu = false;
  b.bf16 = true;
  auto gpu = train::train(b);
  ASSERT_EQ(gpu.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(gpu.losses[i], ref.losses[i], 0.02 * ref.losses[i]) << "step " << i;
  auto f = io::SafetensorsFile::open((fs::path(b.output_dir) / "model.safetensors").string());
  for (const auto& t : f.header().tensors) EXPECT_EQ(t.dtype, DType::f32) << t.name;
}

}  // namespace
}  // namespace tr
