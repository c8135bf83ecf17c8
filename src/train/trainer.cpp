// The training loop; see trainer.h.
#include "train/trainer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <utility>

#include "backend/backend.h"
#include "backend/cuda_api.h"
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
#include "train/dist_setup.h"
#include "train/zero.h"
#include "train/zero3.h"
#include "train/schedule.h"
#include "train/setup.h"

namespace tr::train {

namespace fs = std::filesystem;

namespace {

using clock = std::chrono::steady_clock;

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

// --fsdp offload on a GPU: the shard's host memory, made now (the GPU's peak does not see it), said once per
// node with what this node's ranks take together against what the host had available before they began.
void note_offload(ShardedOptimizer& z, int64_t host_free) {
  z.allocate_state();
  const dist::DistEnv env = dist::read_dist_env();
  if (env.local_rank != 0) return;
  const double gib = 1 << 30, mine = static_cast<double>(z.shard_bytes()) / gib;
  const double node = mine * env.local_world_size, free = static_cast<double>(host_free) / gib;
  std::fprintf(
      stderr,
      "train: --fsdp offload: fp32 masters, gradient shard and optimizer state in host memory, updated "
      "there: %.2f GiB per rank, %.2f GiB for this node's %d ranks (%.2f GiB available)\n",
      mine, node, env.local_world_size, free);
  if (host_free > 0 && node > free)
    std::fprintf(stderr,
                 "train: warning: --fsdp offload needs more host memory than this node has available; expect "
                 "swapping or the OOM killer (more nodes, or full_shard without offload, shrink it)\n");
}

// One call of train(): what is set up before the first step (model, data, optimizer, resumed state) and
// the loop around the step - logging, evaluation, saving, stopping - and the files of a finished run.
class Run {
 public:
  // `group`: the ranks of a distributed run (null: one process). Rank 0 alone writes files and prints.
  Run(const TrainingArguments& a, const TrainHooks& hooks, dist::ProcessGroup* group);
  TrainResult train();

 private:
  std::unique_ptr<data::DataLoader> make_loader();
  void resume();
  void announce() const;
  std::vector<data::Batch> next_micro_batches();
  void after_step(int64_t step, const StepResult& s, double lr, int64_t start_step);
  void evaluate_at(int64_t step);
  void log(const nlohmann::json& entry);
  void save();
  void save_files();
  ShardedOptimizer* gathered_masters() const;
  void finish();
  void draw_curves();
  bool stop_requested();

  const TrainingArguments& a_;
  const TrainHooks& hooks_;
  dist::ProcessGroup* group_;
  bool main_;                                 // rank 0 (or the only process)
  std::optional<tokenizers::Tokenizer> tok_;  // none: token shards without a tokenizer
  std::string resume_;
  Device dev_;
  Generator init_gen_;
  std::unique_ptr<models::CausalLM> model_;
  int64_t vocab_ = 0;
  Streams streams_;
  std::unique_ptr<data::DataLoader> loader_;
  Schedule sched_;
  DType compute_ = DType::f32;
  std::unique_ptr<MixedPrecision> mp_;
  HybridGroups hybrid_;  // hybrid sharding: the node's shard group and the replicas across nodes
  std::unique_ptr<optim::Optimizer> opt_;
  std::unique_ptr<FullShard> full_;  // ZeRO-3: the model's layer hooks (destroyed before the model is used)
  TrainerState st_;
  Generator dropout_gen_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<report::TensorBoardLog> tb_;  // with --report_to tensorboard
  std::unique_ptr<StepWindow> window_;
  TrainResult r_;
  double eval_seconds_ = 0;  // kept out of the training throughput
  int64_t tokens_ = 0;
  clock::time_point train_start_;
};

// The run's first acts: output_dir made, the tokenizer read (its errors come before the model's).
std::optional<tokenizers::Tokenizer> start_run(const TrainingArguments& a) {
  fs::create_directories(a.output_dir);
  return load_tokenizer_for_data(a);
}

Run::Run(const TrainingArguments& a, const TrainHooks& hooks, dist::ProcessGroup* group)
    : a_(a),
      hooks_(hooks),
      group_(group),
      main_(group == nullptr || group->rank() == 0),
      tok_(start_run(a)),
      resume_(resume_dir(a)),
      dev_(training_device(a)),
      init_gen_(a.seed),
      dropout_gen_(a.seed) {
  // This run's set-up peak (and a GPU's reserved one) start here: not an earlier attempt's
  // (auto_find_batch_size's retries) or an earlier run's in the same process.
  ops::allocator_for(dev_).reset_peak();
  ops::allocator_for(dev_).reset_peak_reserved();
  if (a.device_map == "auto" && !a.max_memory.empty())  // a split's host partitions (a GPU's is dev_)
    for (const auto& b : models::parse_device_memory(a.max_memory, "max_memory"))
      if (b.device.is_cpu()) ops::allocator_for(b.device).reset_peak();
  // Mixed precision: the model computes in half precision, the optimizer updates fp32 masters.
  compute_ = a.bf16 ? DType::bf16 : a.fp16 ? DType::f16 : DType::f32;
  if (main_ && compute_ != DType::f32)  // once per run: how this CPU computes half-precision matmuls
    if (const std::string note = ops::gemm_precision_note(dev_, compute_); !note.empty())
      std::fprintf(stderr, "train: note: %s\n", note.c_str());
  const int stage = group_ ? zero_stage(a) : 0;
  if (main_ && !group_ && !a.fsdp.empty())  // as HF's Trainer outside a distributed launch
    std::fprintf(
        stderr,
        "train: note: --fsdp %s shards across launched processes (WORLD_SIZE > 1); one process trains "
        "unsharded\n",
        a.fsdp.c_str());
  // A sharded run that keeps no whole fp32 model (ZeRO-3, or ZeRO-2 under mixed precision) makes it one
  // parameter at a time (build_shard below). Every rank makes the same values, so nothing is broadcast.
  std::optional<models::DeferredModel> deferred;
  if (stage == 3 || (stage == 2 && compute_ != DType::f32))
    deferred = load_deferred_model(a, resume_, init_gen_, dev_, tok_ ? tok_->vocab_size() : 0);
  if (deferred) {
    model_ = std::move(deferred->model);
  } else {
    model_ = load_model(a, resume_, init_gen_, dev_, tok_ ? tok_->vocab_size() : 0);
    if (group_)
      broadcast_parameters(*group_, model_->named_parameters());  // DDP: rank 0's weights everywhere
  }
  if (!model_->placement().single()) {  // device_map auto split the model (validate() refused the rest)
    TR_CHECK(group_ == nullptr,
             "--device_map auto under a launcher ({} processes): each process would split its own replica; "
             "shard across the processes with --fsdp full_shard instead",
             group_ ? group_->size() : 1);
    dev_ = model_->device();  // the batches go where the embeddings are
    if (main_)
      std::printf(
          "device_map auto: %s; trained as a naive pipeline (one device busy at a time, as HF does): "
          "--fsdp full_shard across processes keeps every GPU busy\n",
          model_->placement().summary().c_str());
  }
  vocab_ = model_->config().vocab_size;
  TR_CHECK(!tok_ || tok_->vocab_size() <= vocab_,
           "tokenizer {} has {} tokens, more than the model's vocab_size {}",
           a.tokenizer_name.empty() ? a.model_name_or_path : a.tokenizer_name, tok_ ? tok_->vocab_size() : 0,
           vocab_);
  TR_CHECK(a.block_size <= model_->config().max_position_embeddings,
           "--block_size {} exceeds the model's {} positions", a.block_size,
           model_->config().max_position_embeddings);
  streams_ = load_streams(
      a, tok_ ? &*tok_ : nullptr, vocab_,
      a.do_eval || parse_interval_strategy(a.eval_strategy, "eval_strategy") != IntervalStrategy::no, group_);
  loader_ = make_loader();
  sched_ = make_schedule(a, loader_->batches_per_epoch());
  optim::OptimizerOptions oo;
  oo.lr = a.learning_rate;
  oo.beta1 = a.adam_beta1;
  oo.beta2 = a.adam_beta2;
  oo.eps = a.adam_epsilon;
  oo.weight_decay = a.weight_decay;
  oo.args = optim::parse_optim_args(a.optim_args);
  // ZeRO-2/3: this rank's slices of the fp32 weights, taken before mixed precision makes the half weights.
  // A deferred model is made one parameter at a time (build_shard: slices kept, the half copy or, ZeRO-3,
  // released storage in its place); a whole one gives its slices up at construction and MixedPrecision
  // drops each f32 tensor as its half copy is made. ZeRO-3 then releases the parameters: from here on a
  // layer's weights exist only while it runs.
  const bool zero = stage > 0;
  if (zero) {
    // Hybrid sharding: ZeRO within each node, the node's gradient shard summed with the other nodes'.
    if (hybrid_sharding(a)) hybrid_ = hybrid_groups(*group_, dist::read_dist_env());
    // --fsdp offload: the shard (masters, summed gradients, optimizer state) in host memory, updated there;
    // a CPU run keeps it there already.
    const bool offload = a.fsdp_has("offload") && !dev_.is_cpu();
    const int64_t host_free = offload ? host_memory_available() : 0;  // before this node's ranks take theirs
    if (main_ && a.fsdp_has("offload") && !offload)
      std::fprintf(stderr,
                   "train: --fsdp offload: the run is on the host, where the shard is already: nothing "
                   "to move\n");
    auto z = std::make_unique<ShardedOptimizer>(
        hybrid_.shard ? *hybrid_.shard : *group_, model_->named_parameters(), a.optim, oo,
        a.ddp_bucket_cap_mb << 20, compute_ != DType::f32, stage,
        deferred ? std::optional(dev_) : std::nullopt, offload ? std::optional(Device::cpu()) : std::nullopt);
    z->set_replicas(hybrid_.replicas.get());
    if (offload) note_offload(*z, host_free);
    if (deferred) {
      // Read from a checkpoint (fresh init is the same on every rank by construction): checked to agree.
      const std::string dir = !resume_.empty() ? resume_ : a.model_name_or_path;
      uint64_t hash = 1469598103934665603ull;
      const auto load = [&](size_t i) {
        Tensor t = deferred->load(i);
        if (!dir.empty()) hash = content_hash(t, hash);
        return t;
      };
      build_shard(*z, model_->named_parameters(), load, compute_);
      if (!dir.empty()) check_same_weights(*group_, hash, dir);
    }
    opt_ = std::move(z);
  }
  // Mixed precision: the model computes in half precision, the optimizer updates fp32 masters.
  mp_ = std::make_unique<MixedPrecision>(model_->named_parameters(), compute_, a.fp16,
                                         zero && compute_ != DType::f32);
  model_->set_dtype(compute_);
  if (!zero) opt_ = optim::make_optimizer(a.optim, mp_->master_params(), oo);
  if (stage == 3) {
    full_ = std::make_unique<FullShard>(static_cast<ShardedOptimizer&>(*opt_), model_->named_parameters(),
                                        a.ddp_bucket_cap_mb << 20, read_fsdp_config(a.fsdp_config));
    model_->set_layer_hooks(full_.get());
  }
  st_.train_tokens = streams_.train->size();
  st_.train_batch_size = a.per_device_train_batch_size;
  st_.gradient_accumulation_steps = sched_.ga;
  if (!resume_.empty()) resume();
  st_.world_size = group_ ? group_->size() : 1;
  if (main_) {
    metrics_ = std::make_unique<MetricsLog>(a.output_dir, !resume_.empty(), st_.global_step);
    write_json(fs::path(a.output_dir) / "training_args.json", a.to_json());
  }
  if (main_ &&
      a.reports_tensorboard()) {  // as HF's TensorBoardCallback: the arguments and model config as text
    tb_ = std::make_unique<report::TensorBoardLog>(a.logging_dir, resume_.empty() ? -1 : st_.global_step);
    tb_->text("args", a.to_json().dump(2));
    tb_->text("model_config", model_->config().to_json().dump(2));
  }
  if (main_) announce();
  r_.per_device_train_batch_size = a.per_device_train_batch_size;
  r_.gradient_accumulation_steps = sched_.ga;
  if (streams_.validation)
    r_.unigram_baseline = unigram_cross_entropy(*streams_.train, *streams_.validation, vocab_);
}

std::unique_ptr<data::DataLoader> Run::make_loader() {
  data::DatasetOptions dopt;
  dopt.block_size = a_.block_size;
  dopt.seed = a_.seed;
  dopt.vocab_size = vocab_;
  if (group_) {  // each rank its slice of every global batch: the sample order of one process
    dopt.rank = group_->rank();
    dopt.world_size = group_->size();
    dopt.rank_slice = a_.per_device_train_batch_size;
  }
  TR_CHECK(streams_.train->size() >= a_.block_size, "{}: {} tokens, fewer than one block of --block_size {}",
           a_.train_file, streams_.train->size(), a_.block_size);
  auto ds = std::make_shared<data::SequenceDataset>(streams_.train, dopt);
  data::DataLoaderOptions lopt;
  lopt.batch_size = a_.per_device_train_batch_size;
  lopt.num_workers = static_cast<int>(a_.dataloader_num_workers);
  lopt.pin_memory = a_.dataloader_pin_memory;
  lopt.device = dev_;
  lopt.drop_last = a_.dataloader_drop_last;
  auto loader = std::make_unique<data::DataLoader>(ds, lopt);
  TR_CHECK(loader->batches_per_epoch() >= 1,
           "{}: {} blocks of {} tokens, fewer than one batch of {} (dataloader_drop_last)", a_.train_file,
           ds->num_samples(), a_.block_size, a_.per_device_train_batch_size);
  return loader;
}

void Run::resume() {
  st_ = load_checkpoint_state(resume_, *opt_, *mp_, tok_.has_value());
  // The checks name trainer_state.json, where the values come from (a damaged file reads as a mismatch).
  const std::string state_file = (fs::path(resume_) / "trainer_state.json").string();
  // The data position counts global batches: any world size whose ranks together draw the saved batch
  // continues where the run stopped (DDP state is the same on every rank).
  const int64_t world = group_ ? group_->size() : 1;
  TR_CHECK(
      st_.train_batch_size * st_.world_size == a_.per_device_train_batch_size * world &&
          st_.gradient_accumulation_steps == sched_.ga,
      "{}: saved with per_device_train_batch_size {} x {} process(es) and gradient_accumulation_steps {}; "
      "resume with the same global batch (got {} x {} and {})",
      state_file, st_.train_batch_size, st_.world_size, st_.gradient_accumulation_steps,
      a_.per_device_train_batch_size, world, sched_.ga);
  TR_CHECK(
      st_.train_tokens == 0 || st_.train_tokens == streams_.train->size(),
      "{}: saved while training on {} tokens, this run's training stream has {} (a different --train_file, "
      "--validation_split_percentage or evaluation setting?); the data position would not match",
      state_file, st_.train_tokens, streams_.train->size());
  TR_CHECK(st_.global_step <= sched_.total,
           "{}: global_step {} is past this run's {} optimizer steps (raise --max_steps or "
           "--num_train_epochs to continue)",
           state_file, st_.global_step, sched_.total);
  st_.train_tokens = streams_.train->size();
  loader_->seek(st_.position);
  dropout_gen_.set_state(st_.dropout_rng);
  std::fprintf(stderr, "train: resumed from %s at step %lld\n", resume_.c_str(),
               static_cast<long long>(st_.global_step));
}

void Run::announce() const {
  const int shard = hybrid_.shard ? hybrid_.shard->size() : group_ ? group_->size() : 1;
  const std::string nodes =
      hybrid_.shard
          ? fmt::format(" sharded within each of {} nodes, replicated across them;", hybrid_.replicas->size())
          : "";
  const auto* sharded = dynamic_cast<const ShardedOptimizer*>(opt_.get());
  const std::string offload =
      sharded && sharded->offloaded() ? "; the shard offloaded to host memory and updated there" : "";
  const std::string world =
      !group_ ? ""
      : full_ ? fmt::format(
                    " x {} processes (ZeRO-3 {} over {}:{} parameters, gradients and optimizer state "
                    "1/{} per rank, gathered one decoder layer at a time ({} layers and the root), {} MB per "
                    "collective{})",
                    group_->size(), fsdp_strategy(a_), group_->backend_name(), nodes, shard, full_->layers(),
                    a_.ddp_bucket_cap_mb, offload)
      : sharded ? fmt::format(
                      " x {} processes (ZeRO-2 {} over {}:{} gradients reduce-scattered, optimizer "
                      "state 1/{} per rank, {} MB per collective{})",
                      group_->size(), fsdp_strategy(a_), group_->backend_name(), nodes, shard,
                      a_.ddp_bucket_cap_mb, offload)
                : fmt::format(" x {} processes (DDP over {}, buckets of {} MB)", group_->size(),
                              group_->backend_name(), a_.ddp_bucket_cap_mb);
  std::fprintf(
      stderr,
      "train: %s, %.1fM parameters, %s, optim %s; %lld tokens; %lld optimizer steps of %lld x %lld x %lld "
      "tokens%s\n",
      model_->config().model_type.c_str(), model_->num_parameters() / 1e6, dtype_name(compute_).data(),
      a_.optim.c_str(), static_cast<long long>(streams_.train->size()), static_cast<long long>(sched_.total),
      static_cast<long long>(sched_.ga), static_cast<long long>(a_.per_device_train_batch_size),
      static_cast<long long>(a_.block_size), world.c_str());
  if (group_ && !group_->rendezvous().empty())
    std::fprintf(stderr, "train: %s\n", group_->rendezvous().c_str());
}

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

void Run::evaluate_at(int64_t step) {
  const ops::Range span(dev_, "evaluate");
  EvalResult e;
  try {
    e = evaluate(*model_, streams_.validation, a_.block_size, a_.per_device_eval_batch_size,
                 a_.validation_file.empty() ? a_.train_file + " (validation split)" : a_.validation_file,
                 group_);
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
  st_.dropout_rng = dropout_gen_.state();
  st_.position = loader_->position();
  if (full_) full_->drain();  // the save's gathers share the group with ZeRO-3's: none may be in flight
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
      if (!hybrid_.replicas || hybrid_.replicas->rank() == 0)
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
  r_.cache_releases += s.cache_releases;
  r_.cache_bytes_released += s.cache_bytes_released;
  r_.comm_wait_seconds += s.comm_wait_seconds;
  r_.comm_bytes += s.comm_bytes;
  if (step == start_step) r_.first_loss = s.loss;
  r_.losses.push_back(s.loss);
  r_.last_loss = s.loss;
  window_->add(s.loss);
  if ((step + 1) % sched_.log_every != 0 && step + 1 != sched_.total && !(a_.logging_first_step && step == 0))
    return;
  const double secs = std::chrono::duration<double>(clock::now() - train_start_).count() - eval_seconds_;
  const double tps = tokens_ / secs;
  const double mean = window_->flush(step + 1, lr, s.grad_norm, secs, tps);
  nlohmann::json entry{{"step", step + 1},
                       {"loss", mean},
                       {"learning_rate", lr},
                       {"grad_norm", s.grad_norm},
                       {"epoch", sched_.epoch(step + 1)},
                       {"tokens_per_second", tps}};
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

TrainResult Run::train() {
  StepOptions so;
  so.gradient_checkpointing = a_.gradient_checkpointing;
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
  const StepState ss{*model_, *mp_, *opt_, dropout_gen_, full_.get()};
  if (a_.torch_compile) {
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
  const auto step_fn = a_.torch_compile ? make_compiled_step(ss, so) : make_eager_step(ss, so);
  r_.setup_peak_bytes = ops::allocator_for(dev_).stats().peak_bytes;
  for (const Device d : model_->placement().devices()) ops::allocator_for(d).reset_peak();
  ops::allocator_for(dev_).reset_peak();
  const int64_t start_step = st_.global_step, total = sched_.total;
  window_ = std::make_unique<StepWindow>(start_step, total, main_);
  train_start_ = clock::now();
  for (int64_t step = start_step; step < total; ++step) {
    const double lr = lr_at(a_.lr_scheduler_type, a_.learning_rate, st_.scheduler_step, sched_.warmup, total);
    const StepResult s = step_fn->run(step, next_micro_batches(), lr);
    after_step(step, s, lr, start_step);
    if (streams_.validation && sched_.evaluates_after(step)) {
      step_fn->release_memory();
      evaluate_at(step + 1);
    }
    const bool stop = stop_requested();
    if (sched_.saves_after(step) || stop) {
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
  r_.seconds = std::chrono::duration<double>(clock::now() - train_start_).count() - eval_seconds_;
  r_.tokens_per_second = tokens_ / r_.seconds;
  r_.train_loss = window_->counted_sum() / std::max<int64_t>(1, r_.steps);
  r_.skipped_steps = st_.skipped_steps;
  r_.compiled_shapes = step_fn->captured_shapes();
  r_.planned_peak_bytes = step_fn->planned_peak_bytes();
  r_.replayed_peak_bytes = step_fn->replayed_peak_bytes();
  r_.device_graph_captures = step_fn->device_graph_captures();
  if (const std::string tuned = ops::autotune_summary(dev_); !tuned.empty())
    std::fprintf(stderr, "torch_compile: %s\n", tuned.c_str());
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
  r_.global_step = total;
  r_.world_size = group_ ? group_->size() : 1;
  r_.comm_backend = group_ ? group_->backend_name() : "";
  r_.device_name = dev_.is_cuda() ? backend::cuda_device_name(dev_.index) : "cpu";
  r_.tf32 = backend::allow_tf32();
  const auto& c = model_->config();  // nanoGPT's/PaLM's model FLOPs per token: 6N + 12 L H T
  r_.flops_per_token = 6.0 * static_cast<double>(model_->num_parameters()) +
                       12.0 * c.num_layers * c.num_heads * c.head_dim * a_.block_size;
  if (tb_) r_.logging_dir = a_.logging_dir;
  step_fn->release_memory();
  finish();
  return r_;
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

// The files of a finished run, as HF's Trainer leaves them: results, the final model and tokenizer, state.
void Run::finish() {
  const int64_t total = sched_.total;
  const bool final_eval = a_.do_eval && streams_.validation;
  if (final_eval && (r_.evals.empty() || st_.log_history.back().value("step", int64_t{-1}) != total ||
                     !st_.log_history.back().contains("eval_loss")))
    evaluate_at(total);  // on every rank: the evaluation is split across them
  if (full_) full_->drain();
  if (!main_) {  // the final model's fp32 weights: every rank takes part in their gathers
    if (ShardedOptimizer* z = gathered_masters()) take_part_in_save(*z);
    return;
  }
  if (st_.skipped_steps > 0)
    std::fprintf(stderr,
                 "train: %lld of %lld fp16 steps skipped for inf/nan gradients (final loss scale %g)\n",
                 static_cast<long long>(st_.skipped_steps), static_cast<long long>(total), mp_->loss_scale());
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
  write_json(fs::path(a_.output_dir) / "train_results.json", all);
  if (final_eval) {
    auto e = r_.evals.back().to_json();
    e["epoch"] = sched_.epoch(total);
    write_json(fs::path(a_.output_dir) / "eval_results.json", e);
    all.update(e);
  }
  write_json(fs::path(a_.output_dir) / "all_results.json", all);
  const auto weights = saved_weights(*mp_, gathered_masters());  // the final model in fp32, as HF saves it
  models::save_pretrained(*model_, a_.output_dir, "5GB", weights ? &*weights : nullptr);
  if (tok_) tok_->save_pretrained(a_.output_dir);
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
              {"log_history", st_.log_history}});
}

}  // namespace

TrainResult train(const TrainingArguments& given, const TrainHooks& hooks) {
  given.validate();
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
