// The training loop; see trainer.h.
#include "train/trainer.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "backend/backend.h"
#include "core/allocator.h"
#include "core/file_writer.h"
#include "data/loader.h"
#include "models/causal_lm.h"
#include "optim/optimizer.h"
#include "tokenizers/bpe.h"
#include "train/mixed_precision.h"
#include "train/run_lock.h"
#include "train/setup.h"

namespace tr::train {

namespace fs = std::filesystem;

int64_t count_label_tokens(const Tensor& labels) {
  TR_CHECK(labels.dim() == 2 && labels.dtype() == DType::i64,
           "count_label_tokens: labels must be int64 [B, T]");
  Tensor l = ops::contiguous(ops::to_device(labels, Device::cpu()));  // a GPU batch: one small copy
  const int64_t* d = l.data<int64_t>();
  const int64_t B = l.size(0), T = l.size(1);
  int64_t n = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 1; t < T; ++t) n += d[b * T + t] != -100;
  return n;
}

namespace {

using clock = std::chrono::steady_clock;

// Reads a small device tensor on the host (the one synchronization of a step).
std::vector<double> host_values(const Tensor& t) {
  Tensor h = ops::contiguous(ops::to_dtype(ops::to_device(t, Device::cpu()), DType::f64));
  return {h.data<double>(), h.data<double>() + h.numel()};
}

// A step count given as N >= 1, or as a ratio of `total` below 1 (HF's logging/save/eval_steps).
int64_t steps_of(double v, int64_t total) {
  return v >= 1 ? static_cast<int64_t>(v) : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(v * total)));
}

// An output_dir holding another run is refused unless the user says what to do with it.
void check_output_dir(const TrainingArguments& a, bool resuming) {
  if (resuming || !fs::is_directory(a.output_dir)) return;
  const std::string last = latest_checkpoint(a.output_dir);
  const bool has_model = fs::exists(fs::path(a.output_dir) / "model.safetensors") ||
                         fs::exists(fs::path(a.output_dir) / "model.safetensors.index.json");
  if (last.empty() && !has_model) return;
  if (!a.overwrite_output_dir)
    fail(
        "--output_dir {} already holds a run ({}); pass --resume_from_checkpoint true to continue it or "
        "--overwrite_output_dir to replace it",
        a.output_dir, last.empty() ? "model.safetensors" : fs::path(last).filename().string());
  for (const auto& e : fs::directory_iterator(a.output_dir)) {  // stale checkpoints would mix with ours
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("checkpoint-", 0) == 0) fs::remove_all(e.path());
  }
}

// Divisors keep the effective batch exact: the largest divisor of `effective` at most 0.9 x bs.
int64_t smaller_batch(int64_t bs, int64_t effective) {
  for (int64_t b = static_cast<int64_t>(bs * 0.9); b >= 1; --b)
    if (effective % b == 0) return b;
  return 0;
}

// Checked: a full disk is an error naming the file and the reason, never a silently truncated result.
void write_json(const fs::path& p, const nlohmann::json& j) { write_file(p.string(), j.dump(2) + "\n"); }

// The checkpoint --resume_from_checkpoint names ("true": the newest in output_dir), or "" for a fresh run.
std::string resume_dir(const TrainingArguments& a) {
  if (a.resume_from_checkpoint.empty() || a.resume_from_checkpoint == "false") return "";
  if (a.resume_from_checkpoint != "true") return a.resume_from_checkpoint;
  const std::string last = latest_checkpoint(a.output_dir);
  TR_CHECK(!last.empty(), "--resume_from_checkpoint true: no checkpoint-N folder in {}", a.output_dir);
  return last;
}

TrainResult train_once(const TrainingArguments& a, const TrainHooks& hooks) {
  fs::create_directories(a.output_dir);
  auto tok = load_tokenizer(a);
  const std::string resume = resume_dir(a);
  const Device dev = training_device(a);
  Generator init_gen(a.seed);
  auto model = load_model(a, resume, init_gen, dev);
  const int64_t vocab = model->config().vocab_size;
  TR_CHECK(tok.vocab_size() <= vocab, "tokenizer {} has {} tokens, more than the model's vocab_size {}",
           a.tokenizer_name.empty() ? a.model_name_or_path : a.tokenizer_name, tok.vocab_size(), vocab);
  TR_CHECK(a.block_size <= model->config().max_position_embeddings,
           "--block_size {} exceeds the model's {} positions", a.block_size,
           model->config().max_position_embeddings);
  const bool want_eval = a.do_eval || a.eval_strategy != "no";
  auto streams = load_streams(a, tok, vocab, want_eval);
  data::DatasetOptions dopt;
  dopt.block_size = a.block_size;
  dopt.seed = a.seed;
  dopt.vocab_size = vocab;
  TR_CHECK(streams.train->size() >= a.block_size, "{}: {} tokens, fewer than one block of --block_size {}",
           a.train_file, streams.train->size(), a.block_size);
  auto ds = std::make_shared<data::SequenceDataset>(streams.train, dopt);
  data::DataLoaderOptions lopt;
  lopt.batch_size = a.per_device_train_batch_size;
  lopt.num_workers = static_cast<int>(a.dataloader_num_workers);
  lopt.pin_memory = a.dataloader_pin_memory;
  lopt.device = dev;
  lopt.drop_last = a.dataloader_drop_last;
  data::DataLoader loader(ds, lopt);
  TR_CHECK(loader.batches_per_epoch() >= 1,
           "{}: {} blocks of {} tokens, fewer than one batch of {} (dataloader_drop_last)", a.train_file,
           ds->num_samples(), a.block_size, a.per_device_train_batch_size);
  const int64_t ga = a.gradient_accumulation_steps;
  const int64_t updates_per_epoch = (loader.batches_per_epoch() + ga - 1) / ga;
  const int64_t total =
      a.max_steps > 0 ? a.max_steps : static_cast<int64_t>(std::ceil(a.num_train_epochs * updates_per_epoch));
  const int64_t warmup = a.warmup_steps >= 1  ? static_cast<int64_t>(a.warmup_steps)
                         : a.warmup_steps > 0 ? static_cast<int64_t>(std::ceil(a.warmup_steps * total))
                                              : static_cast<int64_t>(std::ceil(a.warmup_ratio * total));
  const int64_t log_every = steps_of(a.logging_steps, total), save_every = steps_of(a.save_steps, total);
  const int64_t eval_every = steps_of(a.eval_steps > 0 ? a.eval_steps : a.logging_steps, total);

  // Mixed precision: the model computes in half precision, the optimizer updates fp32 masters.
  const DType compute = a.bf16 ? DType::bf16 : a.fp16 ? DType::f16 : DType::f32;
  const nn::ParamList model_params = model->named_parameters();
  MixedPrecision mp(model_params, compute, a.fp16);
  model->set_dtype(compute);
  optim::OptimizerOptions oo;
  oo.lr = a.learning_rate;
  oo.beta1 = a.adam_beta1;
  oo.beta2 = a.adam_beta2;
  oo.eps = a.adam_epsilon;
  oo.weight_decay = a.weight_decay;
  oo.args = optim::parse_optim_args(a.optim_args);
  auto opt = optim::make_optimizer(a.optim, mp.master_params(), oo);

  TrainerState st;
  st.train_tokens = streams.train->size();
  st.train_batch_size = a.per_device_train_batch_size;
  st.gradient_accumulation_steps = ga;
  Generator dropout_gen(a.seed);
  if (!resume.empty()) {
    st = load_checkpoint_state(resume, *opt, mp);
    // The checks name trainer_state.json, where the values come from (a damaged file reads as a mismatch).
    const std::string state_file = (fs::path(resume) / "trainer_state.json").string();
    TR_CHECK(
        st.train_batch_size == a.per_device_train_batch_size && st.gradient_accumulation_steps == ga,
        "{}: saved with per_device_train_batch_size {} and gradient_accumulation_steps {}; resume with the "
        "same values (got {} and {})",
        state_file, st.train_batch_size, st.gradient_accumulation_steps, a.per_device_train_batch_size, ga);
    TR_CHECK(
        st.train_tokens == 0 || st.train_tokens == streams.train->size(),
        "{}: saved while training on {} tokens, this run's training stream has {} (a different --train_file, "
        "--validation_split_percentage or evaluation setting?); the data position would not match",
        state_file, st.train_tokens, streams.train->size());
    TR_CHECK(st.global_step <= total,
             "{}: global_step {} is past this run's {} optimizer steps (raise --max_steps or "
             "--num_train_epochs to continue)",
             state_file, st.global_step, total);
    st.train_tokens = streams.train->size();
    loader.seek(st.position);
    dropout_gen.set_state(st.dropout_rng);
    std::fprintf(stderr, "train: resumed from %s at step %lld\n", resume.c_str(),
                 static_cast<long long>(st.global_step));
  }
  const fs::path metrics_path = fs::path(a.output_dir) / "metrics.jsonl";
  if (!resume.empty() && fs::exists(metrics_path)) {  // drop lines logged after the checkpoint (they rerun)
    std::ifstream in(metrics_path);
    std::string kept;
    for (std::string line; std::getline(in, line);) {
      if (metrics_line_kept(line, st.global_step)) kept += line + "\n";
    }
    in.close();
    write_file(metrics_path.string(), kept);
  }
  std::ofstream metrics(metrics_path, resume.empty() ? std::ios::trunc : std::ios::app);
  auto log_metrics = [&](const nlohmann::json& entry) {
    metrics << entry.dump() << "\n";
    metrics.flush();
    TR_CHECK(metrics.good(), "{}: write failed: {}", metrics_path.string(), std::strerror(errno));
  };
  write_json(fs::path(a.output_dir) / "training_args.json", a.to_json());
  std::fprintf(
      stderr,
      "train: %s, %.1fM parameters, %s, optim %s; %lld tokens; %lld optimizer steps of %lld x %lld x %lld "
      "tokens\n",
      model->config().model_type.c_str(), model->num_parameters() / 1e6, dtype_name(compute).data(),
      a.optim.c_str(), static_cast<long long>(streams.train->size()), static_cast<long long>(total),
      static_cast<long long>(ga), static_cast<long long>(a.per_device_train_batch_size),
      static_cast<long long>(a.block_size));

  TrainResult r;
  double eval_seconds = 0;  // kept out of the training throughput
  r.per_device_train_batch_size = a.per_device_train_batch_size;
  r.gradient_accumulation_steps = ga;
  if (streams.validation)
    r.unigram_baseline = unigram_cross_entropy(*streams.train, *streams.validation, vocab);
  auto run_eval = [&](int64_t step) {
    EvalResult e;
    try {
      e = evaluate(*model, streams.validation, a.block_size, a.per_device_eval_batch_size,
                   a.validation_file.empty() ? a.train_file + " (validation split)" : a.validation_file);
    } catch (const OutOfMemoryError& oom) {
      // Not the training batch's fault: auto_find_batch_size must not shrink it (HF's known pain).
      fail("evaluation ran out of memory; lower --per_device_eval_batch_size ({}): {}",
           a.per_device_eval_batch_size, oom.what());
    }
    nlohmann::json entry = e.to_json();
    entry["step"] = step;
    entry["epoch"] = static_cast<double>(step) / updates_per_epoch;
    log_metrics(entry);
    st.log_history.push_back(entry);
    std::fprintf(stderr, "\neval: step %lld  eval_loss %.4f  perplexity %.2f  (unigram baseline %.4f)\n",
                 static_cast<long long>(step), e.loss, e.perplexity, r.unigram_baseline);
    r.evals.push_back(e);
    eval_seconds += e.seconds;
  };
  auto save = [&]() {
    st.dropout_rng = dropout_gen.state();
    st.position = loader.position();
    try {
      r.last_checkpoint = save_checkpoint(*model, mp, *opt, tok, st, a, hooks.save_probe);
    } catch (...) {
      std::fprintf(stderr, "\n");  // the error starts its own line, not the progress bar's
      throw;
    }
  };

  ops::allocator_for(dev).reset_peak();
  double loss_since_log = 0, loss_total = 0;
  int64_t steps_since_log = 0, tokens = 0, tokens_at_start = 0;
  const int64_t start_step = st.global_step;
  const auto train_start = clock::now();
  for (int64_t step = start_step; step < total; ++step) {
    std::vector<data::Batch> micro;
    while (static_cast<int64_t>(micro.size()) < ga) {
      auto b = loader.next();
      if (b)
        micro.push_back(std::move(*b));
      else if (!micro.empty())
        break;  // epoch end: a shorter last step, as HF
    }
    // num_items_in_batch: label tokens of the whole step (accumulation-exact normalization).
    double items = 0;
    for (const auto& b : micro)
      items += static_cast<double>(count_label_tokens(b.host_labels.defined() ? b.host_labels : b.labels));
    Tensor step_loss_acc;  // summed on the device (f64): read once per step, not once per micro-batch
    mp.begin_step(static_cast<int64_t>(micro.size()));
    for (const auto& b : micro) {
      if (hooks.on_micro_batch) hooks.on_micro_batch(step, b.input_ids);
      models::ForwardOptions fo;
      fo.labels = b.labels;
      fo.num_items_in_batch = items;
      fo.return_logits = false;
      fo.gradient_checkpointing = a.gradient_checkpointing;
      fo.training = true;
      fo.dropout_gen = &dropout_gen;
      Tensor loss = model->forward(b.input_ids, fo).loss;
      if (a.torch_empty_cache_steps > 0 && (step + 1) % a.torch_empty_cache_steps == 0 &&
          &b == &micro.front()) {
        // HF's point: after the forward, before the backward (the activations stay, the cache goes).
        const int64_t cached = dev.is_cpu() ? static_cast<int64_t>(cpu_allocator().cached_bytes()) : 0;
        ops::allocator_for(dev).empty_cache();
        ++r.cache_releases;
        r.cache_bytes_released += cached;
      }
      if (mp.loss_scaling())
        autograd::backward({loss}, {ops::full({}, mp.loss_scale(), DType::f32, dev)});
      else
        autograd::backward({loss});
      {
        autograd::NoGradGuard no_grad;
        Tensor l = ops::to_dtype(detach(loss), DType::f64);
        step_loss_acc = step_loss_acc.defined() ? ops::binary(backend::BinaryOp::add, step_loss_acc, l) : l;
      }
      tokens += b.input_ids.numel();
    }
    if (hooks.after_backward) hooks.after_backward(step, model_params);
    // Unscale, global norm, clip and the fp16 inf check without a host sync per tensor: one statistics pass
    // over the model's gradients (half under mixed precision), then the optimizer reads them through the
    // transform (AdamW: unscale, clip, update and the half weight copy in one pass).
    const std::vector<Tensor> grads = mp.model_grads();
    std::vector<Tensor> present;
    for (const Tensor& g : grads)
      if (g.defined()) present.push_back(ops::contiguous(g));
    Tensor stats = ops::zeros({2}, DType::f64, dev);
    const double inv_scale = 1.0 / mp.loss_scale();
    backend::backend_for(dev).grad_stats(present, inv_scale, stats);
    const backend::Backend::GradTransform transform{inv_scale, a.max_grad_norm, stats};
    const double lr = lr_at(a.lr_scheduler_type, a.learning_rate, st.scheduler_step, warmup, total);
    std::vector<double> host_stats;
    bool found_inf = false;
    if (mp.loss_scaling()) {  // the skip decision is the host's (torch's GradScaler syncs here as well)
      host_stats = host_values(stats);
      found_inf = host_stats[1] != 0;
    }
    if (found_inf) {
      // fp16 overflow: skip the update, do not step the scheduler, lower the scale (torch's GradScaler)
      ++st.skipped_steps;
    } else {
      opt->set_lr(lr);
      opt->step(grads, transform, mp.weight_copies());
      ++st.scheduler_step;
    }
    opt->zero_grad();
    mp.after_step(found_inf);
    if (host_stats.empty()) host_stats = host_values(stats);
    const double norm = std::sqrt(host_stats[0]);
    const double step_loss = step_loss_acc.defined() ? host_values(step_loss_acc)[0] : 0.0;
    st.global_step = step + 1;
    if (step == start_step) r.first_loss = step_loss;
    r.losses.push_back(step_loss);
    r.last_loss = step_loss;
    // HF's logging_nan_inf_filter: a non-finite step loss counts as the mean of the window so far.
    const double logged = std::isfinite(step_loss) ? step_loss
                          : steps_since_log > 0    ? loss_since_log / steps_since_log
                                                   : 0.0;
    loss_since_log += logged;
    loss_total += logged;
    ++steps_since_log;
    const bool epoch_end = (step + 1) % updates_per_epoch == 0;
    const double epoch = static_cast<double>(step + 1) / updates_per_epoch;
    if ((step + 1) % log_every == 0 || step + 1 == total || (a.logging_first_step && step == 0)) {
      const double secs = std::chrono::duration<double>(clock::now() - train_start).count() - eval_seconds;
      const double tps = (tokens - tokens_at_start) / secs;
      const double eta = secs / (step + 1 - start_step) * (total - step - 1);
      const double mean = loss_since_log / steps_since_log;
      const int width = 24, fill = static_cast<int>(width * (step + 1) / total);
      std::fprintf(
          stderr, "\r[%s%s] step %lld/%lld  loss %.4f  lr %.3g  grad_norm %.3f  %.0f tok/s  ETA %s   ",
          std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(),
          static_cast<long long>(step + 1), static_cast<long long>(total), mean, lr, norm, tps,
          eta >= 120 ? fmt::format("{:.1f} min", eta / 60).c_str() : fmt::format("{:.0f} s", eta).c_str());
      nlohmann::json entry{{"step", step + 1},  {"loss", mean},   {"learning_rate", lr},
                           {"grad_norm", norm}, {"epoch", epoch}, {"tokens_per_second", tps}};
      if (mp.loss_scaling()) {
        entry["loss_scale"] = mp.loss_scale();
        entry["skipped_steps"] = st.skipped_steps;
      }
      log_metrics(entry);
      st.log_history.push_back(entry);
      loss_since_log = 0;
      steps_since_log = 0;
    }
    if (streams.validation && ((a.eval_strategy == "steps" && (step + 1) % eval_every == 0) ||
                               (a.eval_strategy == "epoch" && epoch_end)))
      run_eval(step + 1);
    const bool stop = hooks.should_stop && hooks.should_stop();
    const bool save_now = (a.save_strategy == "steps" && (step + 1) % save_every == 0) ||
                          (a.save_strategy == "epoch" && epoch_end) ||
                          (a.save_strategy != "no" && step + 1 == total) || stop;
    if (save_now) save();
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
  r.seconds = std::chrono::duration<double>(clock::now() - train_start).count() - eval_seconds;
  r.tokens_per_second = tokens / r.seconds;
  r.train_loss = loss_total / std::max<int64_t>(1, r.steps);
  r.skipped_steps = st.skipped_steps;
  r.peak_bytes = ops::allocator_for(dev).stats().peak_bytes;
  if (st.skipped_steps > 0)
    std::fprintf(stderr,
                 "train: %lld of %lld fp16 steps skipped for inf/nan gradients (final loss scale %g)\n",
                 static_cast<long long>(st.skipped_steps), static_cast<long long>(total), mp.loss_scale());
  nlohmann::json all = {{"train_loss", r.train_loss},
                        {"train_runtime", r.seconds},
                        {"train_samples_per_second", (tokens / a.block_size) / r.seconds},
                        {"train_steps_per_second", r.steps / r.seconds},
                        {"train_tokens_per_second", r.tokens_per_second},
                        {"epoch", static_cast<double>(total) / updates_per_epoch},
                        {"global_step", total},
                        {"train_peak_memory_gib", static_cast<double>(r.peak_bytes) / (1 << 30)}};
  write_json(fs::path(a.output_dir) / "train_results.json", all);
  if (a.do_eval && streams.validation) {
    if (r.evals.empty() || st.log_history.back().value("step", int64_t{-1}) != total ||
        !st.log_history.back().contains("eval_loss"))
      run_eval(total);
    auto e = r.evals.back().to_json();
    e["epoch"] = static_cast<double>(total) / updates_per_epoch;
    write_json(fs::path(a.output_dir) / "eval_results.json", e);
    all.update(e);
  }
  write_json(fs::path(a.output_dir) / "all_results.json", all);
  mp.swap_masters();  // the final model in fp32, as HF saves it
  model->set_dtype(DType::f32);
  models::save_pretrained(*model, a.output_dir);
  mp.swap_masters();
  tok.save((fs::path(a.output_dir) / "tokenizer.json").string());
  write_json(fs::path(a.output_dir) / "trainer_state.json",
             {{"global_step", total},
              {"epoch", static_cast<double>(total) / updates_per_epoch},
              {"max_steps", total},
              {"num_train_epochs", a.num_train_epochs},
              {"logging_steps", log_every},
              {"eval_steps", eval_every},
              {"save_steps", save_every},
              {"train_batch_size", a.per_device_train_batch_size},
              {"skipped_steps", st.skipped_steps},
              {"log_history", st.log_history}});
  return r;
}

}  // namespace

TrainResult train(const TrainingArguments& args, const TrainHooks& hooks) {
  args.validate();
  // --tf32: f32 matmuls read TF32 inputs (tensor cores on a GPU; emulated by rounding on the CPU).
  backend::Tf32Scope tf32(args.tf32);
  const bool resuming = !args.resume_from_checkpoint.empty() && args.resume_from_checkpoint != "false";
  // Before anything in output_dir is read or replaced: a second trainer on the same folder is refused.
  const OutputDirLock lock(args.output_dir);
  check_output_dir(args, resuming);
  TrainingArguments a = args;
  const int64_t effective = a.per_device_train_batch_size * a.gradient_accumulation_steps;
  if (resuming && a.auto_find_batch_size) {  // continue with the batch split the search settled on (as HF)
    const fs::path state = fs::path(resume_dir(a)) / "trainer_state.json";
    if (fs::exists(state)) {
      const auto [bs, ga] = read_batch_split(read_json_file(state.string()), state.string());
      if (bs > 0 && ga > 0 && bs * ga == effective) {
        a.per_device_train_batch_size = bs;
        a.gradient_accumulation_steps = ga;
      }
    }
  }
  for (;;) {
    try {
      return train_once(a, hooks);
    } catch (const OutOfMemoryError& e) {
      if (!a.auto_find_batch_size) throw;
      const int64_t bs = smaller_batch(a.per_device_train_batch_size, effective);
      if (bs == 0) throw;
      std::fprintf(
          stderr,
          "\nauto_find_batch_size: out of memory with per_device_train_batch_size %lld (%s); retrying "
          "with %lld and gradient_accumulation_steps %lld (effective batch %lld kept)\n",
          static_cast<long long>(a.per_device_train_batch_size), e.what(), static_cast<long long>(bs),
          static_cast<long long>(effective / bs), static_cast<long long>(effective));
      a.per_device_train_batch_size = bs;
      a.gradient_accumulation_steps = effective / bs;
      ops::allocator_for(training_device(a)).empty_cache();
    }
  }
}

}  // namespace tr::train
