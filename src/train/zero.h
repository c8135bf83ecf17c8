// ZeRO-2 (HF's --fsdp shard_grad_op) on a process group: the parameters' flat index space cut into one
// equal shard per rank; each step the gradients are reduce-scattered (rank r receives the sum of its shard
// only), rank r keeps the optimizer state of its shard alone and updates its slices of the fp32 masters, and
// the updated parameters are all-gathered into every rank's model. Optimizer state per rank is 1/N of DDP's.
// Only element-wise optimizers shard this way (AdamW, SGD: a slice's state is the slice of the state);
// Adafactor's factored moments and 8-bit AdamW's 256-element blocks need whole tensors.
// Checkpoints hold one optimizer.rank-K.safetensors per rank with each slice's place in its metadata;
// load_optimizer_state reassembles any world size's slices (or a whole optimizer.safetensors) for any other.
#pragma once
#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dist/process_group.h"
#include "optim/optimizer.h"
#include "train/comm_queue.h"
#include "train/host_stage.h"

namespace tr::train {

// Elements [begin, begin + count) of a parameter's flattened tensor (and of its optimizer state).
struct StateSlice {
  std::string param;
  int64_t begin = 0, count = 0;
};

// The parameters' flat index space (named_parameters order) in `world` shards of ceil(P / world) elements,
// the last one padded: rank r owns [r * shard, (r + 1) * shard) of [0, total).
struct FlatLayout {
  FlatLayout(const nn::ParamList& params, int world);
  std::vector<int64_t> offset, numel;  // per parameter
  int64_t total = 0, shard = 0;
  int world = 1;
  // fn(parameter index, first element within it, count, position of that element in [lo, hi)) for every
  // parameter overlapping flat [lo, hi).
  template <typename F>
  void visit(int64_t lo, int64_t hi, F&& fn) const;
  // The slices of rank r's shard, in order.
  std::vector<StateSlice> slices(const nn::ParamList& params, int rank) const;
};

template <typename F>
inline void FlatLayout::visit(int64_t lo, int64_t hi, F&& fn) const {
  hi = std::min(hi, total);
  if (lo >= hi) return;
  // The last parameter starting at or before lo, then onwards.
  size_t k = static_cast<size_t>(std::upper_bound(offset.begin(), offset.end(), lo) - offset.begin()) - 1;
  for (; k < offset.size() && offset[k] < hi; ++k) {
    const int64_t a = std::max(lo, offset[k]), b = std::min(hi, offset[k] + numel[k]);
    if (a < b) fn(k, a - offset[k], b - a, a - lo);
  }
}

// Whether --optim `name` shards element-wise (the optimizers ShardedOptimizer accepts).
bool shards_elementwise(const std::string& name);
// Those names, comma-separated (for messages).
std::string elementwise_optimizers();

class ShardedOptimizer final : public optim::Optimizer {
 public:
  // `masters`: what the update writes, identical on every rank. `bucket_cap_bytes` bounds each collective's
  // buffer. Without `own_masters` (fp32 training: the masters are the model's parameters) the slices are
  // views of them and updates are all-gathered into them in f32. With it (mixed precision) the shard is
  // copied out at construction (or filled later: deferred_on) - the caller then frees the whole masters
  // (MixedPrecision::shard_masters) -
  // and updates are gathered rounded into the model's half weights.
  // `stage` 3 (full_shard, zero3.h): the shard is always copied out (the model's parameters are released
  // between uses) and an update gathers nothing - FullShard gathers each layer when it is used.
  // `deferred_on` (own masters only): the masters are meta tensors of their shapes, the model is made on this
  // device, and the shard starts as zeros until fill() gives each parameter's values (build_shard).
  // `offload_to` (--fsdp offload): the shard - fp32 masters, summed gradients, optimizer state - lives on
  // this device (the host; a dry run's stand-in for it) instead of the model's, and is updated there; the
  // shard is then always its own copy. The model may be on any device: the collectives move host buffers,
  // staged through copies where the model or the shard is not in the host's memory (host_stage.h).
  ShardedOptimizer(dist::ProcessGroup& group, const nn::ParamList& masters, const std::string& optim,
                   const optim::OptimizerOptions& opts, int64_t bucket_cap_bytes, bool own_masters = false,
                   int stage = 2, std::optional<Device> deferred_on = std::nullopt,
                   std::optional<Device> offload_to = std::nullopt);
  // Deferred masters: this rank's slices of parameter p copied from `value` (contiguous f32 of its shape on
  // the shard's device; nothing moves on the meta device).
  void fill(size_t p, const Tensor& value);
  // The model's gradients (parallel to the masters, host, any floating dtype; undefined: zeros) summed over
  // the ranks into this rank's shard, times `scale`.
  void reduce_scatter(const std::vector<Tensor>& grads, double scale);
  // The same reduction during the step's last backward, bucket by bucket (buckets of the cap, last
  // parameters first, in the same order on every rank): begin_backward before it, grad_ready from the
  // autograd engine as each parameter's gradient is final - a bucket whose gradients are all final is
  // packed at once into one of two send slots and reduced to its owners on a communication thread while the
  // backward goes on, and each gradient is dropped as soon as every bucket holding it is packed (the memory
  // ZeRO-2 saves during backward) - and finish_backward after it (the buckets left: a rank whose micro-batch
  // was empty reduces zeros for all of them; returns with every bucket reduced). A dry run packs (the same
  // allocations) and reduces nothing.
  void begin_backward(double scale);
  void grad_ready(const TensorImpl* leaf);
  void finish_backward();
  size_t buckets_queued() const { return next_bucket_; }  // this backward's buckets packed so far
  // Seconds the training thread waited for the bucket reductions (a slot still in use, the last buckets),
  // and seconds the communication thread spent in their collectives.
  double blocked_seconds() const { return comm_ ? comm_->blocked_seconds() : 0; }
  double comm_seconds() { return comm_ ? comm_->collective_seconds() : 0; }
  // Hybrid sharding (hybrid_shard, hybrid_shard_zero2): the ranks that hold this same shard on the other
  // nodes. After each step's reduction within the node, reduce_replicas() sums the gradient shard over
  // them (a no-op without replicas): every node then updates identically.
  void set_replicas(dist::ProcessGroup* replicas) { replicas_ = replicas; }
  void reduce_replicas();
  // grad_stats over the reduced shard, summed over the ranks: the global norm and inf count (f64 [2]).
  Tensor global_stats(double inv_scale) const;
  // This rank's slices updated from the reduced shard through `t` (whose stats must be global_stats'), then
  // every parameter all-gathered into the masters and, when given, rounded into `copies` (own masters: into
  // `copies` alone, which must be given).
  void update(const backend::Backend::GradTransform& t, const std::vector<Tensor>& copies);
  // Master p's fp32 values from every rank's slices, whole on `root` (a host tensor; an undefined one on
  // the other ranks). A collective: every rank of the group calls it for the same p in the same order.
  // Saving streams the masters this way, one parameter at a time: the writer's peak is one parameter, not
  // the whole fp32 model.
  Tensor gather_master(size_t p, int root = 0);
  bool owns_masters() const { return own_; }
  // Where the shard lives (the model's device, or the host when offloaded), and whether it was offloaded.
  Device shard_device() const { return dev_; }
  bool offloaded() const { return offloaded_; }
  int stage() const { return stage_; }
  // The --fsdp option this stage is ("shard_grad_op", "full_shard"), for messages.
  const char* fsdp_option() const { return stage_ == 3 ? "full_shard" : "shard_grad_op"; }
  const FlatLayout& layout() const { return layout_; }
  // This rank's shard of the summed gradients (its slices, in order), once allocated.
  const Tensor& grad_shard() const { return grad_flat_; }

  // The Optimizer interface: a whole sharded update (reduce-scatter, global statistics, update, gather).
  void step() override;
  void step(const std::vector<Tensor>& grads, const backend::Backend::GradTransform& t,
            const std::vector<Tensor>& copies) override;

 protected:
  // The shard updates as a whole (its collectives span every parameter): [0, n) only, as step().
  void step_params(size_t lo, size_t hi, bool advance) override;

 public:
  void set_lr(double lr) override;
  int64_t step_count() const override { return inner_ ? inner_->step_count() : 0; }
  // This rank's slices' state (1-D entries under the unsharded names), and where they lie.
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;
  int64_t state_bytes() const override { return inner_ ? inner_->state_bytes() : 0; }
  // The reduced-gradient shard and the inner optimizer's state, made at the first use (idempotent).
  void allocate_state();
  std::map<std::string, std::string> shard_metadata() const;
  const std::vector<StateSlice>& slices() const { return slices_; }
  int rank() const { return group_.rank(); }
  int world_size() const { return group_.size(); }
  // Bytes this rank holds for its shard beyond the masters: the summed gradients and the optimizer state.
  int64_t shard_bytes() const;

 private:
  friend class FullShard;  // ZeRO-3 reads the master shard and adds into the gradient shard
  void all_gather(const std::vector<Tensor>& copies);
  void gather_rounded(const std::vector<Tensor>& copies);
  void round_into(const std::vector<Tensor>& copies);  // the fp32 parameters rounded into their copies
  // ---- Collectives over the model's device's own memory (zero_device.cpp): where the group reads it (NCCL
  // on its GPU; any group on a host partition) and the shard is beside the model, the gradients are widened
  // into a device buffer and reduced straight into the shard, and the updated shard is gathered straight
  // into the model - no host copies, one wait per collective instead of a synchronizing copy per piece.
  bool device_comm() const;
  void reduce_scatter_on_device(const std::vector<Tensor>& grads, double scale);
  // `counts`: the bucket's part in each rank's shard; this rank's part lands at [mine_lo, mine_lo + mine)
  // of the gradient shard.
  struct Bucket;
  struct BucketSlot;
  void pack_bucket_on_device(const Bucket& b, BucketSlot& s);
  void reduce_bucket_on_device(BucketSlot& s, const std::vector<int64_t>& counts, int64_t mine_lo,
                               int64_t mine, float scale);
  // Every rank's updated shard, in `dtype`, into dst(p) for every parameter p (own masters: rounded from
  // this rank's fp32 slices; else this rank's slices of the fp32 parameters, which are updated in place).
  void gather_on_device(const std::function<const Tensor&(size_t)>& dst, DType dtype);
  struct Bucket {
    int64_t lo = 0, hi = 0;  // flat range
    std::vector<size_t> params;
    int waiting = 0;  // of params, not final yet
  };
  // A bucket's send side, packed by the training thread while the communication thread reduces the other
  // slot's: `host` (the host path), or `send` and `scale` on the shard's device (made at the first bucket).
  struct BucketSlot {
    host_stage::StagingBuffer<float> host;
    Tensor send, scale;
    std::unique_ptr<backend::ComputeFence> packed;  // on a GPU: the compute-stream point after the packing
    uint64_t ticket = 0;                            // the last reduction that read this slot
  };
  void plan_buckets();
  void reduce_bucket(const Bucket& b);  // packed into a free slot here, reduced on the communication thread
  // Elements [at, at + n) of parameter p's gradient as f32 into `dst` (zeros without a gradient).
  void read_grad(size_t p, int64_t at, int64_t n, float* dst) const;
  // Host memory for elements [at, at + n) of the gradient shard, and their landing there (a copy unless
  // the shard is in host memory).
  float* grad_out(int64_t at, int64_t n);
  void grad_out_done(int64_t at, int64_t n);

  dist::ProcessGroup& group_;
  dist::ProcessGroup* replicas_ = nullptr;
  FlatLayout layout_;
  int64_t round_ = 1;  // elements per rank per collective call
  std::vector<StateSlice> slices_;
  bool own_ = false;
  int stage_ = 2;
  Device dev_;        // the shard's device (a meta device in `trainer estimate`: no values moved)
  Device model_dev_;  // the model's: where gradients are read and gathered weights written
  bool offloaded_ = false;
  Tensor master_flat_;                              // own masters: this rank's fp32 slices
  Tensor grad_flat_;                                // this rank's shard of the summed gradients
  std::vector<Tensor> slice_params_, slice_grads_;  // views of the masters (or master_flat_) and grad_flat_
  std::unique_ptr<optim::Optimizer> inner_;  // the element-wise optimizer over the slices (allocate_state)
  nn::ParamList inner_params_;               // its parameters: the slices, under their parameters' names
  std::vector<int64_t> slice_pos_;           // each slice's place in this rank's shard
  std::vector<size_t> slice_param_;          // each slice's parameter index
  std::vector<int64_t> slice_at_;            // and its first element within that parameter
  std::string optim_name_;
  std::vector<float> scratch_;  // the collectives' receiving side (host only)
  // The host side of copies to and from the model's and the shard's devices (pinned beside a GPU): send_
  // the gradients read for a collective, staged_ a stretch of the shard, rounded_ / gathered_ a round of
  // gather_rounded's halves on their way from the shard and into the model.
  host_stage::StagingBuffer<float> send_, staged_;
  host_stage::StagingBuffer<char> rounded_, gathered_;
  // Overlapped reduction (begin_backward .. finish_backward).
  int64_t bucket_elems_ = 1;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> buckets_of_;  // per parameter
  std::vector<int> pending_;                     // per parameter: its buckets not reduced yet
  std::unordered_map<const TensorImpl*, size_t> index_;
  size_t next_bucket_ = 0;
  float bucket_scale_ = 1;
  bool in_backward_ = false;
  std::array<BucketSlot, 2> slots_;
  int next_slot_ = 0;
  // The bucket reductions, in order (made at the first overlapped backward; none in a dry run). Last: it
  // goes first, skipping what is left, before the buffers its jobs use.
  std::unique_ptr<CommQueue> comm_;
};

// ZeRO set-up from a model whose parameters are still meta tensors (models::DeferredModel): each parameter is
// made alone by `load(i)` (f32 on `opt`'s device), this rank's slices of it go into `opt`'s deferred shard,
// and the parameter becomes its `compute` copy - under ZeRO-3 released storage of that dtype, gathered when
// its layer runs. The set-up's peak is the shard plus one fp32 parameter (and its copy) instead of the whole
// fp32 model; the values are those of the whole model built and then sharded.
void build_shard(ShardedOptimizer& opt, const nn::ParamList& params,
                 const std::function<Tensor(size_t)>& load, DType compute);

// The optimizer state of checkpoint `dir` for `opt`: whole (optimizer.safetensors) or one file per rank
// (optimizer.rank-K.safetensors), of any world size, reassembled into the slices `opt` holds (all of
// every parameter of `masters` unless it is a ShardedOptimizer). Throws naming the file: a rank file
// missing, a slice no file covers.
std::map<std::string, Tensor> load_optimizer_state(const std::string& dir, const optim::Optimizer& opt,
                                                   const nn::ParamList& masters);
// Whether `dir` holds the optimizer state (either layout).
bool has_optimizer_state(const std::string& dir);
// Writes `opt`'s file into checkpoint folder `dir`: optimizer.rank-K.safetensors when sharded, else
// optimizer.safetensors.
void save_optimizer_state(const std::string& dir, const optim::Optimizer& opt);

}  // namespace tr::train
