// The training loop; see trainer.h (the run's set-up: run_setup.cpp).
#include "train/trainer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "backend/backend.h"
#include "backend/cuda_api.h"
#include "core/allocation_trace.h"
#include "core/file_writer.h"
#include "data/loader.h"
#include "dist/env.h"
#include "dist/process_group.h"
#include "models/causal_lm.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "report/plot.h"
#include "report/tensorboard.h"
#include "tokenizers/tokenizer.h"
#include "train/metrics_log.h"
#include "train/mixed_precision.h"
#include "train/run_lock.h"
#include "train/estimate.h"
#include "train/batch_size.h"
#include "train/ddp.h"
#include "train/deepspeed_config.h"
#include "train/dist_setup.h"
#include "train/zero.h"
#include "train/zero3.h"
#include "train/schedule.h"
#include "train/setup.h"
#include "train/run.h"

namespace tr::train {

namespace fs = std::filesystem;

constexpr const char* kSetAside = ".overwritten-";  // + checkpoint-N: an earlier run's, until this one starts

namespace detail {

// The micro-batches of the next optimizer step: gradient_accumulation_steps of them, fewer at the end of an
// epoch (a shorter last step, as HF).
std::vector<data::Batch> Run::next_micro_batches() {
  std::vector<data::Batch> micro;
  while (static_cast<int64_t>(micro.size()) < sched_.ga) {
    auto b = loader_->next();
    if (b)
      micro.push_back(std::move(*b));
    else if (!micro.empty())
      break;
  }
  return micro;
}

bool Run::evaluate_at(int64_t step, bool scheduled) {
  const ops::Range span(dev_, "evaluate");
  opt_->set_train_mode(false, mp_->weight_copies());  // schedule-free: evaluate x (HF's evaluation_loop)
  EvalResult e;
  try {
    e = evaluate(*model_, streams_.validation, a_.block_size, a_.per_device_eval_batch_size,
                 validation_source(a_), group_, a_.label_smoothing_factor);
  } catch (const OutOfMemoryError& oom) {
    // Not the training batch's fault: auto_find_batch_size must not shrink it (HF's known pain).
    fail("evaluation ran out of memory; lower --per_device_eval_batch_size ({}): {}",
         a_.per_device_eval_batch_size, oom.what());
  }
  nlohmann::json entry = e.to_json();
  entry["step"] = step;
  entry["epoch"] = sched_.epoch(step);
  log(entry);
  if (main_)
    std::fprintf(stderr, "\neval: step %lld  eval_loss %.4f  perplexity %.2f  (unigram baseline %.4f)\n",
                 static_cast<long long>(step), e.loss, e.perplexity, r_.unigram_baseline);
  r_.evals.push_back(e);
  eval_seconds_ += e.seconds;
  if (!scheduled) return false;
  if (lr_->kind() == LrScheduleKind::reduce_lr_on_plateau) {  // stepped by the metric, as HF's _evaluate
    const double before = lr_->plateau().lr;
    if (lr_->plateau().step(entry[a_.best_metric_key()].get<double>()) && main_)
      std::fprintf(stderr, "train: reduce_lr_on_plateau: learning rate %g -> %g after step %lld\n", before,
                   lr_->plateau().lr, static_cast<long long>(step));
  }
  return track_best(entry, step);
}

// HF's _determine_best_metric: the metric compared with the best so far (strictly better replaces it).
bool Run::track_best(const nlohmann::json& metrics, int64_t step) {
  const std::string key = a_.best_metric_key();
  if (key.empty()) return false;
  const double v = metrics[key].get<double>();
  const bool greater = a_.best_metric_greater();
  const double inf = std::numeric_limits<double>::infinity();
  const double best = st_.has_best ? st_.best_metric : greater ? -inf : inf;  // HF's start: a nan never wins
  if (!(greater ? v > best : v < best)) return false;
  st_.best_metric = v;
  st_.has_best = true;
  st_.best_global_step = step;
  return true;
}

// A ZeRO run whose fp32 masters are whole nowhere (ZeRO-2/3 under mixed precision, ZeRO-3 in fp32): a save
// gathers each parameter onto rank 0 as it is written. Hybrid sharding: only the first node's shard group
// (rank 0's) gathers; the other nodes hold the same shards and take no part.
ShardedOptimizer* Run::gathered_masters() const {
  auto* z = dynamic_cast<ShardedOptimizer*>(opt_.get());
  if (!z || !(mp_->masters_sharded() || (full_ && !mp_->enabled()))) return nullptr;
  return !hybrid_.replicas || hybrid_.replicas->rank() == 0 ? z : nullptr;
}

void Run::save() {
  // The checkpoint of the best evaluation's step becomes best_model_checkpoint (HF's _save_checkpoint):
  // save_total_limit keeps it, load_best_model_at_end ends with it.
  if (st_.has_best && st_.best_global_step == st_.global_step)
    st_.best_model_checkpoint =
        (fs::path(a_.output_dir) / ("checkpoint-" + std::to_string(st_.global_step))).string();
  if (lr_->kind() == LrScheduleKind::reduce_lr_on_plateau) st_.plateau = lr_->plateau().to_json();
  st_.dropout_rng = dropout_gen_.state();
  st_.position = loader_->position();
  if (full_) full_->drain();  // the save's gathers share the group with ZeRO-3's: none may be in flight
  // Schedule-free: the checkpoint holds x, the weights to evaluate and use (schedulefree asks for eval mode
  // at a save; HF's Trainer saves y unless an evaluation just ran), and its optimizer state says so; the
  // next step moves back to y, in this run and in one resumed from the checkpoint alike.
  opt_->set_train_mode(false, mp_->weight_copies());
  Allocator& alloc = ops::allocator_for(dev_);
  alloc.begin_window();
  save_files();
  r_.save_peak_bytes = std::max(r_.save_peak_bytes, alloc.stats().window_peak_bytes);
}

void Run::save_files() {
  // DDP: every rank holds the same state; rank 0 writes it, the others wait until it is there. ZeRO-2: once
  // rank 0's files are staged, every other rank adds its optimizer.rank-K.safetensors, then rank 0 renames.
  const bool shards = dynamic_cast<const ShardedOptimizer*>(opt_.get()) != nullptr;
  if (!main_) {
    if (ShardedOptimizer* z = gathered_masters()) take_part_in_save(*z);  // while rank 0 writes the model
    if (shards) {  // hybrid sharding: the first node's ranks write the shards every node holds
      group_->barrier();
      if ((!hybrid_.replicas || hybrid_.replicas->rank() == 0) && !a_.save_only_model)
        save_optimizer_state(checkpoint_staging_dir(a_.output_dir, st_.global_step), *opt_);
      group_->barrier();
    }
    group_->barrier();
    r_.last_checkpoint =
        (fs::path(a_.output_dir) / ("checkpoint-" + std::to_string(st_.global_step))).string();
    return;
  }
  const auto others = [this] {
    group_->barrier();  // staged: the others write
    group_->barrier();  // written
  };
  try {
    const ops::Range span(dev_, "save checkpoint");
    const auto weights = saved_weights(*mp_, gathered_masters());
    r_.last_checkpoint =
        save_checkpoint(*model_, weights ? &*weights : nullptr, *mp_, *opt_, tok_ ? &*tok_ : nullptr, st_, a_,
                        hooks_.save_probe, shards ? std::function<void()>(others) : nullptr);
  } catch (const OutOfMemoryError& oom) {
    std::fprintf(stderr, "\n");
    if (!group_) throw;  // one process: auto_find_batch_size may retry with a smaller batch
    // Distributed: the other ranks are inside the save's collectives; a retry on this rank alone would hang.
    fail("saving checkpoint-{} ran out of memory on rank 0: {}", st_.global_step, oom.what());
  } catch (...) {
    std::fprintf(stderr, "\n");  // the error starts its own line, not the progress bar's
    throw;
  }
  if (group_) group_->barrier();
}

// Whether to stop after this step: the hook (a signal), on any rank - every rank must stop at the same step,
// or the others would wait in the next step's collectives for a rank that left.
bool Run::stop_requested() {
  double stop = hooks_.should_stop && hooks_.should_stop() ? 1 : 0;
  if (group_) group_->all_reduce_sum(&stop, 1);
  return stop > 0;
}

// The bookkeeping of a finished step (0-based `step`): state, losses, the log line and metrics entry.
void Run::after_step(int64_t step, const StepResult& s, double lr, int64_t start_step) {
  if (s.skipped)
    ++st_.skipped_steps;
  else
    ++st_.scheduler_step;
  st_.global_step = step + 1;
  tokens_ += s.tokens;
  st_.num_input_tokens_seen += s.tokens;
  r_.cache_releases += s.cache_releases;
  r_.cache_bytes_released += s.cache_bytes_released;
  r_.comm_wait_seconds += s.comm_wait_seconds;
  r_.comm_bytes += s.comm_bytes;
  if (step == start_step) r_.first_loss = s.loss;
  r_.losses.push_back(s.loss);
  r_.last_loss = s.loss;
  if (window_->add(s.loss) && main_ && !nan_noted_) {  // said once: the logged losses hide a diverged run
    std::fprintf(stderr,
                 "\ntrain: step %lld's loss is %g; logged as the mean of the window so far "
                 "(--logging_nan_inf_filter; false logs it as it is)\n",
                 static_cast<long long>(step + 1), s.loss);
    nan_noted_ = true;
  }
  // Under --deepspeed HF logs what DeepSpeed's engine reports: its scheduler has stepped inside the step,
  // so the rate is the next step's, and a skipped step keeps the last applied step's gradient norm.
  if (ds_) {
    lr = lr_->at(st_.scheduler_step, sched_.warmup, sched_.total);
    if (!s.skipped) ds_grad_norm_ = s.grad_norm;
  }
  const double grad_norm = ds_ ? ds_grad_norm_ : s.grad_norm;
  if (!sched_.logs_after(step)) return;
  const double secs = std::chrono::duration<double>(clock::now() - train_start_).count() - eval_seconds_;
  const double tps = tokens_ / secs;
  const double mean = window_->flush(step + 1, lr, grad_norm, secs, tps);
  nlohmann::json entry{{"step", step + 1},
                       {"loss", mean},
                       {"learning_rate", lr},
                       {"grad_norm", grad_norm},
                       {"epoch", sched_.epoch(step + 1)},
                       {"tokens_per_second", tps}};
  if (a_.logs_input_tokens()) entry["num_input_tokens_seen"] = st_.num_input_tokens_seen;
  if (mp_->loss_scaling()) {
    entry["loss_scale"] = mp_->loss_scale();
    entry["skipped_steps"] = st_.skipped_steps;
  }
  entry["peak_memory_gib"] = static_cast<double>(ops::allocator_for(dev_).stats().peak_bytes) / (1 << 30);
  log(entry);
}

// One log entry to everything that records it: metrics.jsonl, TensorBoard, trainer_state's log_history.
void Run::log(const nlohmann::json& entry) {
  st_.log_history.push_back(entry);
  if (!main_) return;
  metrics_->write(entry);
  if (tb_) tb_->log(entry);
}

StepOptions Run::step_options() const {
  StepOptions so;
  so.gradient_checkpointing = a_.gradient_checkpointing;
  so.label_smoothing = a_.label_smoothing_factor;
  so.neftune_noise_alpha = a_.neftune_noise_alpha;
  so.max_grad_norm = a_.max_grad_norm;
  so.torch_empty_cache_steps = a_.torch_empty_cache_steps;
  so.device = dev_;
  so.on_micro_batch = hooks_.on_micro_batch;
  so.after_backward = hooks_.after_backward;
  so.group = group_;
  so.ddp_bucket_cap_bytes = a_.ddp_bucket_cap_mb << 20;
  so.average_tokens_across_devices = a_.average_tokens_across_devices;
  so.fuse_elementwise = a_.compile_fuses() && ops::fuses_elementwise(dev_);
  so.device_graphs = a_.compile_device_graphs() && dev_.is_cuda();
  return so;
}

// What --torch_compile's backend and mode do on this device, in one line.
void Run::announce_compile(const StepOptions& so) const {
  std::string how = so.fuse_elementwise ? ", elementwise chains fused" : "";
  if (so.device_graphs)
    how += ", each replay one CUDA graph";
  else if (a_.compile_device_graphs())
    how += " (CUDA graphs on a GPU only)";
  if (a_.compile_autotunes())
    how += dev_.is_cuda() ? ", each GEMM shape's cuBLASLt candidates timed once"
                          : " (GEMM autotuning on a GPU only: the CPU's libraries pick their kernels)";
  std::fprintf(stderr,
               "torch_compile: backend %s, mode %s: the step is captured per shape, planned into one arena "
               "and replayed%s\n",
               a_.torch_compile_backend.c_str(), a_.torch_compile_mode.c_str(), how.c_str());
}

// --overwrite_output_dir over an earlier run: its checkpoints, set aside by check_output_dir (they would mix
// with this run's: resume takes the newest), go once this run is set up, so that a run that fails to start
// loses nothing.
void Run::remove_stale_checkpoints() const {
  if (!main_ || !fs::is_directory(a_.output_dir)) return;
  for (const auto& e : fs::directory_iterator(a_.output_dir)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind(std::string(kSetAside) + "checkpoint-", 0) == 0) fs::remove_all(e.path());
  }
}

TrainResult Run::train() {
  remove_stale_checkpoints();
  const StepOptions so = step_options();
  const StepState ss{*model_, *mp_, *opt_, dropout_gen_, full_.get()};
  if (a_.torch_compile) announce_compile(so);
  const auto step_fn = a_.torch_compile ? make_compiled_step(ss, so) : make_eager_step(ss, so);
  r_.setup_peak_bytes = ops::allocator_for(dev_).stats().peak_bytes;
  for (const Device d : model_->placement().devices()) ops::allocator_for(d).reset_peak();
  ops::allocator_for(dev_).reset_peak();
  const int64_t start_step = st_.global_step, total = sched_.total;
  window_ =
      std::make_unique<StepWindow>(start_step, total, main_, a_.logging_nan_inf_filter, !a_.disable_tqdm);
  train_start_ = clock::now();
  if (a_.eval_on_start && streams_.validation) evaluate_at(start_step, false);
  for (int64_t step = start_step; step < total; ++step) {
    const double lr = lr_->at(st_.scheduler_step, sched_.warmup, total);
    opt_->set_train_mode(true, mp_->weight_copies());  // schedule-free: back to y (HF's training_step)
    const StepResult s = step_fn->run(step, next_micro_batches(), lr);
    after_step(step, s, lr, start_step);
    bool new_best = false;
    if (streams_.validation && sched_.evaluates_after(step)) {
      step_fn->release_memory();
      new_best = evaluate_at(step + 1, true);
    }
    const bool stop = stop_requested();
    if (sched_.saves_after(step) || (sched_.save == IntervalStrategy::best && new_best) || stop) {
      step_fn->release_memory();
      save();
    }
    if (stop && step + 1 < total) {
      if (main_)
        std::fprintf(
            stderr,
            "\ntrain: interrupted after step %lld; saved %s. Resume with --resume_from_checkpoint %s\n",
            static_cast<long long>(step + 1), r_.last_checkpoint.c_str(), r_.last_checkpoint.c_str());
      r_.interrupted = true;
      r_.steps = step + 1 - start_step;
      return r_;
    }
  }
  if (main_) std::fprintf(stderr, "\n");
  r_.steps = total - start_step;
  collect_results(*step_fn);
  step_fn->release_memory();
  finish();
  return r_;
}

// The finished loop's numbers: throughput, what compile captured, each device's and each rank's peak.
void Run::collect_results(const TrainStep& step_fn) {
  r_.seconds = std::chrono::duration<double>(clock::now() - train_start_).count() - eval_seconds_;
  r_.tokens_per_second = tokens_ / r_.seconds;
  r_.train_loss = window_->counted_sum() / std::max<int64_t>(1, r_.steps);
  r_.skipped_steps = st_.skipped_steps;
  r_.compiled_shapes = step_fn.captured_shapes();
  r_.planned_peak_bytes = step_fn.planned_peak_bytes();
  r_.replayed_peak_bytes = step_fn.replayed_peak_bytes();
  r_.device_graph_captures = step_fn.device_graph_captures();
  if (const std::string tuned = ops::autotune_summary(dev_); !tuned.empty())
    std::fprintf(stderr, "torch_compile: %s\n", tuned.c_str());
  if (const std::string dnn = ops::cudnn_attention_summary(dev_); main_ && !dnn.empty())
    std::fprintf(stderr, "attention: %s\n", dnn.c_str());
  r_.peak_bytes = ops::allocator_for(dev_).stats().peak_bytes;
  if (!model_->placement().single())
    for (const Device d : model_->placement().devices())
      r_.device_peak_bytes.emplace_back(d.str(), ops::allocator_for(d).stats().peak_bytes);
  if (group_) {  // every rank's peak and optimizer state (they shrink with the world under ZeRO)
    const int64_t mine[4] = {r_.peak_bytes, opt_->state_bytes(), r_.setup_peak_bytes, r_.save_peak_bytes};
    std::vector<int64_t> all(4 * static_cast<size_t>(group_->size()));
    group_->all_gather(mine, all.data(), sizeof mine);
    for (size_t k = 0; k < all.size(); k += 4) {
      r_.rank_peak_bytes.push_back(all[k]);
      r_.rank_optimizer_bytes.push_back(all[k + 1]);
      r_.rank_setup_peak_bytes.push_back(all[k + 2]);
      r_.rank_save_peak_bytes.push_back(all[k + 3]);
    }
  }
  r_.tokens = tokens_;
  r_.eval_seconds = eval_seconds_;
  r_.global_step = sched_.total;
  r_.world_size = group_ ? group_->size() : 1;
  r_.comm_backend = group_ ? group_->backend_name() : "";
  r_.device_name = dev_.is_cuda() ? backend::cuda_device_name(dev_.index) : "cpu";
  r_.tf32 = backend::allow_tf32();
  const auto& c = model_->config();  // nanoGPT's/PaLM's model FLOPs per token: 6N + 12 L H T
  r_.flops_per_token = 6.0 * static_cast<double>(model_->num_parameters()) +
                       12.0 * c.num_layers * c.num_heads * c.head_dim * a_.block_size;
  if (tb_) r_.logging_dir = a_.logging_dir;
}

// output_dir/training_curves.png from metrics.jsonl. The run's results are saved by now, so a picture that
// cannot be drawn is a warning, not a failed run.
void Run::draw_curves() {
  const std::string png = (fs::path(a_.output_dir) / "training_curves.png").string();
  try {
    report::PlotOptions po;
    report::plot_runs({report::read_run_metrics(a_.output_dir)}, po, png);
    r_.curves = png;
  } catch (const Error& e) {
    std::fprintf(stderr, "train: warning: no training_curves.png: %s\n", e.what());
  }
}

// train_results.json: HF's train metrics, our peaks (compiled, split, per rank) and the communication.
nlohmann::json Run::results_json() const {
  const int64_t total = sched_.total;
  nlohmann::json all = {{"train_loss", r_.train_loss},
                        {"train_runtime", r_.seconds},
                        {"train_samples_per_second", (tokens_ / a_.block_size) / r_.seconds},
                        {"train_steps_per_second", r_.steps / r_.seconds},
                        {"train_tokens_per_second", r_.tokens_per_second},
                        {"epoch", sched_.epoch(total)},
                        {"global_step", total},
                        {"train_peak_memory_gib", static_cast<double>(r_.peak_bytes) / (1 << 30)},
                        {"setup_peak_memory_gib", static_cast<double>(r_.setup_peak_bytes) / (1 << 30)}};
  if (r_.compiled_shapes > 0) {  // torch_compile: the replayed steps' peak, as planned and as measured
    all["compiled_shapes"] = r_.compiled_shapes;
    all["compiled_planned_peak_memory_gib"] = static_cast<double>(r_.planned_peak_bytes) / (1 << 30);
    all["compiled_replayed_peak_memory_gib"] = static_cast<double>(r_.replayed_peak_bytes) / (1 << 30);
    all["compiled_cuda_graph_captures"] = r_.device_graph_captures;
  }
  if (r_.save_peak_bytes > 0)  // checkpoint saves inside training: part of train_peak_memory_gib too
    all["save_peak_memory_gib"] = static_cast<double>(r_.save_peak_bytes) / (1 << 30);
  // A GPU's caching allocator: the most it reserved over set-up, training and evaluation
  // (torch.cuda.max_memory_reserved; the estimate's reserved_bytes).
  if (const int64_t reserved = ops::allocator_for(dev_).peak_reserved_bytes(); reserved > 0)
    all["peak_reserved_memory_gib"] = static_cast<double>(reserved) / (1 << 30);
  if (!r_.device_peak_bytes.empty()) {  // a split: train_peak_memory_gib is the embeddings' device's
    nlohmann::json per = nlohmann::json::object();
    for (const auto& [d, b] : r_.device_peak_bytes) per[d] = static_cast<double>(b) / (1 << 30);
    all["device_map"] = model_->placement().summary();
    all["train_peak_memory_gib_per_device"] = per;
  }
  if (group_) {  // train_peak_memory_gib is rank 0's; the lists have every rank's
    const auto gib = [](const std::vector<int64_t>& v) {
      nlohmann::json out = nlohmann::json::array();
      for (int64_t b : v) out.push_back(static_cast<double>(b) / (1 << 30));
      return out;
    };
    all["world_size"] = group_->size();
    const auto* z = dynamic_cast<const ShardedOptimizer*>(opt_.get());
    all["fsdp"] = z ? fsdp_strategy(a_) : "";
    all["train_peak_memory_gib_per_rank"] = gib(r_.rank_peak_bytes);
    all["optimizer_state_gib_per_rank"] = gib(r_.rank_optimizer_bytes);
    all["setup_peak_memory_gib_per_rank"] = gib(r_.rank_setup_peak_bytes);
    if (r_.save_peak_bytes > 0) all["save_peak_memory_gib_per_rank"] = gib(r_.rank_save_peak_bytes);
    all["ddp_backend"] = group_->backend_name();
    all["ddp_comm_bytes_per_step"] = r_.comm_bytes / std::max<int64_t>(1, r_.steps);
    all["ddp_comm_wait_seconds"] = r_.comm_wait_seconds;
    all["ddp_comm_wait_share"] = r_.comm_wait_seconds / r_.seconds;
  }
  return all;
}

// load_best_model_at_end with a best checkpoint other than the last step's: the run ends with its weights.
// Rank 0 decides (it sees the folder) and every rank follows: the others' part in the final save depends on
// it. A best checkpoint that is gone is HF's warning, and the last step's model stays.
bool Run::final_model_is_best() {
  bool best = a_.load_best_model_at_end && !st_.best_model_checkpoint.empty() &&
              checkpoint_step(fs::path(st_.best_model_checkpoint).filename().string()) != sched_.total;
  if (best && main_ && !fs::exists(fs::path(st_.best_model_checkpoint) / "config.json")) {
    std::fprintf(
        stderr,
        "train: warning: load_best_model_at_end: could not locate the best model at %s; the final model "
        "is the last step's\n",
        st_.best_model_checkpoint.c_str());
    best = false;
  }
  if (group_) {
    double v = main_ && best ? 1.0 : 0.0;
    group_->all_reduce_sum(&v, 1);
    best = v > 0;
  }
  return best;
}

// The final evaluation of the best model is the best checkpoint's evaluation: the same weights (its fp32
// save is what the compute copies were made from) on the same data. It is logged again at the last step,
// where HF's run_clm evaluates the model it loaded.
void Run::finish_with_best() {
  const int64_t best = checkpoint_step(fs::path(st_.best_model_checkpoint).filename().string());
  if (main_)
    std::fprintf(stderr, "train: load_best_model_at_end: the final model is %s's (%s %g at step %lld)\n",
                 st_.best_model_checkpoint.c_str(), a_.best_metric_key().c_str(), st_.best_metric,
                 static_cast<long long>(best));
  if (!(a_.evaluates_at_end() && streams_.validation)) return;
  const nlohmann::json* found = nullptr;
  for (const auto& e : st_.log_history)
    if (e.contains("eval_loss") && e.value("step", int64_t{-1}) == best) found = &e;
  TR_CHECK(found != nullptr, "load_best_model_at_end: the log history holds no evaluation of step {} ({})",
           best, st_.best_model_checkpoint);
  // (A resumed run's history comes from trainer_state.json: a field of another type reads as absent.)
  const auto num = [found](const char* key, double absent) {
    const auto it = found->find(key);
    return it != found->end() && it->is_number() ? it->get<double>() : absent;
  };
  EvalResult r;
  r.loss = num("eval_loss", std::nan(""));
  r.perplexity = num("eval_perplexity", std::exp(r.loss));
  r.seconds = num("eval_runtime", 0.0);
  r.samples = static_cast<int64_t>(num("eval_samples", 0.0));
  r.tokens = static_cast<int64_t>(num("eval_tokens", 0.0));
  nlohmann::json entry = r.to_json();
  entry["step"] = sched_.total;
  entry["epoch"] = sched_.epoch(sched_.total);
  log(entry);
  r_.evals.push_back(r);
}

// The files of a finished run, as HF's Trainer leaves them: results, the final model and tokenizer, state.
void Run::finish() {
  const int64_t total = sched_.total;
  opt_->set_train_mode(false, mp_->weight_copies());  // schedule-free: the final model is x (see save())
  const bool final_eval = a_.evaluates_at_end() && streams_.validation;
  const bool best = final_model_is_best();
  if (best)
    finish_with_best();
  else if (final_eval && (r_.evals.empty() || st_.log_history.back().value("step", int64_t{-1}) != total ||
                          !st_.log_history.back().contains("eval_loss")))
    evaluate_at(total, false);  // on every rank: the evaluation is split across them
  if (full_) full_->drain();
  if (!main_) {  // the final model's fp32 weights: every rank takes part in their gathers
    if (ShardedOptimizer* z = gathered_masters(); z && !best) take_part_in_save(*z);
    return;
  }
  if (st_.skipped_steps > 0)
    std::fprintf(stderr,
                 "train: %lld of %lld fp16 steps skipped for inf/nan gradients (final loss scale %g)\n",
                 static_cast<long long>(st_.skipped_steps), static_cast<long long>(total), mp_->loss_scale());
  nlohmann::json all = results_json();
  write_json(fs::path(a_.output_dir) / "train_results.json", all);
  if (final_eval) {
    auto e = r_.evals.back().to_json();
    e["epoch"] = sched_.epoch(total);
    write_json(fs::path(a_.output_dir) / "eval_results.json", e);
    all.update(e);
  }
  write_json(fs::path(a_.output_dir) / "all_results.json", all);
  if (best) {
    copy_model_files(st_.best_model_checkpoint, a_.output_dir);
  } else {
    const auto weights = saved_weights(*mp_, gathered_masters());  // the final model in fp32, as HF saves it
    models::save_pretrained(*model_, a_.output_dir, "5GB", weights ? &*weights : nullptr);
  }
  if (tok_) tok_->save_pretrained(a_.output_dir);
  // HF: with save_total_limit 1 the best checkpoint alone stays (only when it is there to stay).
  if (a_.save_total_limit == 1 && !st_.best_model_checkpoint.empty() &&
      fs::is_directory(st_.best_model_checkpoint))
    keep_only_checkpoint(a_.output_dir, st_.best_model_checkpoint);
  draw_curves();
  write_json(fs::path(a_.output_dir) / "trainer_state.json",
             {{"global_step", total},
              {"epoch", sched_.epoch(total)},
              {"max_steps", total},
              {"num_train_epochs", a_.num_train_epochs},
              {"logging_steps", sched_.log_every},
              {"eval_steps", sched_.eval_every},
              {"save_steps", sched_.save_every},
              {"train_batch_size", a_.per_device_train_batch_size},
              {"world_size", st_.world_size},
              {"skipped_steps", st_.skipped_steps},
              {"num_input_tokens_seen", st_.num_input_tokens_seen},
              {"best_metric", st_.has_best ? nlohmann::json(st_.best_metric) : nlohmann::json(nullptr)},
              {"best_global_step",
               st_.best_global_step > 0 ? nlohmann::json(st_.best_global_step) : nlohmann::json(nullptr)},
              {"best_model_checkpoint", st_.best_model_checkpoint.empty()
                                            ? nlohmann::json(nullptr)
                                            : nlohmann::json(st_.best_model_checkpoint)},
              {"log_history", st_.log_history}});
}

}  // namespace detail

namespace {

using detail::resume_dir;
using detail::Run;

// An output_dir holding another run is refused unless the user says what to do with it. Under
// --overwrite_output_dir the earlier run's checkpoints are set aside (renamed: no resume, elastic restarts
// included, finds them) and deleted once this run has started (Run::remove_stale_checkpoints).
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
  std::vector<std::string> names;  // listed first: the renames change the folder being read
  for (const auto& e : fs::directory_iterator(a.output_dir))
    if (e.is_directory() && e.path().filename().string().rfind("checkpoint-", 0) == 0)
      names.push_back(e.path().filename().string());
  for (const std::string& n : names) {
    const fs::path from = fs::path(a.output_dir) / n, aside = fs::path(a.output_dir) / (kSetAside + n);
    std::error_code ec;
    fs::remove_all(aside, ec);  // one set aside by an earlier attempt that never started
    fs::rename(from, aside, ec);
    TR_CHECK(!ec, "--overwrite_output_dir: cannot set {} aside ({})", from.string(), ec.message());
  }
}

// A single process's run that fails to start (a model, data or flag that does not load) gives the earlier
// run's checkpoints their names back. A launched group does not: the launcher's restart would resume them.
class SetAsideCheckpoints {
 public:
  SetAsideCheckpoints(std::string dir, bool restore) : dir_(std::move(dir)), restore_(restore) {}
  ~SetAsideCheckpoints() {
    std::error_code ec;
    if (!restore_ || !fs::is_directory(dir_, ec)) return;
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_, ec))
      if (e.path().filename().string().rfind(kSetAside, 0) == 0)
        names.push_back(e.path().filename().string());
    for (const std::string& n : names) {
      const fs::path back = fs::path(dir_) / n.substr(std::strlen(kSetAside));
      if (!fs::exists(back, ec)) fs::rename(fs::path(dir_) / n, back, ec);
    }
  }
  SetAsideCheckpoints(const SetAsideCheckpoints&) = delete;
  SetAsideCheckpoints& operator=(const SetAsideCheckpoints&) = delete;

 private:
  std::string dir_;
  bool restore_;
};

// HF's default logging_dir (output_dir/runs/<time>_<host>); a resumed run keeps the one its output_dir's
// training_args.json names, so its new event file joins the old ones in one TensorBoard run.
void resolve_logging_dir(TrainingArguments& a, bool resuming) {
  if (!a.logging_dir.empty()) return;
  const fs::path saved = fs::path(a.output_dir) / "training_args.json";
  if (resuming && fs::exists(saved)) {
    const auto j = nlohmann::json::parse(std::ifstream(saved), nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("logging_dir") && j["logging_dir"].is_string() &&
        !j["logging_dir"].get<std::string>().empty()) {
      a.logging_dir = j["logging_dir"].get<std::string>();
      return;
    }
  }
  a.logging_dir = report::default_logging_dir(a.output_dir);
}

}  // namespace

TrainResult train(const TrainingArguments& flags, const TrainHooks& hooks) {
  // --deepspeed: the config's ZeRO stage, optimizer and checks applied to the flags first (HF does it in
  // TrainingArguments.__post_init__), so everything below sees the run it describes.
  const dist::DistEnv env = dist::read_dist_env();
  std::vector<std::string> notes;
  const TrainingArguments given = apply_deepspeed_config(flags, env.world_size, &notes);
  if (env.is_main())
    for (const auto& n : notes) std::fprintf(stderr, "train: --deepspeed: %s\n", n.c_str());
  given.validate();
  (void)read_fsdp_config(
      given.fsdp_config);  // read by every run, as HF's arguments do: a bad file fails here
  const auto group = join_group(given);
  const TrainingArguments args = elastic_resume(given, group.get());
  // --tf32: f32 matmuls read TF32 inputs (tensor cores on a GPU; emulated by rounding on the CPU); unset,
  // compile turns it on for a GPU run as HF's does.
  backend::Tf32Scope tf32(args.tf32_on(training_device(args)));
  TrainingArguments compile_args = args;
  compile_args.apply_compile_defaults();  // a mode alone turns compile on
  backend::GemmAutotuneScope autotune(compile_args.compile_autotunes());
  const bool resuming = !args.resume_from_checkpoint.empty() && args.resume_from_checkpoint != "false";
  // Before anything in output_dir is read or replaced: a second trainer on the same folder is refused.
  // Rank 0 holds the lock for the run; the others start once it has checked and cleaned the folder.
  std::optional<OutputDirLock> lock;
  if (!group || group->rank() == 0) {
    lock.emplace(args.output_dir);
    check_output_dir(args, resuming);
  }
  const SetAsideCheckpoints set_aside(args.output_dir, !group);
  if (group) group->barrier();
  if (group && zero_stage(args) > 0) check_shared_output_dir(*group, args.output_dir, fsdp_strategy(args));
  TrainingArguments a = args;
  a.apply_compile_defaults();
  resolve_logging_dir(a, resuming);
  // An automatic batch keeps the out-of-memory retries as its safety net, as auto_find_batch_size does.
  const bool auto_batch = a.per_device_train_batch_size == kAutoBatch;
  if (auto_batch) a.auto_find_batch_size = true;
  resolve_batch(a, resuming ? resume_dir(a) : std::string());
  const int64_t effective = a.per_device_train_batch_size * a.gradient_accumulation_steps;
  if (resuming && a.auto_find_batch_size) {  // continue with the batch split the search settled on (as HF)
    const auto [bs, ga] = saved_batch_split(resume_dir(a));
    if (bs > 0 && ga > 0 && bs * ga == effective) {
      a.per_device_train_batch_size = bs;
      a.gradient_accumulation_steps = ga;
    }
  }
  int64_t predicted = 0;  // the estimate's peak for the split it chose (auto_find_batch_size with a budget)
  // (A split model has no one-device estimate: its search is the OOM retries alone.)
  if (a.auto_find_batch_size && !resuming && !auto_batch && a.device_map.empty())
    predicted = predict_batch_split(a, effective);
  // TRAINER_ALLOCATOR_TRACE: the training device's allocations as a trace (core/allocation_trace.h).
  const auto trace = AllocationTrace::from_environment(
      nullptr, group && group->rank() > 0 ? fmt::format(".rank{}", group->rank()) : std::string());
  std::optional<ObserveAllocations> traced;
  if (trace) traced.emplace(ops::allocator_for(training_device(a)), *trace);
  for (int64_t retries = 0;; ++retries) {
    try {
      TrainResult r = Run(a, hooks, group.get()).train();
      r.batch_retries = retries;
      return r;
    } catch (const OutOfMemoryError& e) {
      if (!a.auto_find_batch_size) throw;
      const int64_t bs = smaller_batch(a.per_device_train_batch_size, effective);
      if (bs == 0) throw;
      // A wrong prediction says by how much: the estimate against what was in use when the allocation failed.
      const std::string note =
          predicted > 0 ? fmt::format("; the estimate predicted a peak of {:.3f} GiB for this split",
                                      static_cast<double>(predicted) / (1 << 30))
                        : "";
      predicted = 0;
      std::fprintf(
          stderr,
          "\nauto_find_batch_size: out of memory with per_device_train_batch_size %lld (%s%s); retrying "
          "with %lld and gradient_accumulation_steps %lld (effective batch %lld kept)\n",
          static_cast<long long>(a.per_device_train_batch_size), e.what(), note.c_str(),
          static_cast<long long>(bs), static_cast<long long>(effective / bs),
          static_cast<long long>(effective));
      a.per_device_train_batch_size = bs;
      a.gradient_accumulation_steps = effective / bs;
      ops::allocator_for(training_device(a)).empty_cache();
    }
  }
}

}  // namespace tr::train
