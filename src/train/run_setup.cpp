// The set-up of a training run (run.h): model, data, optimizer, mixed precision, sharding, resumed state,
// the run's logs - everything before the first step.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <utility>

#include "core/file_writer.h"
#include "dist/env.h"
#include "ops/ops.h"
#include "optim/galore.h"
#include "train/batch_size.h"
#include "train/ddp.h"
#include "train/deepspeed_config.h"
#include "train/run.h"
#include "train/zero.h"

namespace tr::train::detail {

namespace fs = std::filesystem;

// Checked: a full disk is an error naming the file and the reason, never a silently truncated result.
void write_json(const fs::path& p, const nlohmann::json& j) { write_file(p.string(), j.dump(2) + "\n"); }

// The checkpoint --resume_from_checkpoint names ("true": the newest in output_dir), or "" for a fresh run.
std::string resume_dir(const TrainingArguments& a) {
  if (a.resume_from_checkpoint.empty() || a.resume_from_checkpoint == "false") return "";
  if (a.resume_from_checkpoint != "true") {
    TR_CHECK(fs::is_directory(a.resume_from_checkpoint),
             "--resume_from_checkpoint {}: no such checkpoint folder (true: the newest checkpoint-N in "
             "--output_dir)",
             a.resume_from_checkpoint);
    return a.resume_from_checkpoint;
  }
  const std::string last = latest_checkpoint(a.output_dir);
  TR_CHECK(!last.empty(), "--resume_from_checkpoint true: no checkpoint-N folder in {}", a.output_dir);
  return last;
}

namespace {

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

// The run's first acts: output_dir made, the tokenizer read (its errors come before the model's).
std::optional<tokenizers::Tokenizer> start_run(const TrainingArguments& a) {
  make_directories(a.output_dir, "--output_dir");
  return load_tokenizer_for_data(a);
}
}  // namespace

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
  start();
  if (!a.deepspeed.empty()) ds_ = read_deepspeed_config(a.deepspeed);
  const int stage = group_ ? zero_stage(a) : 0;
  if (main_ && !group_ && !a.fsdp.empty())  // as HF's Trainer outside a distributed launch
    std::fprintf(stderr,
                 "train: note: %s shards across launched processes (WORLD_SIZE > 1); one process trains "
                 "unsharded\n",
                 (a.deepspeed.empty() ? "--fsdp " + a.fsdp : "--deepspeed's ZeRO stage").c_str());
  std::optional<models::DeferredModel> deferred = build_model(stage);
  build_optimizer(stage, deferred);
  open_logs();
}

// This run's set-up peak (and a GPU's reserved one) start here, not at an earlier attempt's
// (auto_find_batch_size's retries) or an earlier run's in the same process; its compute dtype is chosen.
void Run::start() {
  ops::allocator_for(dev_).reset_peak();
  ops::allocator_for(dev_).reset_peak_reserved();
  if (a_.device_map == "auto" && !a_.max_memory.empty())  // a split's host partitions (a GPU's is dev_)
    for (const auto& b : models::parse_device_memory(a_.max_memory, "max_memory"))
      if (b.device.is_cpu()) ops::allocator_for(b.device).reset_peak();
  // Mixed precision: the model computes in half precision, the optimizer updates fp32 masters.
  // --torch_dtype bfloat16: the model's own weights bf16, computing in bf16 as under --bf16.
  // Under DDP each rank's bf16 gradients are averaged in f32 buckets and rounded once.
  half_weights_ = trains_half_weights(a_, resume_);
  compute_ = a_.bf16 || half_weights_ ? DType::bf16 : a_.fp16 ? DType::f16 : DType::f32;
  if (main_ && compute_ != DType::f32)  // once per run: how this CPU computes half-precision matmuls
    if (const std::string note = ops::gemm_precision_note(dev_, compute_); !note.empty())
      std::fprintf(stderr, "train: note: %s\n", note.c_str());
}

// The model (whole, or made one parameter at a time for a sharded run), where it runs, and the data.
std::optional<models::DeferredModel> Run::build_model(int stage) {
  // A sharded run that keeps no whole fp32 model (ZeRO-3, or ZeRO-2 under mixed precision) makes it one
  // parameter at a time (build_shard below). Every rank makes the same values, so nothing is broadcast.
  std::optional<models::DeferredModel> deferred;
  if (stage == 3 || (stage == 2 && compute_ != DType::f32))
    deferred = load_deferred_model(a_, resume_, init_gen_, dev_, tok_ ? tok_->vocab_size() : 0);
  if (deferred) {
    model_ = std::move(deferred->model);
  } else {
    model_ = load_model(a_, resume_, init_gen_, dev_, tok_ ? tok_->vocab_size() : 0,
                        half_weights_ ? DType::bf16 : DType::f32);
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
           a_.tokenizer_name.empty() ? a_.model_name_or_path : a_.tokenizer_name,
           tok_ ? tok_->vocab_size() : 0, vocab_);
  TR_CHECK(a_.block_size <= model_->config().max_position_embeddings,
           "--block_size {} exceeds the model's {} positions", a_.block_size,
           model_->config().max_position_embeddings);
  streams_ = load_streams(a_, tok_ ? &*tok_ : nullptr, vocab_, a_.evaluates(), group_);
  loader_ = make_loader();
  sched_ = make_schedule(a_, loader_->batches_per_epoch());
  return deferred;
}

// The optimizer: ZeRO's sharded one (with its shard built from a deferred model) or the plain one over
// mixed precision's fp32 masters; ZeRO-3's layer hooks.
void Run::build_optimizer(int stage, std::optional<models::DeferredModel>& deferred) {
  optim::OptimizerOptions oo = optimizer_options(a_);
  oo.decay_all = ds_ && ds_->has_optimizer;
  oo.warmup_steps = sched_.warmup;  // a --warmup_steps ratio as the steps it stands for
  oo.linear_weights = model_->linear_weight_names();
  // ZeRO-2/3: this rank's slices of the fp32 weights, taken before mixed precision makes the half weights.
  // A deferred model is made one parameter at a time (build_shard: slices kept, the half copy or, ZeRO-3,
  // released storage in its place); a whole one gives its slices up at construction and MixedPrecision
  // drops each f32 tensor as its half copy is made. ZeRO-3 then releases the parameters: from here on a
  // layer's weights exist only while it runs.
  const bool zero = stage > 0;
  if (zero) {
    // Hybrid sharding: ZeRO within each node, the node's gradient shard summed with the other nodes'.
    if (hybrid_sharding(a_)) hybrid_ = hybrid_groups(*group_, dist::read_dist_env());
    // --fsdp offload: the shard (masters, summed gradients, optimizer state) in host memory, updated there;
    // a CPU run keeps it there already.
    const bool offload = a_.fsdp_has("offload") && !dev_.is_cpu();
    const int64_t host_free = offload ? host_memory_available() : 0;  // before this node's ranks take theirs
    if (main_ && a_.fsdp_has("offload") && !offload)
      std::fprintf(stderr,
                   "train: --fsdp offload: the run is on the host, where the shard is already: nothing "
                   "to move\n");
    auto z = std::make_unique<ShardedOptimizer>(
        hybrid_.shard ? *hybrid_.shard : *group_, model_->named_parameters(), a_.optim, oo,
        a_.ddp_bucket_cap_mb << 20, compute_ != DType::f32, stage,
        deferred ? std::optional(dev_) : std::nullopt, offload ? std::optional(Device::cpu()) : std::nullopt);
    z->set_replicas(hybrid_.replicas.get());
    if (offload) note_offload(*z, host_free);
    if (deferred) {
      // Read from a checkpoint (fresh init is the same on every rank by construction): checked to agree.
      const std::string dir = !resume_.empty() ? resume_ : a_.model_name_or_path;
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
  mp_ = std::make_unique<MixedPrecision>(model_->named_parameters(), compute_, a_.fp16,
                                         zero && compute_ != DType::f32, half_weights_);
  model_->set_dtype(compute_);
  if (!zero) opt_ = optim::make_optimizer(a_.optim, mp_->master_params(), oo);
  if (stage == 3) {
    full_ = std::make_unique<FullShard>(static_cast<ShardedOptimizer&>(*opt_), model_->named_parameters(),
                                        a_.ddp_bucket_cap_mb << 20, read_fsdp_config(a_.fsdp_config));
    model_->set_layer_hooks(full_.get());
  }
}

// The state (a resumed one), the metrics and event files, the banner.
void Run::open_logs() {
  st_.train_tokens = streams_.train->size();
  st_.train_batch_size = a_.per_device_train_batch_size;
  st_.gradient_accumulation_steps = sched_.ga;
  lr_ = std::make_unique<LrSchedule>(a_.lr_scheduler_type, a_.lr_scheduler_kwargs, a_.learning_rate);
  if (ds_) use_deepspeed_config();
  if (!resume_.empty()) resume();
  st_.world_size = group_ ? group_->size() : 1;
  if (main_) {
    metrics_ = std::make_unique<MetricsLog>(a_.output_dir, !resume_.empty(), st_.global_step);
    write_json(fs::path(a_.output_dir) / "training_args.json", a_.to_json());
  }
  if (main_ &&
      a_.reports_tensorboard()) {  // as HF's TensorBoardCallback: the arguments and model config as text
    tb_ = std::make_unique<report::TensorBoardLog>(a_.logging_dir, resume_.empty() ? -1 : st_.global_step);
    tb_->text("args", a_.to_json().dump(2));
    tb_->text("model_config", model_->config().to_json().dump(2));
  }
  if (main_) announce();
  r_.per_device_train_batch_size = a_.per_device_train_batch_size;
  r_.gradient_accumulation_steps = sched_.ga;
  if (streams_.validation)
    r_.unigram_baseline = unigram_cross_entropy(*streams_.train, *streams_.validation, vocab_);
}

// A --deepspeed config's scheduler (its step counts checked against the run's, HF's finalize) and fp16
// loss scaler in place of the flags' (apply_deepspeed_config has mapped the rest onto them).
void Run::use_deepspeed_config() {
  const DeepSpeedConfig& ds = *ds_;
  if (ds.schedule) {
    check_deepspeed_steps(ds, sched_.warmup, sched_.total);
    lr_ = std::make_unique<LrSchedule>(*ds.schedule, a_.learning_rate);
  }
  if (a_.fp16 && ds.initial_scale) {
    mp_->scaler().scale = *ds.initial_scale;
    mp_->scaler().deepspeed = ds.scaling;
  }
}

std::unique_ptr<data::DataLoader> Run::make_loader() {
  data::DatasetOptions dopt;
  dopt.block_size = a_.block_size;
  dopt.seed = a_.data_seed >= 0 ? static_cast<uint64_t>(a_.data_seed) : a_.seed;  // HF's data_seed
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
  if (a_.dataloader_prefetch_factor > 0)
    lopt.prefetch_factor = static_cast<int>(a_.dataloader_prefetch_factor);
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
  TR_CHECK(st_.position.batch <= loader_->batches_per_epoch(),
           "{}: data_position.batch {} is past the {} batches of an epoch of this data (a damaged file, or a "
           "different --train_file or batch size?)",
           state_file, st_.position.batch, loader_->batches_per_epoch());
  st_.train_tokens = streams_.train->size();
  // best_model_checkpoint names this output_dir's checkpoint of that step (the folder may have moved since;
  // a name that is no checkpoint's is dropped), as HF rebuilds it from best_global_step at each save.
  if (!st_.best_model_checkpoint.empty()) {
    const int64_t n = checkpoint_step(fs::path(st_.best_model_checkpoint).filename().string());
    st_.best_model_checkpoint =
        n > 0 ? (fs::path(a_.output_dir) / ("checkpoint-" + std::to_string(n))).string() : std::string();
  }
  if (lr_->kind() == LrScheduleKind::reduce_lr_on_plateau && !st_.plateau.is_null())
    lr_->plateau().read_json(st_.plateau, (fs::path(resume_) / "scheduler.json").string());
  if (a_.ignore_data_skip) {  // HF's: the epochs trained still count, the batches of this one are not skipped
    st_.position.batch = 0;
    if (main_)
      std::fprintf(stderr, "train: --ignore_data_skip: epoch %lld's data starts from its first batch\n",
                   static_cast<long long>(st_.position.epoch));
  }
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
      "train: %s%s, %.1fM parameters, %s, optim %s; %lld tokens; %lld optimizer steps of %lld x %lld x %lld "
      "tokens%s\n",
      a_.run_name.empty() ? "" : (a_.run_name + ": ").c_str(), model_->config().model_type.c_str(),
      model_->num_parameters() / 1e6,
      half_weights_ ? "bf16 weights (no fp32 masters)" : dtype_name(compute_).data(), a_.optim.c_str(),
      static_cast<long long>(streams_.train->size()), static_cast<long long>(sched_.total),
      static_cast<long long>(sched_.ga), static_cast<long long>(a_.per_device_train_batch_size),
      static_cast<long long>(a_.block_size), world.c_str());
  if (group_ && !group_->rendezvous().empty())
    std::fprintf(stderr, "train: %s\n", group_->rendezvous().c_str());
  // HF leaves the scheduler in place and its docs recommend constant; say what the run gets.
  if (a_.optim.rfind("schedule_free_", 0) == 0 && lr_->kind() != LrScheduleKind::constant)
    std::fprintf(stderr,
                 "train: note: %s averages its iterates instead of following a schedule, yet "
                 "--lr_scheduler_type %s still scales its rate each step (as HF's Trainer does); "
                 "schedulefree recommends constant%s\n",
                 a_.optim.c_str(), a_.lr_scheduler_type.c_str(),
                 a_.optim == "schedule_free_radam" ? "" : " (its own warm-up is --warmup_steps)");
  const std::string unused = optim::unused_flags_note(a_.optim, optimizer_options(a_));
  if (!unused.empty()) std::fprintf(stderr, "train: note: %s\n", unused.c_str());
  if (opt_->updates_in_backward()) {
    std::fprintf(
        stderr,
        "train: %s updates each parameter during backward as its gradient is final and drops the "
        "gradient (%s)%s\n",
        a_.optim.c_str(),
        sched_.ga > 1 ? "every micro-batch's backward updates, as lomo_optim's fused_backward"
                      : "the model's gradients never exist together",
        a_.max_grad_norm > 0
            ? fmt::format("; --max_grad_norm {} is not applied: no global norm exists before the "
                          "updates (HF's clipping then finds no gradients); grad_norm logs the norm of "
                          "the gradients the updates used",
                          a_.max_grad_norm)
                  .c_str()
            : "");
  }
  if (const auto* g = dynamic_cast<const optim::GaLore*>(opt_.get())) {
    const auto names = g->projected();
    std::fprintf(stderr, "train: %s projects %zu of %zu linear weights (%s ... %s)\n", a_.optim.c_str(),
                 names.size(), model_->linear_weight_names().size(), names.front().c_str(),
                 names.back().c_str());
  }
}

}  // namespace tr::train::detail
