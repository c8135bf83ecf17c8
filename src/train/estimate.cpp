// `trainer estimate` on the meta device; see estimate.h.
#include "train/estimate.h"

#include <fmt/format.h>

#include <cctype>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "autograd/node.h"
#include "backend/cuda_api.h"
#include "core/allocator.h"
#include "core/allocation_trace.h"
#include "core/caching_allocator.h"
#include "models/device_map.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "optim/schedule_free.h"
#include "train/checkpoint.h"
#include "train/mixed_precision.h"
#include "train/setup.h"
#include "train/train_step.h"
#include "train/zero.h"
#include "train/dist_setup.h"
#include "train/zero3.h"

namespace tr::train {

namespace {

int64_t bytes_of(const std::vector<Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts)
    if (t.defined()) n += static_cast<int64_t>(t.nbytes());
  return n;
}

// A micro-batch as the DataLoader hands it to the step: one int64 [B, T] tensor on the device (input_ids ==
// labels). No host labels: the step counts a meta batch's labels as B x (T - 1) (packed blocks have no -100),
// so a dry run allocates nothing on the host (where an allocator cap may be set).
data::Batch meta_batch(int64_t batch, int64_t block, Device device) {
  data::Batch b;
  b.input_ids = b.labels = ops::empty({batch, block}, DType::i64, device);
  return b;
}

// Where the meta allocator's peak rose: call mark(label) at the end of each phase.
class PeakTracker {
 public:
  explicit PeakTracker(Allocator& alloc) : alloc_(alloc) {}
  void mark(const std::string& phase) {
    const int64_t peak = alloc_.stats().peak_bytes;
    if (peak > last_) {
      last_ = peak;
      where_ = phase;
    }
  }
  int64_t peak() const { return last_; }
  const std::string& where() const { return where_; }

 private:
  Allocator& alloc_;
  int64_t last_ = 0;
  std::string where_ = "set-up";
};

// The devices a dry run counts: the meta device for one device's step; for a split (device_map auto), meta:k
// standing for each device of the placement, so that each is counted apart as the run counts it.
class DryDevices {
 public:
  // One device: meta.
  DryDevices() { add(Device::meta(), Device::meta()); }
  // A split over `real`'s devices: the host (cpu) stands as meta:1 (a fresh model is made there, as the run
  // makes it on the host before placing it), the others as meta:2, meta:3, ... in the placement's order.
  explicit DryDevices(const models::DevicePlacement& real) : real_placement_(real) {
    for (const Device d : real.devices()) add(d, d == Device::cpu() ? host() : Device::meta(next_++));
    meta_placement_.embeddings = meta_of(real.embeddings);
    meta_placement_.head = meta_of(real.head);
    for (const Device d : real.layers) meta_placement_.layers.push_back(meta_of(d));
  }
  static Device host() { return Device::meta(1); }
  bool split() const { return !real_placement_.layers.empty(); }
  const models::DevicePlacement& real_placement() const { return real_placement_; }
  const models::DevicePlacement& meta_placement() const { return meta_placement_; }
  size_t size() const { return meta_.size(); }
  Device real(size_t i) const { return real_[i]; }
  Device meta(size_t i) const { return meta_[i]; }
  Allocator& allocator(size_t i) const { return meta_allocator(meta_[i].index); }
  Device meta_of(Device real) const {
    for (size_t i = 0; i < real_.size(); ++i)
      if (real_[i] == real) return meta_[i];
    fail("device placement: {} is not one of the split's devices", real.str());
  }
  // Bytes counted since the dry run began.
  int64_t current(size_t i) const { return allocator(i).stats().current_bytes - base_[i]; }
  int64_t peak(size_t i) const { return allocator(i).stats().peak_bytes - base_[i]; }
  std::vector<int64_t> peaks() const {
    std::vector<int64_t> out;
    for (size_t i = 0; i < size(); ++i) out.push_back(peak(i));
    return out;
  }
  void reset_peaks() const {
    for (size_t i = 0; i < size(); ++i) allocator(i).reset_peak();
  }

 private:
  void add(Device real, Device meta) {
    real_.push_back(real);
    meta_.push_back(meta);
    meta_allocator(meta.index).reset_peak();
    base_.push_back(meta_allocator(meta.index).stats().current_bytes);  // the caller's meta tensors
  }
  models::DevicePlacement real_placement_, meta_placement_;
  std::vector<Device> real_, meta_;
  std::vector<int64_t> base_;
  int next_ = 2;
};

// Where a split run places the model (setup.cpp's load_model, from_pretrained's device_map): by its f32
// weights over --max_memory's budgets, found on a model of shapes only. The budgets must name devices of
// the kind --device estimates (and the host).
models::DevicePlacement split_placement(const TrainingArguments& a, const models::ModelConfig& config,
                                        const MemoryTarget& target) {
  TR_CHECK(!a.max_memory.empty(),
           "--device_map auto: the estimate of a split places the model over --max_memory's budgets; give "
           "them (24GB,24GB,cpu:64GB with --device cuda; host partitions cpu:1:8MB,cpu:2:8MB with --device "
           "cpu)");
  TR_CHECK(target.world_size <= 1,
           "--device_map auto with --world_size {}: each process would split its own replica; shard across "
           "the processes with --fsdp full_shard instead",
           target.world_size);
  const auto budgets = models::parse_device_memory(a.max_memory, "max_memory");
  const bool gpu = target.device == MemoryDevice::cuda;
  for (const auto& b : budgets)
    TR_CHECK(b.device == Device::cpu() || b.device.is_cuda() == gpu, "--max_memory {}: {} {}", a.max_memory,
             b.device.str(),
             gpu ? "is a host partition, but --device cuda estimates GPUs: give GPU budgets (24GB,24GB)"
                 : "is a GPU: give --device cuda (or host partitions cpu:1:SIZE with --device cpu)");
  Generator unused(0);
  const auto shapes =
      models::create_causal_lm(config, Device::meta(), DType::f32, unused, a.attn_implementation);
  return models::infer_auto_device_map(*shapes, DType::f32, budgets);
}

// The model as a split run makes a fresh one: initialized whole on the host (meta:1 here), then each
// parameter moved to its device.
std::unique_ptr<models::CausalLM> split_model(const models::ModelConfig& config, const TrainingArguments& a,
                                              const DryDevices& devices, Generator& init) {
  auto model = models::create_causal_lm(config, DryDevices::host(), DType::f32, init, a.attn_implementation);
  models::place_parameters(*model, devices.meta_placement());
  return model;
}

// Rank 0's side of a checkpoint save inside training (Run::save), on the meta devices: the weights written
// one parameter at a time as save_pretrained makes them (a sharded run's fp32 master gathered, GPT-2's
// transposed copy), then the optimizer's state_dict. Returns each device's save peak; `host_extra` counts the
// host tensors state_dict makes (its step counts) on the host's device when the host is one.
std::vector<int64_t> dry_save(models::CausalLM& model, MixedPrecision& mp, optim::Optimizer& opt,
                              ShardedOptimizer* gathered, const DryDevices& devices, bool host_extra,
                              bool with_optimizer) {
  devices.reset_peaks();
  const auto weights = saved_weights(mp, gathered);
  const nn::ParamList params = model.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor value = weights ? weights->parameter(i) : detach(*params[i].second);
    models::hf_tensor(model, params[i].first, value);  // both held while the writer takes the copy
  }
  std::vector<int64_t> peaks = devices.peaks();
  if (with_optimizer) {  // --save_only_model writes none
    const int64_t host = cpu_allocator().stats().current_bytes;
    const auto state = opt.state_dict();
    const int64_t extra = host_extra ? cpu_allocator().stats().current_bytes - host : 0;
    for (size_t i = 0; i < devices.size(); ++i) {
      const bool on_host = !devices.split() || devices.real(i) == Device::cpu();
      peaks[i] = std::max(peaks[i], devices.current(i) + (on_host ? extra : 0));
    }
  }
  return peaks;
}

// The arguments as a run resolves them (less the files estimate does not read) and the model's config.
struct Resolved {
  TrainingArguments a;
  models::ModelConfig config;
  bool grown = false;  // a pretrained model's embeddings grown: the run builds that model whole
};

Resolved resolve(const TrainingArguments& args) {
  Resolved r{args, {}, false};
  TrainingArguments& a = r.a;
  a.apply_compile_defaults();
  TR_CHECK(a.model_name_or_path.empty() == a.from_scratch(),
           "give exactly one of --model_name_or_path (its config.json is read, not its weights) and "
           "--config_name / --model_type");
  // What validate() checks, less the files estimate does not read.
  if (a.output_dir.empty()) a.output_dir = "estimate";
  if (a.train_file.empty()) a.train_file = "(not read)";
  a.total_batch_size.clear();  // the batch and accumulation are taken as given (callers resolved the total)
  a.validate();
  TR_CHECK(a.per_device_train_batch_size > 0,
           "--per_device_train_batch_size auto is chosen against a memory budget: give --device_memory, or a "
           "number");
  // The tokenizer is not read: only --pad_vocab_to_multiple_of can change a fresh model's vocabulary here.
  r.config = a.from_scratch() ? fresh_config(a, 0) : config_for(a.model_name_or_path);
  if (const int64_t m = a.pad_vocab_to_multiple_of; !a.from_scratch() && m > 1) {  // pretrained: grown too
    r.grown = r.config.vocab_size % m != 0;
    r.config.vocab_size = (r.config.vocab_size + m - 1) / m * m;
  }
  TR_CHECK(a.block_size <= r.config.max_position_embeddings,
           "--block_size {} exceeds the model's {} positions", a.block_size,
           r.config.max_position_embeddings);
  return r;
}

// How rank 0 of target.world_size shards: ZeRO-2/3 with its shard's slices, hybrid strategies within a node.
struct Sharding {
  int stage = 0;        // 0: none (one process or DDP)
  int shard_world = 1;  // the ranks a shard is split among
  // The model made one parameter at a time (build_shard), as a run does where no whole fp32 copy is kept.
  bool deferred = false;
  // --fsdp offload on a GPU: the shard on the host's stand-in, so the device's peak leaves it out (a CPU run
  // keeps it where it is).
  bool offload = false;
};

Sharding sharding_for(const TrainingArguments& a, const MemoryTarget& target, DType compute, bool grown) {
  const int world_size = target.world_size;
  Sharding s;
  s.stage = world_size <= 1 ? 0 : zero_stage(a);
  // Hybrid sharding shards among the node's ranks (the replicas' gradient sum moves no memory).
  TR_CHECK(!hybrid_sharding(a) || world_size <= 1 || target.nproc_per_node > 0,
           "--fsdp {} shards within a node: give --nproc_per_node (the ranks per node) with --world_size {}",
           fsdp_strategy(a), world_size);
  const int local = target.nproc_per_node > 0 ? target.nproc_per_node : world_size;
  TR_CHECK(world_size % local == 0, "--nproc_per_node {} does not divide --world_size {}", local, world_size);
  s.shard_world = hybrid_sharding(a) ? local : world_size;
  if (world_size > 1) check_fsdp_flags(a, world_size);  // what a launched run would refuse
  s.deferred = (s.stage == 3 || (s.stage == 2 && compute != DType::f32)) && !grown;
  s.offload = s.stage > 0 && a.fsdp_has("offload") && target.device == MemoryDevice::cuda;
  return s;
}

// One dry run of the training step on the meta devices: set-up, two optimizer steps, an evaluation forward
// and a checkpoint save where the run has them, each phase's peak kept. Members are declared in the order
// the run makes them, so that they are released in the reverse order while the observers still count.
class DryRun {
 public:
  DryRun(Resolved r, const MemoryTarget& target);
  MemoryEstimate estimate();

 private:
  void watch_allocations();
  void build_model();
  void build_optimizer();
  void ddp_buckets();
  void train_steps();
  void evaluate();
  void save();
  void per_device_rows();
  void breakdown();
  Device batch_device() const;
  // Loader workers hold up to prefetch_factor (default 2) queued batches each, plus the one each builds: host
  // memory, the device's when the device is the host (one CPU device, or a split's host part).
  int64_t prefetch_on(size_t i) const;
  int64_t batch_bytes() const { return a_.per_device_train_batch_size * a_.block_size * 8; }

  const TrainingArguments a_;
  const models::ModelConfig config_;
  const bool grown_;
  const MemoryTarget target_;
  const bool half_weights_;  // --torch_dtype bfloat16: the model's own bf16 weights, no fp32 masters
  const DType compute_;
  // device_map auto: each device of the split counted on a meta device of its own.
  const DryDevices devices_;
  // Every allocation, as the CUDA caching allocator would hold it on each device.
  std::vector<std::unique_ptr<CachingAllocatorModel>> caching_;
  std::unique_ptr<AllocationTrace>
      trace_;  // TRAINER_ALLOCATOR_TRACE: the first device's, as a GPU run writes
  std::vector<std::unique_ptr<ObserveAllocations>> observers_;
  MemoryEstimate e_;
  Generator init_, dropout_;
  Sharding sharding_;
  std::function<Tensor(size_t)> load_;
  std::unique_ptr<models::CausalLM> model_;
  std::unique_ptr<dist::ProcessGroup> group_;
  std::unique_ptr<MixedPrecision> mp_;
  ShardedOptimizer* sharded_ = nullptr;  // opt_ when sharded
  std::unique_ptr<optim::Optimizer> opt_;
  std::vector<Tensor> weights_, masters_;
  int64_t weight_bytes_ = 0;
  std::unique_ptr<FullShard> full_;
  std::vector<Tensor> ddp_slots_;
  // The step and what its callbacks report to live as long as the run: the step keeps a few device
  // scalars, counted in the evaluation's and the save's peaks.
  PeakTracker tracker_;  // the embeddings' device: the run's train_peak_memory_gib
  int64_t micro_now_ = 0;
  std::unique_ptr<TrainStep> step_;
  std::vector<int64_t> held_;   // between steps: the persistent state and the step's inputs
  std::vector<int64_t> peaks_;  // each device's peak so far
};

DryRun::DryRun(Resolved r, const MemoryTarget& target)
    : a_(std::move(r.a)),
      config_(std::move(r.config)),
      grown_(r.grown),
      target_(target),
      half_weights_(trains_half_weights(a_, "")),
      compute_(a_.bf16 || half_weights_ ? DType::bf16
               : a_.fp16                ? DType::f16
                                        : DType::f32),
      devices_(a_.device_map.empty() ? DryDevices() : DryDevices(split_placement(a_, config_, target))),
      init_(a_.seed),
      dropout_(a_.seed),
      tracker_(devices_.allocator(0)) {}

MemoryEstimate DryRun::estimate() {
  watch_allocations();
  e_.device = target_.device;
  e_.per_device_train_batch_size = a_.per_device_train_batch_size;
  e_.gradient_accumulation_steps = a_.gradient_accumulation_steps;
  sharding_ = sharding_for(a_, target_, compute_, grown_);
  build_model();
  build_optimizer();
  // The run measures train_peak_memory_gib from its first step: the set-up's own peak (loading the model
  // and, when sharded, keeping this rank's share) is reported apart.
  e_.setup_peak_bytes = devices_.peak(0);
  devices_.reset_peaks();
  ddp_buckets();
  if (a_.eval_on_start) evaluate();  // before the first step, as the run (the caching allocator's order)
  train_steps();
  if (a_.evaluates_at_end()) evaluate();
  if (target_.device == MemoryDevice::cuda)
    e_.workspace_bytes = static_cast<int64_t>(backend::kCublasLtWorkspaceBytes);
  // Every save_strategy but "no" saves inside the loop (at the latest after the last step).
  if (parse_interval_strategy(a_.save_strategy, "save_strategy") != IntervalStrategy::no) save();
  e_.peak_bytes = peaks_[0] + prefetch_on(0);
  e_.reserved_bytes = caching_[0]->stats().peak_reserved_bytes;
  if (devices_.split()) per_device_rows();
  breakdown();
  return e_;
}

void DryRun::watch_allocations() {
  for (size_t i = 0; i < devices_.size(); ++i) {
    caching_.push_back(std::make_unique<CachingAllocatorModel>());
    AllocationObserver* watch = caching_.back().get();
    if (i == 0 && target_.trace_allocations && (trace_ = AllocationTrace::from_environment(watch)))
      watch = trace_.get();
    observers_.push_back(std::make_unique<ObserveAllocations>(devices_.allocator(i), *watch));
  }
}

void DryRun::build_model() {
  if (sharding_.deferred) {
    auto d = models::deferred_causal_lm(config_, Device::meta(), init_, a_.attn_implementation);
    model_ = std::move(d.model);
    load_ = std::move(d.load);
  } else if (devices_.split()) {
    model_ = split_model(config_, a_, devices_, init_);
  } else {
    // Half weights load from a checkpoint in bf16 (a fresh model is drawn in f32 and rounded, as the run).
    const DType dtype = half_weights_ && !a_.from_scratch() ? DType::bf16 : DType::f32;
    model_ = models::create_causal_lm(config_, Device::meta(), dtype, init_, a_.attn_implementation);
  }
  e_.parameters = model_->num_parameters();
}

// The run's order: a sharded rank takes its slices before the half weights are made (no whole fp32 masters
// are kept), ZeRO-3 then releases every parameter.
void DryRun::build_optimizer() {
  optim::OptimizerOptions oo = optimizer_options(a_);
  oo.linear_weights = model_->linear_weight_names();
  const bool zero = sharding_.stage > 0;
  if (zero) {
    // NCCL (--ddp_backend nccl) reduces and gathers in the GPU's memory through buffers there
    // (zero_device.cpp); Gloo beside a GPU stages through host memory no allocator counts.
    const bool nccl = target_.device == MemoryDevice::cuda && a_.ddp_backend == "nccl";
    group_ = dist::dry_run_group(sharding_.shard_world, nccl);
    auto z = std::make_unique<ShardedOptimizer>(
        *group_, model_->named_parameters(), a_.optim, oo, a_.ddp_bucket_cap_mb << 20, compute_ != DType::f32,
        sharding_.stage, sharding_.deferred ? std::optional(Device::meta()) : std::nullopt,
        sharding_.offload ? std::optional(DryDevices::host()) : std::nullopt);
    sharded_ = z.get();
    opt_ = std::move(z);
    if (sharding_.deferred) build_shard(*sharded_, model_->named_parameters(), load_, compute_);
  }
  mp_ = std::make_unique<MixedPrecision>(model_->named_parameters(), compute_, a_.fp16,
                                         zero && compute_ != DType::f32, half_weights_);
  model_->set_dtype(compute_);
  // sdpa in the form each target device takes (e.g. the blocked form and its score blocks where a GPU's
  // fused kernels do not cover the case)
  const auto type_of = [](bool gpu) { return gpu ? DeviceType::cuda : DeviceType::cpu; };
  if (devices_.split())
    for (size_t i = 0; i < devices_.size(); ++i)
      model_->set_attention_device(type_of(devices_.real(i).is_cuda()), devices_.meta(i));
  else
    model_->set_attention_device(type_of(target_.device == MemoryDevice::cuda));
  if (!zero) opt_ = optim::make_optimizer(a_.optim, mp_->master_params(), oo);
  for (const auto& [name, p] : model_->named_parameters()) weights_.push_back(*p);
  if (mp_->enabled() && !zero)
    for (const auto& [name, p] : mp_->master_params()) masters_.push_back(*p);
  weight_bytes_ = bytes_of(weights_);
  if (sharding_.stage == 3) {
    weights_.clear();  // released: none of them stays between uses
    full_ = std::make_unique<FullShard>(*sharded_, model_->named_parameters(), a_.ddp_bucket_cap_mb << 20,
                                        read_fsdp_config(a_.fsdp_config));
    model_->set_layer_hooks(full_.get());
  }
}

// DDP on GPUs: two slots of f32 gradients (each the largest bucket: the cap, or every parameter when fewer)
// and the sums' scale, kept on the GPU from the first reduction on (ddp.cpp); on the host the bucket is plain
// memory no allocator counts.
void DryRun::ddp_buckets() {
  if (target_.world_size <= 1 || sharding_.stage != 0 || target_.device != MemoryDevice::cuda) return;
  const int64_t largest =
      std::max<int64_t>(1, std::min<int64_t>(e_.parameters, (a_.ddp_bucket_cap_mb << 20) / 4));
  for (int i = 0; i < 2; ++i) ddp_slots_.push_back(ops::empty({largest}, DType::f32, devices_.meta(0)));
  ddp_slots_.push_back(ops::empty({1}, DType::f32, devices_.meta(0)));
}

// The loader hands a GPU's batches over on the device; the host's (host partitions too) stay in host
// memory, and the forward copies each micro-batch to the embeddings' device.
Device DryRun::batch_device() const {
  return devices_.split() && devices_.real(0).is_cpu() ? DryDevices::host() : devices_.meta(0);
}

int64_t DryRun::prefetch_on(size_t i) const {
  const bool host =
      devices_.split() ? devices_.real(i) == Device::cpu() : target_.device == MemoryDevice::cpu;
  const int64_t queued = a_.dataloader_prefetch_factor > 0 ? a_.dataloader_prefetch_factor : 2;
  return host ? a_.dataloader_num_workers * (queued + 1) * batch_bytes() : 0;
}

// Two steps: the first makes the optimizer state, the second is the steady state with it. Micro-batches
// after the second repeat its memory exactly (gradients accumulate in place), so at most two run; the
// others' input tensors are made too (as the run draws the whole step's batches first) and stay alive.
void DryRun::train_steps() {
  StepOptions so;
  so.gradient_checkpointing = a_.gradient_checkpointing;
  so.label_smoothing = a_.label_smoothing_factor;
  so.neftune_noise_alpha = a_.neftune_noise_alpha;  // its noise tensor is part of the forward's memory
  so.max_grad_norm = a_.max_grad_norm;
  so.device = devices_.meta(0);  // where the embeddings are
  so.on_micro_batch = [this](int64_t step, const Tensor&) {
    if (micro_now_ > 0)
      tracker_.mark(fmt::format("forward/backward of micro-batch {} of step {}", micro_now_, step + 1));
    ++micro_now_;
  };
  so.after_backward = [this](int64_t step, const nn::ParamList&) {
    tracker_.mark(fmt::format("forward/backward of micro-batch {} of step {}", micro_now_, step + 1));
  };
  step_ = make_eager_step(StepState{*model_, *mp_, *opt_, dropout_, full_.get()}, so);
  const int64_t simulated = std::min<int64_t>(a_.gradient_accumulation_steps, 2);
  held_.assign(devices_.size(), 0);
  for (int64_t step = 0; step < 2; ++step) {
    micro_now_ = 0;
    std::vector<data::Batch> micro, waiting;
    for (int64_t m = 0; m < a_.gradient_accumulation_steps; ++m)
      (m < simulated ? micro : waiting)
          .push_back(meta_batch(a_.per_device_train_batch_size, a_.block_size, batch_device()));
    step_->run(step, micro, a_.learning_rate);
    tracker_.mark(fmt::format("optimizer step {} (gradient statistics, update, half copies)", step + 1));
    for (size_t i = 0; i < devices_.size(); ++i) held_[i] = devices_.current(i);
  }
  peaks_ = devices_.peaks();
  e_.peak_at = tracker_.where();
  e_.held_bytes = held_[0];
  if (a_.torch_compile && !devices_.split()) {
    // The compiled step packs a step's buffers into one arena: the live peak above what stays between steps
    // (compiled_step.cpp plans it from the traced first step). Under CUDA graphs the arena stays allocated
    // between steps, a segment of its own beside the eager memory the capturing step left cached: reserved.
    e_.compiled_arena_bytes = std::max<int64_t>(0, peaks_[0] - held_[0]);
    if (target_.device == MemoryDevice::cuda && a_.compile_device_graphs())
      ops::empty({e_.compiled_arena_bytes}, DType::u8, devices_.meta(0));  // allocated and freed: reserved
  }
}

// A no-grad forward of one evaluation batch.
void DryRun::evaluate() {
  devices_.reset_peaks();
  {
    autograd::NoGradGuard no_grad;
    const data::Batch b = meta_batch(a_.per_device_eval_batch_size, a_.block_size, batch_device());
    models::ForwardOptions fo;
    fo.labels = b.labels;
    fo.num_items_in_batch = 1.0;
    fo.return_logits = false;
    model_->forward(b.input_ids, fo);
  }
  // The loader's workers are still holding their batches while an evaluation runs inside the loop.
  e_.eval_peak_bytes = devices_.peak(0) + prefetch_on(0);
  if (peaks_.empty()) {  // eval_on_start, before the first step: the steps' running peak includes it
    tracker_.mark("evaluation forward (eval_on_start)");
    return;
  }
  // Evaluations inside the loop (eval_strategy) count in train_peak_memory_gib; the final one of --do_eval
  // runs after it is taken.
  if (parse_interval_strategy(a_.eval_strategy, "eval_strategy") == IntervalStrategy::no) return;
  if (devices_.peak(0) > peaks_[0]) e_.peak_at = "evaluation forward (eval_strategy)";
  for (size_t i = 0; i < devices_.size(); ++i) peaks_[i] = std::max(peaks_[i], devices_.peak(i));
}

void DryRun::save() {
  ShardedOptimizer* gathered =
      sharded_ && (mp_->masters_sharded() || (full_ && !mp_->enabled())) ? sharded_ : nullptr;
  const std::vector<int64_t> save = dry_save(*model_, *mp_, *opt_, gathered, devices_,
                                             target_.device == MemoryDevice::cpu, !a_.save_only_model);
  e_.save_peak_bytes = save[0] + prefetch_on(0);
  if (save[0] > peaks_[0])
    e_.peak_at =
        gathered ? "checkpoint save (each fp32 master gathered as it is written)" : "checkpoint save";
  for (size_t i = 0; i < devices_.size(); ++i) peaks_[i] = std::max(peaks_[i], save[i]);
}

// A split's devices, each against its --max_memory budget.
void DryRun::per_device_rows() {
  e_.device_map = devices_.real_placement().summary();
  const auto budgets = models::parse_device_memory(a_.max_memory, "max_memory");  // checked by the placement
  for (size_t i = 0; i < devices_.size(); ++i) {
    int64_t on = 0;
    for (const auto& [name, p] : model_->named_parameters())
      if (p->device() == devices_.meta(i)) on += static_cast<int64_t>(p->nbytes());
    int64_t budget = 0;  // the host's, when not given: unbounded
    for (const auto& b : budgets)
      if (b.device == devices_.real(i)) budget = b.bytes;
    e_.devices.push_back({devices_.real(i).str(), on, held_[i] + prefetch_on(i), peaks_[i] + prefetch_on(i),
                          caching_[i]->stats().peak_reserved_bytes, budget});
  }
}

void DryRun::breakdown() {
  const bool offload = sharding_.offload;
  const int64_t state = opt_->state_bytes();
  const int64_t grads = weight_bytes_;  // one gradient per parameter, in the compute dtype
  const int64_t shard = sharded_ ? sharded_->shard_bytes() - state : 0;  // slices of masters and gradients
  if (offload) e_.offloaded_bytes = shard + state;                       // in host memory, not on the device
  e_.breakdown = {
      {full_ ? "weights (none between uses: each unit gathered as it runs)" : "weights", bytes_of(weights_)},
      {offload    ? "fp32 masters and reduced gradient shard (offloaded: in host memory)"
       : sharded_ ? "fp32 masters (this rank's slices) and reduced gradient shard"
                  : "fp32 masters",
       offload    ? 0
       : sharded_ ? shard
                  : bytes_of(masters_)},
      {offload ? "optimizer state (offloaded: in host memory)" : "optimizer state", offload ? 0 : state},
      {"data batches (one step)", a_.gradient_accumulation_steps * batch_bytes()},
      {"DDP gradient buckets (two slots)", bytes_of(ddp_slots_)},
      {"data loader prefetch", prefetch_on(0)}};
  if (devices_.split()) {  // the rows above are the whole model's; each device's share is in e_.devices
    e_.breakdown.emplace_back("gradients (all, for reference)", grads);
    return;
  }
  int64_t persistent = 0;
  for (const auto& [name, b] : e_.breakdown) persistent += b;
  if (full_) e_.breakdown.emplace_back("weights (all, for reference)", weight_bytes_);
  e_.breakdown.emplace_back("gradients (all, for reference)", grads);
  if (offload)
    e_.breakdown.emplace_back("host memory (offload): fp32 masters, gradient shard, optimizer state",
                              e_.offloaded_bytes);
  const bool save_peak = e_.peak_at.rfind("checkpoint save", 0) == 0;
  e_.breakdown.emplace_back(save_peak ? "the save's tensors and the optimizer state_dict at the peak"
                            : full_   ? "activations, gathered units, gradients and workspace at the peak"
                                      : "activations, gradients and workspace at the peak",
                            e_.peak_bytes - persistent);
  if (target_.device == MemoryDevice::cuda) {
    e_.breakdown.emplace_back("caching allocator: rounding and cached free blocks",
                              e_.reserved_bytes - e_.peak_bytes);
    e_.breakdown.emplace_back("cuBLASLt workspace (outside the caching allocator)", e_.workspace_bytes);
  }
}
}  // namespace

MemoryDevice parse_memory_device(const std::string& name) {
  if (name == "cpu") return MemoryDevice::cpu;
  if (name == "cuda") return MemoryDevice::cuda;
  fail("--device '{}': expected cpu or cuda", name);
}

const char* memory_device_name(MemoryDevice d) { return d == MemoryDevice::cuda ? "cuda" : "cpu"; }

MemoryEstimate estimate_memory(const TrainingArguments& args, const MemoryTarget& target) {
  return DryRun(resolve(args), target).estimate();
}

int64_t parse_memory_size(const std::string& text, const std::string& flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::vector<std::pair<std::string, double>> units = {
      {"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12}, {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  for (const auto& [name, scale] : units)
    if (used > 0 && unit == name && v * scale >= 1 && v * scale < 9.2e18)
      return static_cast<int64_t>(v * scale);
  fail("--{} '{}': expected a positive size such as 80GB, 24GiB or 512MB", flag, text);
}

int64_t max_fitting_batch(const TrainingArguments& a, int64_t budget, const MemoryTarget& target) {
  auto fits = [&](int64_t b) {
    TrainingArguments t = a;
    t.per_device_train_batch_size = b;
    return estimate_memory(t, target).fit_bytes() <= budget;
  };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;  // fits(lo), and hi is the next candidate
  while (hi <= (int64_t{1} << 20) && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {  // fits(lo), !fits(hi)
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

BatchChoice auto_batch(const TrainingArguments& a, int64_t budget, const MemoryTarget& target) {
  const int64_t total = a.total_batch_sequences();
  BatchChoice best;
  for (int64_t b = 1; b <= (total > 0 ? total : int64_t{1} << 20); b *= 2) {
    if (total > 0 && total % b != 0) break;  // powers of two past the largest one dividing the total
    TrainingArguments t = a;
    t.per_device_train_batch_size = b;
    t.gradient_accumulation_steps = total > 0 ? total / b : a.gradient_accumulation_steps;
    const int64_t peak = estimate_memory(t, target).fit_bytes();
    if (peak > budget) break;  // the peak grows with the batch
    best = {b, t.gradient_accumulation_steps, peak};
  }
  return best;
}

std::vector<KnobRow> knob_table(const TrainingArguments& a, const MemoryTarget& target) {
  const int world_size = target.world_size;
  std::vector<std::pair<std::string, TrainingArguments>> rows = {{"as given", a}};
  auto with = [&](const std::string& knob, auto change) {
    TrainingArguments t = a;
    change(t);
    rows.emplace_back(knob, t);
  };
  if (!a.gradient_checkpointing)
    with("gradient_checkpointing", [](auto& t) { t.gradient_checkpointing = true; });
  if (!a.bf16 && !a.fp16) with("bf16", [](auto& t) { t.bf16 = true; });
  // The model's own bf16 weights (no fp32 masters; AdamW's moments bf16): one process, no fp16 or sharding.
  if (world_size == 1 && !a.fp16 && a.fsdp.empty() && a.deepspeed.empty() && a.model_dtype() != "bfloat16" &&
      !optim::ScheduleFree::implements(a.optim))
    with("torch_dtype bfloat16", [](auto& t) { t.torch_dtype = "bfloat16"; });
  if (a.optim != "adamw_bnb_8bit" && a.optim != "adamw_8bit")
    with("optim adamw_bnb_8bit", [](auto& t) { t.optim = "adamw_bnb_8bit"; });
  if (a.optim != "adafactor") with("optim adafactor", [](auto& t) { t.optim = "adafactor"; });
  // Adafactor's moments updated during backward: no step holds the model's gradients (one process, no fp16).
  if (world_size == 1 && !a.fp16 && !optim::updates_in_backward(a.optim))
    with("optim adalomo", [](auto& t) { t.optim = "adalomo"; });
  if (a.per_device_train_batch_size % 2 == 0)
    with(fmt::format("batch {} x accumulation {}", a.per_device_train_batch_size / 2,
                     a.gradient_accumulation_steps * 2),
         [](auto& t) {
           t.per_device_train_batch_size /= 2;
           t.gradient_accumulation_steps *= 2;
         });
  // Sharding, when distributed (and the optimizer shards element-wise): ZeRO-2 and ZeRO-3 per rank, and
  // across several nodes their hybrid forms (sharded within a node).
  std::vector<std::string> strategies = {"shard_grad_op", "full_shard"};
  if (target.nproc_per_node > 0 && target.nproc_per_node < world_size)
    strategies.insert(strategies.end(), {"hybrid_shard_zero2", "hybrid_shard"});
  for (const std::string& strategy : strategies) {
    const bool stage3 = strategy == "full_shard" || strategy == "hybrid_shard";
    if (world_size > 1 && shards_elementwise(a.optim) && !a.fsdp_has(strategy) &&
        !(stage3 && a.torch_compile))
      with("fsdp " + strategy, [strategy](auto& t) { t.fsdp = strategy; });
  }
  // On a GPU, ZeRO-3 with its shard in host memory: the least GPU memory sharding gives.
  if (world_size > 1 && target.device == MemoryDevice::cuda && shards_elementwise(a.optim) &&
      !a.fsdp_has("offload") && !a.torch_compile)
    with("fsdp full_shard offload", [](auto& t) { t.fsdp = "full_shard offload"; });
  std::vector<KnobRow> out;
  for (const auto& [knob, t] : rows) out.push_back({knob, estimate_memory(t, target).fit_bytes()});
  return out;
}

}  // namespace tr::train
