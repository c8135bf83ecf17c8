// The training loop; see trainer.h.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "data/loader.h"
#include "io/safetensors.h"
#include "data/tokenize.h"
#include "models/causal_lm.h"
#include "optim/adamw.h"
#include "tokenizers/bpe.h"

namespace tr::train {

namespace fs = std::filesystem;

namespace {

models::ModelConfig config_for(const std::string& name) {
  if (fs::is_directory(name))
    return models::ModelConfig::from_file((fs::path(name) / "config.json").string());
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

// Newest checkpoint-N folder in dir, or "".
std::string latest_checkpoint(const std::string& dir) {
  int64_t best = -1;
  std::string path;
  if (!fs::exists(dir)) return path;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("checkpoint-", 0) != 0 || !e.is_directory()) continue;
    try {
      const int64_t s = std::stoll(n.substr(11));
      if (s > best) {
        best = s;
        path = e.path().string();
      }
    } catch (...) {
    }
  }
  return path;
}

// Writes checkpoint-{step} through a temporary folder renamed into place (a crash leaves the previous ones).
void save_checkpoint(models::CausalLM& model, const optim::AdamW& opt, const data::LoaderPosition& pos,
                     const TrainingArguments& a, int64_t step, const nlohmann::json& log_history) {
  const fs::path final_dir = fs::path(a.output_dir) / ("checkpoint-" + std::to_string(step));
  const fs::path tmp = fs::path(a.output_dir) / (".tmp-checkpoint-" + std::to_string(step));
  fs::remove_all(tmp);
  models::save_pretrained(model, tmp.string());
  io::save_safetensors((tmp / "optimizer.safetensors").string(), opt.state_dict());
  std::ofstream(tmp / "trainer_state.json")
      << nlohmann::json{{"global_step", step},
                        {"epoch", pos.epoch},
                        {"data_position", {{"epoch", pos.epoch}, {"batch", pos.batch}}},
                        {"train_batch_size", a.per_device_train_batch_size},
                        {"log_history", log_history}}
             .dump(2)
      << "\n";
  std::ofstream(tmp / "training_args.json") << a.to_json().dump(2) << "\n";
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  if (a.save_total_limit > 0) {  // rotate: keep the newest save_total_limit checkpoints
    std::vector<std::pair<int64_t, fs::path>> all;
    for (const auto& e : fs::directory_iterator(a.output_dir)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("checkpoint-", 0) == 0) all.emplace_back(std::stoll(n.substr(11)), e.path());
    }
    std::sort(all.begin(), all.end());
    for (size_t i = 0; i + static_cast<size_t>(a.save_total_limit) < all.size(); ++i)
      fs::remove_all(all[i].second);
  }
}

}  // namespace

TrainResult train(const TrainingArguments& a, const TrainHooks& hooks) {
  a.validate();
  using clock = std::chrono::steady_clock;
  fs::create_directories(a.output_dir);
  const std::string tok_path = !a.tokenizer_name.empty() ? a.tokenizer_name : a.model_name_or_path;
  TR_CHECK(!tok_path.empty(), "--tokenizer_name is required when training from --config_name");
  auto tok = tokenizers::Tokenizer::from_pretrained(tok_path);
  Generator gen(a.seed);
  std::string resume =
      a.resume_from_checkpoint == "true" ? latest_checkpoint(a.output_dir) : a.resume_from_checkpoint;
  TR_CHECK(a.resume_from_checkpoint != "true" || !resume.empty(),
           "--resume_from_checkpoint true: no checkpoint-N folder in {}", a.output_dir);
  if (a.resume_from_checkpoint == "false") resume.clear();
  std::unique_ptr<models::CausalLM> model;
  if (!resume.empty()) {
    models::PretrainedOptions po;
    po.attn_implementation = a.attn_implementation;
    po.dtype = DType::f32;
    model = models::from_pretrained(resume, po);
  } else if (!a.model_name_or_path.empty()) {
    models::PretrainedOptions po;
    po.attn_implementation = a.attn_implementation;
    po.dtype = DType::f32;
    model = models::from_pretrained(a.model_name_or_path, po);
  } else {
    model = models::create_causal_lm(config_for(a.config_name), Device::cpu(), DType::f32, gen,
                                     a.attn_implementation);
  }
  const int64_t vocab = model->config().vocab_size;
  TR_CHECK(tok.vocab_size() <= vocab, "tokenizer {} has {} tokens, more than the model's vocab_size {}",
           tok_path, tok.vocab_size(), vocab);
  TR_CHECK(a.block_size <= model->config().max_position_embeddings,
           "--block_size {} exceeds the model's {} positions", a.block_size,
           model->config().max_position_embeddings);
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
  const int64_t updates_per_epoch =
      (loader.batches_per_epoch() + a.gradient_accumulation_steps - 1) / a.gradient_accumulation_steps;
  const int64_t total =
      a.max_steps > 0 ? a.max_steps : static_cast<int64_t>(std::ceil(a.num_train_epochs * updates_per_epoch));
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
  int64_t start_step = 0;
  nlohmann::json log_history = nlohmann::json::array();
  if (!resume.empty()) {
    // Weights came from the checkpoint; now the optimizer, the step and the data position (by seeking).
    auto f = io::SafetensorsFile::open((fs::path(resume) / "optimizer.safetensors").string());
    std::map<std::string, Tensor> st;
    for (const auto& t : f.header().tensors) st[t.name] = f.load(t.name);
    opt.load_state_dict(st);
    std::ifstream in(fs::path(resume) / "trainer_state.json");
    nlohmann::json ts = nlohmann::json::parse(in, nullptr, false);
    TR_CHECK(!ts.is_discarded() && ts.contains("global_step") && ts.contains("data_position"),
             "{}/trainer_state.json: missing or corrupt (needs global_step and data_position)", resume);
    start_step = ts["global_step"].get<int64_t>();
    loader.seek({ts["data_position"]["epoch"].get<int64_t>(), ts["data_position"]["batch"].get<int64_t>()});
    if (ts.contains("log_history")) log_history = ts["log_history"];
    std::fprintf(stderr, "train: resumed from %s at step %lld\n", resume.c_str(),
                 static_cast<long long>(start_step));
  }
  const int64_t save_every =
      a.save_steps >= 1 ? static_cast<int64_t>(a.save_steps)
                        : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(a.save_steps * total)));
  std::ofstream metrics(fs::path(a.output_dir) / "metrics.jsonl", std::ios::app);
  { std::ofstream(fs::path(a.output_dir) / "training_args.json") << a.to_json().dump(2) << "\n"; }
  std::fprintf(
      stderr, "train: %s, %.1fM parameters, %lld tokens, %lld optimizer steps of %lld x %lld x %lld tokens\n",
      model->config().model_type.c_str(), model->num_parameters() / 1e6,
      static_cast<long long>(stream->size()), static_cast<long long>(total),
      static_cast<long long>(a.gradient_accumulation_steps),
      static_cast<long long>(a.per_device_train_batch_size), static_cast<long long>(a.block_size));
  TrainResult r;
  double loss_since_log = 0, loss_total = 0;
  int64_t steps_since_log = 0, tokens = 0;
  const auto train_start = clock::now();
  for (int64_t step = start_step; step < total; ++step) {
    std::vector<data::Batch> micro;
    while (static_cast<int64_t>(micro.size()) < a.gradient_accumulation_steps) {
      auto b = loader.next();
      if (b)
        micro.push_back(std::move(*b));
      else if (!micro.empty())
        break;  // epoch end: a shorter last step, as HF
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
    if (step == start_step) r.first_loss = step_loss;
    r.losses.push_back(step_loss);
    r.last_loss = step_loss;
    loss_since_log += step_loss;
    loss_total += step_loss;
    ++steps_since_log;
    if ((step + 1) % log_every == 0 || step + 1 == total) {
      const double secs = std::chrono::duration<double>(clock::now() - train_start).count();
      const double tps = tokens / secs, eta = secs / (step + 1) * (total - step - 1);
      const double mean = loss_since_log / steps_since_log;
      const int width = 24, fill = static_cast<int>(width * (step + 1) / total);
      std::fprintf(stderr,
                   "\r[%s%s] step %lld/%lld  loss %.4f  lr %.3g  grad_norm %.3f  %.0f tok/s  ETA %.0f s   ",
                   std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(),
                   static_cast<long long>(step + 1), static_cast<long long>(total), mean, lr, norm, tps, eta);
      const nlohmann::json entry{
          {"step", step + 1},         {"loss", mean},
          {"learning_rate", lr},      {"grad_norm", norm},
          {"tokens_per_second", tps}, {"epoch", static_cast<double>(loader.position().epoch)}};
      metrics << entry.dump() << "\n";
      log_history.push_back(entry);
      metrics.flush();
      loss_since_log = 0;
      steps_since_log = 0;
    }
    const bool stop = hooks.should_stop && hooks.should_stop();
    if ((step + 1) % save_every == 0 || step + 1 == total || stop) {
      save_checkpoint(*model, opt, loader.position(), a, step + 1, log_history);
      r.last_checkpoint = (fs::path(a.output_dir) / ("checkpoint-" + std::to_string(step + 1))).string();
    }
    if (stop && step + 1 < total) {
      std::fprintf(
          stderr, "\ntrain: interrupted after step %lld; saved %s. Resume with --resume_from_checkpoint %s\n",
          static_cast<long long>(step + 1), r.last_checkpoint.c_str(), r.last_checkpoint.c_str());
      r.interrupted = true;
      r.steps = step + 1 - start_step;
      return r;
    }
  }
  std::fprintf(stderr, "\n");
  r.steps = total - start_step;
  r.seconds = std::chrono::duration<double>(clock::now() - train_start).count();
  r.tokens_per_second = tokens / r.seconds;
  r.train_loss = loss_total / std::max<int64_t>(1, total - start_step);
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
