// The training loop; see trainer.h.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "data/loader.h"
#include "data/tokenize.h"
#include "models/causal_lm.h"
#include "optim/adamw.h"
#include "tokenizers/bpe.h"

namespace tr::train {

namespace fs = std::filesystem;

namespace {

models::ModelConfig config_for(const std::string& name) {
  if (fs::is_directory(name)) return models::ModelConfig::from_file((fs::path(name) / "config.json").string());
  if (fs::is_regular_file(name)) return models::ModelConfig::from_file(name);
  return models::ModelConfig::builtin(name);
}

// Global L2 norm of all gradients; scales them to max_norm when above it (HF: coef = max / (norm + 1e-6)).
double clip_grad_norm(nn::ParamList& params, double max_norm) {
  double ss = 0;
  for (auto& [n, p] : params) {
    Tensor g = p->grad();
    if (!g.defined()) continue;
    const float* d = g.data<float>();
    for (int64_t i = 0; i < g.numel(); ++i) ss += static_cast<double>(d[i]) * d[i];
  }
  const double norm = std::sqrt(ss);
  if (max_norm > 0 && norm > max_norm) {
    const float coef = static_cast<float>(max_norm / (norm + 1e-6));
    for (auto& [n, p] : params) {
      Tensor g = p->grad();
      if (!g.defined()) continue;
      float* d = g.data<float>();
      for (int64_t i = 0; i < g.numel(); ++i) d[i] *= coef;
    }
  }
  return norm;
}

}  // namespace

TrainResult train(const TrainingArguments& a) {
  a.validate();
  using clock = std::chrono::steady_clock;
  fs::create_directories(a.output_dir);
  const std::string tok_path = !a.tokenizer_name.empty() ? a.tokenizer_name : a.model_name_or_path;
  TR_CHECK(!tok_path.empty(), "--tokenizer_name is required when training from --config_name");
  auto tok = tokenizers::Tokenizer::from_pretrained(tok_path);
  Generator gen(a.seed);
  std::unique_ptr<models::CausalLM> model;
  if (!a.model_name_or_path.empty()) {
    models::PretrainedOptions po;
    po.attn_implementation = a.attn_implementation;
    po.dtype = DType::f32;
    model = models::from_pretrained(a.model_name_or_path, po);
  } else {
    model = models::create_causal_lm(config_for(a.config_name), Device::cpu(), DType::f32, gen,
                                     a.attn_implementation);
  }
  const int64_t vocab = model->config().vocab_size;
  TR_CHECK(tok.vocab_size() <= vocab, "tokenizer {} has {} tokens, more than the model's vocab_size {}", tok_path,
           tok.vocab_size(), vocab);
  TR_CHECK(a.block_size <= model->config().max_position_embeddings, "--block_size {} exceeds the model's {} positions",
           a.block_size, model->config().max_position_embeddings);
  // Data: token shards (.bin) as they are, text files tokenized in memory.
  const bool shards = a.train_file.size() > 4 && a.train_file.substr(a.train_file.size() - 4) == ".bin";
  auto stream = shards ? std::make_shared<data::TokenStream>(data::expand_inputs({a.train_file}), vocab)
                       : std::make_shared<data::TokenStream>(data::tokenize_text_files(tok, {a.train_file}));
  data::DatasetOptions dopt;
  dopt.block_size = a.block_size;
  dopt.seed = a.seed;
  dopt.vocab_size = vocab;
  auto ds = std::make_shared<data::SequenceDataset>(stream, dopt);
  data::DataLoaderOptions lopt;
  lopt.batch_size = a.per_device_train_batch_size;
  lopt.num_workers = a.dataloader_num_workers;
  data::DataLoader loader(ds, lopt);
  const int64_t updates_per_epoch = (loader.batches_per_epoch() + a.gradient_accumulation_steps - 1) /
                                    a.gradient_accumulation_steps;
  const int64_t total = a.max_steps > 0 ? a.max_steps
                                        : static_cast<int64_t>(std::ceil(a.num_train_epochs * updates_per_epoch));
  const int64_t warmup = a.warmup_steps >= 1  ? static_cast<int64_t>(a.warmup_steps)
                         : a.warmup_steps > 0 ? static_cast<int64_t>(std::ceil(a.warmup_steps * total))
                                              : static_cast<int64_t>(std::ceil(a.warmup_ratio * total));
  const int64_t log_every =
      a.logging_steps >= 1 ? static_cast<int64_t>(a.logging_steps)
                           : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(a.logging_steps * total)));
  auto params = model->named_parameters();
  optim::AdamWOptions oo;
  oo.lr = a.learning_rate;
  oo.beta1 = a.adam_beta1;
  oo.beta2 = a.adam_beta2;
  oo.eps = a.adam_epsilon;
  oo.weight_decay = a.weight_decay;
  optim::AdamW opt(params, oo);
  std::ofstream metrics(fs::path(a.output_dir) / "metrics.jsonl", std::ios::app);
  {
    std::ofstream(fs::path(a.output_dir) / "training_args.json") << a.to_json().dump(2) << "\n";
  }
  std::fprintf(stderr, "train: %s, %.1fM parameters, %lld tokens, %lld optimizer steps of %lld x %lld x %lld tokens\n",
               model->config().model_type.c_str(), model->num_parameters() / 1e6, static_cast<long long>(stream->size()),
               static_cast<long long>(total), static_cast<long long>(a.gradient_accumulation_steps),
               static_cast<long long>(a.per_device_train_batch_size), static_cast<long long>(a.block_size));
  TrainResult r;
  double loss_since_log = 0, loss_total = 0;
  int64_t steps_since_log = 0, tokens = 0;
  const auto train_start = clock::now();
  for (int64_t step = 0; step < total; ++step) {
    std::vector<data::Batch> micro;
    while (static_cast<int64_t>(micro.size()) < a.gradient_accumulation_steps) {
      auto b = loader.next();
      if (b) micro.push_back(std::move(*b));
      else if (!micro.empty()) break;  // epoch end: a shorter last step, as HF
    }
    // num_items_in_batch: predicted labels in the whole step (accumulation-exact normalization).
    double items = 0;
    for (const auto& b : micro) items += static_cast<double>(b.input_ids.size(0) * (b.input_ids.size(1) - 1));
    double step_loss = 0;
    for (const auto& b : micro) {
      models::ForwardOptions fo;
      fo.labels = b.labels;
      fo.num_items_in_batch = items;
      fo.return_logits = false;
      fo.gradient_checkpointing = a.gradient_checkpointing;
      Tensor loss = model->forward(b.input_ids, fo).loss;
      autograd::backward({loss});
      step_loss += loss.item();
      tokens += b.input_ids.numel();
    }
    const double norm = clip_grad_norm(params, a.max_grad_norm);
    const double lr = lr_at(a.lr_scheduler_type, a.learning_rate, step, warmup, total);
    opt.set_lr(lr);
    opt.step();
    opt.zero_grad();
    if (step == 0) r.first_loss = step_loss;
    r.last_loss = step_loss;
    loss_since_log += step_loss;
    loss_total += step_loss;
    ++steps_since_log;
    if ((step + 1) % log_every == 0 || step + 1 == total) {
      const double secs = std::chrono::duration<double>(clock::now() - train_start).count();
      const double tps = tokens / secs, eta = secs / (step + 1) * (total - step - 1);
      const double mean = loss_since_log / steps_since_log;
      const int width = 24, fill = static_cast<int>(width * (step + 1) / total);
      std::fprintf(stderr, "\r[%s%s] step %lld/%lld  loss %.4f  lr %.3g  grad_norm %.3f  %.0f tok/s  ETA %.0f s   ",
                   std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(),
                   static_cast<long long>(step + 1), static_cast<long long>(total), mean, lr, norm, tps, eta);
      metrics << nlohmann::json{{"step", step + 1}, {"loss", mean}, {"learning_rate", lr}, {"grad_norm", norm},
                                {"tokens_per_second", tps}, {"epoch", static_cast<double>(loader.position().epoch)}}
                     .dump()
              << "\n";
      metrics.flush();
      loss_since_log = 0;
      steps_since_log = 0;
    }
  }
  std::fprintf(stderr, "\n");
  r.steps = total;
  r.seconds = std::chrono::duration<double>(clock::now() - train_start).count();
  r.tokens_per_second = tokens / r.seconds;
  r.train_loss = loss_total / total;
  models::save_pretrained(*model, a.output_dir);
  tok.save((fs::path(a.output_dir) / "tokenizer.json").string());
  std::ofstream(fs::path(a.output_dir) / "train_results.json")
      << nlohmann::json{{"train_loss", r.train_loss},
                        {"train_runtime", r.seconds},
                        {"train_steps_per_second", total / r.seconds},
                        {"train_tokens_per_second", r.tokens_per_second},
                        {"global_step", total}}
             .dump(2)
      << "\n";
  return r;
}

}  // namespace tr::train
