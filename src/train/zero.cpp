// ZeRO-2's sharded optimizer and the optimizer state of checkpoints in either layout; see zero.h.
#include "train/zero.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include <fmt/ranges.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "autograd/node.h"
#include "ops/ops.h"
#include "train/host_stage.h"

namespace tr::train {

namespace fs = std::filesystem;

FlatLayout::FlatLayout(const nn::ParamList& params, int world_size) : world(world_size) {
  TR_CHECK(world >= 1, "FlatLayout: a world of {} ranks", world);
  for (const auto& [name, p] : params) {
    offset.push_back(total);
    numel.push_back(p->numel());
    total += p->numel();
  }
  shard = (total + world - 1) / world;
}

std::vector<StateSlice> FlatLayout::slices(const nn::ParamList& params, int rank) const {
  std::vector<StateSlice> out;
  const int64_t lo = rank * shard;
  visit(lo, lo + shard, [&](size_t k, int64_t at, int64_t n, int64_t) {
    out.push_back({params[k].first, at, n});
  });
  return out;
}

namespace {

// AdamW, SGD, Adagrad, RMSprop, Lion and bitsandbytes' 32-bit AdamW, RMSprop and AdEMAMix: each element's
// update reads only that element (8-bit AdamW's blocks and Adafactor's row and column statistics span
// tensors).
const std::vector<std::string>& elementwise_names() {
  static const std::vector<std::string> names{"adamw_torch",
                                              "adamw_torch_fused",
                                              "adamw_apex_fused",
                                              "adamw_torch_xla",
                                              "adamw_torch_npu_fused",
                                              "paged_adamw_32bit",
                                              "sgd",
                                              "adagrad",
                                              "rmsprop",
                                              "rmsprop_bnb",
                                              "rmsprop_bnb_32bit",
                                              "lion_32bit",
                                              "paged_lion_32bit",
                                              "ademamix",
                                              "paged_ademamix_32bit"};
  return names;
}

}  // namespace

bool shards_elementwise(const std::string& name) {
  const auto& n = elementwise_names();
  return std::find(n.begin(), n.end(), name) != n.end();
}

std::string elementwise_optimizers() { return fmt::format("{}", fmt::join(elementwise_names(), ", ")); }

ShardedOptimizer::ShardedOptimizer(dist::ProcessGroup& group, const nn::ParamList& masters,
                                   const std::string& optim, const optim::OptimizerOptions& opts,
                                   int64_t bucket_cap_bytes, bool own_masters, int stage,
                                   std::optional<Device> deferred_on, std::optional<Device> offload_to)
    : Optimizer(masters, opts),
      group_(group),
      layout_(masters, group.size()),
      own_(own_masters || stage == 3 || offload_to.has_value()),
      stage_(stage),
      model_dev_(deferred_on       ? *deferred_on
                 : masters.empty() ? Device::cpu()
                                   : masters.front().second->device()),
      offloaded_(offload_to.has_value()) {
  dev_ = offload_to ? *offload_to : model_dev_;
  const bool gpu = dev_.is_cuda() || model_dev_.is_cuda();
  send_.pin(gpu);
  for (BucketSlot& b : slots_) b.host.pin(gpu);
  staged_.pin(gpu);
  rounded_.pin(gpu);
  gathered_.pin(gpu);
  TR_CHECK(stage == 2 || stage == 3, "ShardedOptimizer: ZeRO stage {} (2 or 3)", stage);
  TR_CHECK(shards_elementwise(optim),
           "--fsdp {} with --optim {}: sharding splits tensors into flat slices, which only "
           "element-wise optimizers update exactly ({}); {}'s state needs whole tensors",
           fsdp_option(), optim, elementwise_optimizers(), optim);
  TR_CHECK(!deferred_on || own_, "ShardedOptimizer: deferred masters need a shard of its own");
  const Device where = deferred_on ? Device::meta() : model_dev_;
  for (const auto& [name, p] : masters)
    TR_CHECK(p->device() == where && p->dtype() == DType::f32 && p->is_contiguous(),
             "--fsdp {}: parameter '{}' is {}; sharding takes contiguous fp32 parameters, all on {}",
             fsdp_option(), name, p->describe(), where.str());
  round_ = std::max<int64_t>(1, bucket_cap_bytes / static_cast<int64_t>(sizeof(float)) / group.size());
  bucket_elems_ = std::max<int64_t>(1, bucket_cap_bytes / static_cast<int64_t>(sizeof(float)));
  slices_ = layout_.slices(masters, group.rank());
  const int64_t base = group.rank() * layout_.shard;
  slice_params_.reserve(slices_.size());  // the inner optimizer points into slice_params_
  size_t k = 0;
  // fp32 training: the slices are views of the masters themselves (the model's parameters), so the update
  // lands in place and no second fp32 copy of the shard exists. Own masters: the shard is copied out and the
  // caller frees the whole masters - or, deferred, it starts as zeros and fill() gives each parameter's part.
  if (own_) master_flat_ = ops::zeros({layout_.shard}, DType::f32, dev_);
  layout_.visit(base, base + layout_.shard, [&](size_t p, int64_t at, int64_t n, int64_t pos) {
    const Tensor& m = *masters[p].second;
    slice_param_.push_back(p);
    slice_at_.push_back(at);
    if (own_) {
      if (!dev_.is_meta() && !deferred_on)  // from the model's device to the shard's
        ops::copy_(host_stage::stretch(master_flat_, pos, n), host_stage::stretch(m, at, n));
      slice_params_.push_back(master_flat_.as_strided({n}, {1}, pos));
    } else {
      slice_params_.push_back(m.as_strided({n}, {1}, m.offset() + at));
    }
    inner_params_.emplace_back(slices_[k++].param, &slice_params_.back());
    slice_pos_.push_back(pos);
  });
  optim_name_ = optim;
}

void ShardedOptimizer::fill(size_t p, const Tensor& value) {
  TR_CHECK(own_ && p < params_.size(), "ShardedOptimizer::fill: parameter {} of {}", p, params_.size());
  TR_CHECK(value.shape() == params_[p].second->shape() && value.dtype() == DType::f32 &&
               value.is_contiguous() && value.device() == model_dev_,
           "ShardedOptimizer::fill: '{}' is {}, expected contiguous f32 {} on {}", params_[p].first,
           value.describe(), shape_str(params_[p].second->shape()), model_dev_.str());
  if (dev_.is_meta() || value.device().is_meta()) return;
  for (size_t k = 0; k < slice_param_.size(); ++k)
    if (slice_param_[k] == p) {
      const int64_t n = slice_params_[k].numel();
      ops::copy_(host_stage::stretch(master_flat_, slice_pos_[k], n),
                 host_stage::stretch(value, slice_at_[k], n));
    }
}

namespace {

// A contiguous tensor whose storage starts released: no bytes until FullShard gathers it.
Tensor released_tensor(const Shape& shape, DType dtype, Device device) {
  return Tensor::over(std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype),
                                                ops::allocator_for(device), Storage::Released{}),
                      shape, dtype);
}

}  // namespace

void build_shard(ShardedOptimizer& opt, const nn::ParamList& params,
                 const std::function<Tensor(size_t)>& load, DType compute) {
  TR_CHECK(opt.owns_masters(), "build_shard: the optimizer must own its shard of the masters");
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor& p = *params[i].second;
    Tensor value = load(i);
    opt.fill(i, value);
    Tensor copy = opt.stage() == 3 ? released_tensor(p.shape(), compute, value.device())
                                   : ops::to_dtype(value, compute);
    value = Tensor();
    autograd::set_requires_grad(copy, true);
    p = copy;
  }
}

// The reduced-gradient shard and the optimizer state come at the first use (as torch makes optimizer state
// at the first step): at construction the whole fp32 model may still exist, and they would add to its peak.
void ShardedOptimizer::allocate_state() {
  if (inner_) return;
  grad_flat_ = ops::zeros({layout_.shard}, DType::f32, dev_);
  for (size_t i = 0; i < slice_params_.size(); ++i)
    slice_grads_.push_back(grad_flat_.as_strided({slice_params_[i].numel()}, {1}, slice_pos_[i]));
  inner_ = optim::make_optimizer(optim_name_, inner_params_, opts_);
}

void ShardedOptimizer::reduce_scatter(const std::vector<Tensor>& grads, double scale) {
  allocate_state();
  TR_CHECK(grads.size() == params_.size(), "ShardedOptimizer: {} gradients for {} parameters", grads.size(),
           params_.size());
  if (device_comm()) return reduce_scatter_on_device(grads, scale);
  // On the host in their own dtype: half gradients widen to f32 a visited stretch at a time, so no f32 copy
  // of the whole gradient set exists at once.
  std::vector<Tensor> host(grads.size());
  for (size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined())
      host[i] = dev_.is_meta() ? grads[i] : ops::contiguous(ops::to_device(grads[i], Device::cpu()));
  const int64_t S = layout_.shard;
  const size_t world = static_cast<size_t>(group_.size());
  send_.resize(world * static_cast<size_t>(round_));
  // Round by round, block j of the send buffer is the same stretch of rank j's shard.
  for (int64_t k0 = 0; k0 < S; k0 += round_) {
    const int64_t n = std::min(round_, S - k0);
    std::fill(send_.begin(), send_.begin() + static_cast<std::ptrdiff_t>(world) * n, 0.0f);
    for (size_t j = 0; j < world; ++j) {
      const int64_t lo = static_cast<int64_t>(j) * S + k0;
      float* block = send_.data() + static_cast<int64_t>(j) * n;
      layout_.visit(lo, lo + n, [&](size_t p, int64_t at, int64_t cnt, int64_t pos) {
        const Tensor& h = host[p];
        if (!h.defined()) return;
        const Tensor f = h.dtype() == DType::f32
                             ? h
                             : ops::to_dtype(h.as_strided({cnt}, {1}, h.offset() + at), DType::f32);
        if (dev_.is_meta()) return;  // a dry run: the same allocations, no values
        std::memcpy(block + pos, f.data<float>() + (h.dtype() == DType::f32 ? at : 0),
                    static_cast<size_t>(cnt) * sizeof(float));
      });
    }
    if (dev_.is_meta()) continue;
    float* out = grad_out(k0, n);
    group_.reduce_scatter_sum(send_.data(), out, static_cast<size_t>(n), scratch_);
    if (scale != 1.0) {  // as DDP's buckets: the f32 scale applied to the f32 sums
      const float s = static_cast<float>(scale);
      for (int64_t i = 0; i < n; ++i) out[i] *= s;
    }
    grad_out_done(k0, n);
  }
}

float* ShardedOptimizer::grad_out(int64_t at, int64_t n) {
  if (host_stage::direct(grad_flat_)) return grad_flat_.data<float>() + at;
  staged_.resize(static_cast<size_t>(std::max<int64_t>(n, 1)));
  return staged_.data();
}

void ShardedOptimizer::grad_out_done(int64_t at, int64_t n) {
  if (!host_stage::direct(grad_flat_))
    host_stage::write(staged_.data(), host_stage::stretch(grad_flat_, at, n));
}

// Buckets from the end of the flat space (backward finishes the last parameters first).
void ShardedOptimizer::plan_buckets() {
  buckets_.clear();
  buckets_of_.assign(params_.size(), {});
  for (int64_t hi = layout_.total; hi > 0;) {
    Bucket b;
    b.lo = std::max<int64_t>(0, hi - bucket_elems_);
    b.hi = hi;
    layout_.visit(b.lo, b.hi, [&](size_t p, int64_t, int64_t, int64_t) {
      b.params.push_back(p);
      buckets_of_[p].push_back(buckets_.size());
    });
    buckets_.push_back(std::move(b));
    hi = buckets_.back().lo;
  }
}

void ShardedOptimizer::begin_backward(double scale) {
  TR_CHECK(!in_backward_, "ShardedOptimizer: begin_backward twice");
  allocate_state();
  if (buckets_.empty() && layout_.total > 0) plan_buckets();
  index_.clear();
  pending_.assign(params_.size(), 0);
  for (size_t p = 0; p < params_.size(); ++p) {
    index_[params_[p].second->impl_ptr().get()] = p;
    pending_[p] = static_cast<int>(buckets_of_[p].size());
  }
  for (auto& b : buckets_) b.waiting = static_cast<int>(b.params.size());
  next_bucket_ = 0;
  bucket_scale_ = static_cast<float>(scale);
  in_backward_ = true;
  if (!comm_ && !dev_.is_meta()) comm_ = std::make_unique<CommQueue>(model_dev_, group_);
  // The staging of the shard's stretches (a shard off the host under Gloo) sized here: the communication
  // thread's grad_out allocates nothing.
  if (!dev_.is_meta() && !host_stage::direct(grad_flat_))
    staged_.resize(static_cast<size_t>(std::max<int64_t>(bucket_elems_, 1)));
}

void ShardedOptimizer::grad_ready(const TensorImpl* leaf) {
  const auto it = index_.find(leaf);
  if (!in_backward_ || it == index_.end()) return;
  for (size_t b : buckets_of_[it->second]) --buckets_[b].waiting;
  // Buckets go in order on every rank (collectives pair up by order), each as soon as it is complete.
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].waiting <= 0)
    reduce_bucket(buckets_[next_bucket_++]);
}

void ShardedOptimizer::finish_backward() {
  if (!in_backward_) return;
  while (next_bucket_ < buckets_.size()) reduce_bucket(buckets_[next_bucket_++]);
  in_backward_ = false;
  if (comm_) comm_->drain();  // the shard complete before the statistics read it
}

void ShardedOptimizer::read_grad(size_t p, int64_t at, int64_t n, float* dst) const {
  const Tensor g = params_[p].second->grad();
  if (!g.defined()) {
    if (dst != nullptr) std::fill(dst, dst + n, 0.0f);
    return;
  }
  // A stretch at a time: a half gradient is never widened whole, a GPU's moves only the stretch.
  const Tensor c = ops::contiguous(g);
  const Tensor f = c.dtype() == DType::f32 ? host_stage::stretch(c, at, n)
                                           : ops::to_dtype(host_stage::stretch(c, at, n), DType::f32);
  if (dst == nullptr || dev_.is_meta()) return;  // a dry run: the same allocations, no values
  host_stage::read(f, dst);
}

// The bucket's gradients packed into a free slot (the one before last's reduction done) and those whose
// every bucket is packed dropped, here; then, on the communication thread, each rank sends the part of the
// bucket inside rank j's shard to rank j and adds the parts it receives (its own shard's) in rank order into
// grad_flat_. A dry run reduces nothing and waits for nothing.
void ShardedOptimizer::reduce_bucket(const Bucket& b) {
  const int world = group_.size();
  const int64_t S = layout_.shard;
  std::vector<int64_t> send_counts(static_cast<size_t>(world));
  int64_t total = 0;
  for (int j = 0; j < world; ++j) {
    const int64_t lo = std::max(b.lo, j * S), hi = std::min(b.hi, (j + 1) * S);
    send_counts[static_cast<size_t>(j)] = std::max<int64_t>(0, hi - lo);
    total += send_counts[static_cast<size_t>(j)];
  }
  const int me = group_.rank();
  const int64_t mine_lo = std::max(b.lo, me * S) - me * S, mine = send_counts[static_cast<size_t>(me)];
  BucketSlot& s = slots_[static_cast<size_t>(next_slot_)];
  next_slot_ ^= 1;
  if (comm_) comm_->wait(s.ticket);
  const bool device = device_comm();
  if (device) {
    pack_bucket_on_device(b, s);
  } else {
    s.host.resize(std::max({s.host.size(), static_cast<size_t>(total), size_t{1}}));
    // The bucket's gradient stretch, in flat order, is exactly the concatenation of the ranks' parts.
    layout_.visit(b.lo, b.hi, [&](size_t p, int64_t at, int64_t cnt, int64_t pos) {
      read_grad(p, at, cnt, dev_.is_meta() ? nullptr : s.host.data() + pos);
    });
  }
  for (size_t p : b.params)
    if (--pending_[p] == 0) autograd::zero_grad(*params_[p].second);  // packed: its sum is on its way
  if (dev_.is_meta()) return;
  s.ticket = comm_->push([this, &s, device, send_counts, mine_lo, mine, scale = bucket_scale_] {
    if (device) return reduce_bucket_on_device(s, send_counts, mine_lo, mine, scale);
    float* out = mine > 0 ? grad_out(mine_lo, mine) : nullptr;
    group_.reduce_blocks(s.host.data(), send_counts, out, scratch_);
    if (scale != 1.0f)
      for (int64_t k = 0; k < mine; ++k) out[k] *= scale;
    if (mine > 0) grad_out_done(mine_lo, mine);
  });
}

void ShardedOptimizer::reduce_replicas() {
  if (replicas_ == nullptr || replicas_->size() == 1 || dev_.is_meta()) return;
  allocate_state();
  // One call over the whole shard (the sum's order is the collective's, whatever the shard's device).
  const int64_t n = grad_flat_.numel();
  if (replicas_->reads(dev_) && dev_ != Device::cpu()) {
    replicas_->all_reduce_sum_on(dev_, grad_flat_.data<float>(), static_cast<size_t>(n));
    return;
  }
  float* g = grad_out(0, n);
  if (!host_stage::direct(grad_flat_)) host_stage::read(grad_flat_, g);
  replicas_->all_reduce_sum(g, static_cast<size_t>(n));
  grad_out_done(0, n);
}

Tensor ShardedOptimizer::global_stats(double inv_scale) const {
  TR_CHECK(inner_ != nullptr, "ShardedOptimizer: statistics before any gradient was reduced");
  Tensor stats = ops::grad_stats(slice_grads_, inv_scale, dev_);
  if (dev_.is_meta()) return stats;
  double v[2];
  host_stage::read(stats, v);
  group_.all_reduce_sum(v, 2);
  host_stage::write(v, stats);
  return stats;
}

void ShardedOptimizer::update(const backend::Backend::GradTransform& t, const std::vector<Tensor>& copies) {
  allocate_state();
  inner_->step(slice_grads_, t, {});
  if (stage_ == 3) return;  // the layers are gathered from the updated shard when next used
  if (own_)
    gather_rounded(copies);
  else
    all_gather(copies);
}

// Own masters: each rank rounds its updated slices to the model's half dtype and the halves are gathered
// straight into the model's weights (half the bytes of gathering f32; rounding is per element, so the bits
// are those of rounding the gathered f32).
// Without copies (fp32 training with an offloaded shard) the model's own fp32 weights are gathered into.
void ShardedOptimizer::gather_rounded(const std::vector<Tensor>& copies) {
  const bool into_params = copies.empty() && offloaded_;
  TR_CHECK(into_params || copies.size() == params_.size(),
           "ShardedOptimizer: {} weight copies for {} parameters", copies.size(), params_.size());
  const auto dst = [&](size_t p) -> const Tensor& { return into_params ? *params_[p].second : copies[p]; };
  const DType half = into_params || copies.empty() ? DType::f32 : copies.front().dtype();
  for (size_t p = 0; p < params_.size() && !dev_.is_meta(); ++p)
    TR_CHECK(dst(p).dtype() == half && dst(p).is_contiguous() && dst(p).device() == model_dev_,
             "ShardedOptimizer: weight copy {} is not a contiguous {} tensor on {}", dst(p).describe(),
             dtype_name(half), model_dev_.str());
  if (device_comm()) return gather_on_device(dst, half);
  const size_t es = dtype_size(half);
  const int64_t S = layout_.shard;
  const size_t world = static_cast<size_t>(group_.size());
  gathered_.resize(world * static_cast<size_t>(round_) * es);
  char* recv = gathered_.data();
  for (int64_t k0 = 0; k0 < S; k0 += round_) {
    const int64_t n = std::min(round_, S - k0);
    const Tensor mine = ops::contiguous(ops::to_dtype(master_flat_.as_strided({n}, {1}, k0), half));
    if (dev_.is_meta()) continue;
    const void* from = mine.data_ptr();
    if (!host_stage::direct(mine)) {  // rounded on the shard's device, then to the host
      rounded_.resize(mine.nbytes());
      host_stage::read(mine, rounded_.data());
      from = rounded_.data();
    }
    group_.all_gather(from, recv, static_cast<size_t>(n) * es);
    for (size_t j = 0; j < world; ++j) {
      const int64_t lo = static_cast<int64_t>(j) * S + k0;
      const char* block = recv + static_cast<size_t>(j) * static_cast<size_t>(n) * es;
      layout_.visit(lo, lo + n, [&](size_t p, int64_t at, int64_t cnt, int64_t pos) {
        host_stage::write(block + static_cast<size_t>(pos) * es, host_stage::stretch(dst(p), at, cnt));
      });
    }
  }
}

Tensor ShardedOptimizer::gather_master(size_t p, int root) {
  TR_CHECK(p < params_.size(), "ShardedOptimizer: master {} of {}", p, params_.size());
  const Tensor& param = *params_[p].second;
  const bool mine_out = group_.rank() == root;
  // A dry run (trainer estimate) takes the memory of the whole tensor and moves no values.
  if (dev_.is_meta()) return mine_out ? ops::empty(param.shape(), DType::f32, dev_) : Tensor();
  // Rank j holds flat [j * S, (j + 1) * S): its part of the parameter's range, consecutive by rank, is the
  // parameter in element order, so the root receives straight into the tensor it returns.
  const int64_t S = layout_.shard, lo = layout_.offset[p], hi = lo + layout_.numel[p];
  std::vector<size_t> counts(static_cast<size_t>(group_.size()));
  for (size_t j = 0; j < counts.size(); ++j) {
    const int64_t a = std::max(lo, static_cast<int64_t>(j) * S),
                  b = std::min(hi, (static_cast<int64_t>(j) + 1) * S);
    counts[j] = a < b ? static_cast<size_t>(b - a) * sizeof(float) : 0;
  }
  const int64_t first = std::max(lo, group_.rank() * S);  // this rank's first element of the parameter
  const size_t mine = counts[static_cast<size_t>(group_.rank())];
  const float* from = nullptr;
  std::vector<float> staged;
  if (mine) {
    const int64_t n = static_cast<int64_t>(mine / sizeof(float));
    const Tensor src = own_ ? host_stage::stretch(master_flat_, first - group_.rank() * S, n)
                            : host_stage::stretch(param, first - lo, n);
    if (host_stage::direct(src)) {
      from = src.data<float>();
    } else {
      staged.resize(static_cast<size_t>(n));
      host_stage::read(src, staged.data());
      from = staged.data();
    }
  }
  Tensor out = mine_out ? ops::empty(param.shape(), DType::f32, Device::cpu()) : Tensor();
  group_.gather_v(from, mine, mine_out ? out.data_ptr() : nullptr, counts, root, static_cast<uint32_t>(p));
  return out;
}

// Every rank's updated slices into every rank's masters, a bounded stretch of each shard per call.
void ShardedOptimizer::all_gather(const std::vector<Tensor>& copies) {
  if (device_comm()) {  // a dry run too: the device path's buffers, nothing moved
    gather_on_device([&](size_t p) -> const Tensor& { return *params_[p].second; }, DType::f32);
    return round_into(copies);
  }
  if (dev_.is_meta()) return;  // a dry run of the host path: nothing allocated here
  const int64_t S = layout_.shard;
  const size_t world = static_cast<size_t>(group_.size());
  scratch_.resize(world * static_cast<size_t>(round_));
  const int64_t base = group_.rank() * S;
  send_.resize(std::max(send_.size(), static_cast<size_t>(round_)));
  for (int64_t k0 = 0; k0 < S; k0 += round_) {
    const int64_t n = std::min(round_, S - k0);
    std::fill(send_.begin(), send_.begin() + n, 0.0f);
    layout_.visit(base + k0, base + k0 + n, [&](size_t p, int64_t at, int64_t cnt, int64_t pos) {
      host_stage::read(host_stage::stretch(*params_[p].second, at, cnt), send_.data() + pos);
    });
    group_.all_gather(send_.data(), scratch_.data(), static_cast<size_t>(n) * sizeof(float));
    for (size_t j = 0; j < world; ++j) {
      if (static_cast<int>(j) == group_.rank()) continue;  // this rank's slices are updated in place
      const int64_t lo = static_cast<int64_t>(j) * S + k0;
      const float* block = scratch_.data() + static_cast<int64_t>(j) * n;
      layout_.visit(lo, lo + n, [&](size_t p, int64_t at, int64_t cnt, int64_t pos) {
        host_stage::write(block + pos, host_stage::stretch(*params_[p].second, at, cnt));
      });
    }
  }
  round_into(copies);
}

void ShardedOptimizer::round_into(const std::vector<Tensor>& copies) {
  TR_CHECK(copies.empty() || copies.size() == params_.size(),
           "ShardedOptimizer: {} weight copies for {} parameters", copies.size(), params_.size());
  for (size_t i = 0; i < copies.size(); ++i)
    if (copies[i].defined()) ops::copy_(copies[i], *params_[i].second);  // rounded to nearest even
}

void ShardedOptimizer::step() {
  TR_CHECK(!own_,
           "ShardedOptimizer: with its own masters an update needs the weight copies to gather into; "
           "call step(grads, transform, copies)");
  std::vector<Tensor> grads;
  for (const auto& [name, p] : params_) grads.push_back(p->grad());
  step(grads, {}, {});
}

void ShardedOptimizer::step_params(size_t lo, size_t hi, bool advance) {
  TR_CHECK(lo == 0 && hi == params_.size() && advance,
           "ShardedOptimizer: the shard updates as a whole, not parameters [{}, {}) of {}", lo, hi,
           params_.size());
  step();
}

void ShardedOptimizer::step(const std::vector<Tensor>& grads, const backend::Backend::GradTransform& t,
                            const std::vector<Tensor>& copies) {
  reduce_scatter(grads, 1.0);
  update({t.inv_scale, t.max_norm, global_stats(t.inv_scale)}, copies);
}

void ShardedOptimizer::set_lr(double lr) {
  Optimizer::set_lr(lr);  // opts_: the inner optimizer starts with it, or takes it now
  if (inner_) inner_->set_lr(lr);
}

std::vector<std::pair<std::string, Tensor>> ShardedOptimizer::state_dict() const {
  if (!inner_) {  // no step yet: AdamW's and SGD's state before their first step
    return optim::make_optimizer(optim_name_, inner_params_, opts_)->state_dict();
  }
  return inner_->state_dict();
}

void ShardedOptimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  allocate_state();
  inner_->load_state_dict(state);
}

std::map<std::string, std::string> ShardedOptimizer::shard_metadata() const {
  std::map<std::string, std::string> m{{"zero_stage", std::to_string(stage_)},
                                       {"zero_world_size", std::to_string(group_.size())},
                                       {"zero_rank", std::to_string(group_.rank())}};
  for (const auto& s : slices_)
    m["slice." + s.param] = std::to_string(s.begin) + " " + std::to_string(s.count);
  return m;
}

int64_t ShardedOptimizer::shard_bytes() const {
  return static_cast<int64_t>(grad_flat_.nbytes() + (own_ ? master_flat_.nbytes() : 0)) +
         (inner_ ? inner_->state_bytes() : 0);
}

// ---- checkpoints ----

namespace {
constexpr const char* kWhole = "optimizer.safetensors";

std::string rank_file(int64_t rank) { return "optimizer.rank-" + std::to_string(rank) + ".safetensors"; }

// A file of optimizer state and the slices it holds, by parameter name.
struct StateSource {
  io::SafetensorsFile file;
  std::map<std::string, StateSlice> slices;
};

int64_t metadata_integer(const io::SafetensorsFile& f, const std::string& key, const std::string& text,
                         int64_t lo, int64_t hi) {
  int64_t v = -1;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  TR_CHECK(r.ec == std::errc() && r.ptr == text.data() + text.size() && v >= lo && v <= hi,
           "{}: metadata {} is '{}', expected an integer in [{}, {}]", f.path(), key, text, lo, hi);
  return v;
}

// A rank file's slices from its metadata ("slice.NAME": "BEGIN COUNT").
StateSource rank_source(const fs::path& path, int64_t rank, int64_t world) {
  StateSource s{io::SafetensorsFile::open(path.string()), {}};
  const auto& md = s.file.header().metadata;
  const auto field = [&](const std::string& k) {
    const auto it = md.find(k);
    TR_CHECK(it != md.end(), "{}: metadata {} is missing (not a file of a sharded optimizer)", path.string(),
             k);
    return it->second;
  };
  TR_CHECK(metadata_integer(s.file, "zero_world_size", field("zero_world_size"), 1, 1 << 20) == world &&
               metadata_integer(s.file, "zero_rank", field("zero_rank"), 0, world - 1) == rank,
           "{}: metadata says rank {} of {}, expected rank {} of {} (files of different saves mixed?)",
           path.string(), field("zero_rank"), field("zero_world_size"), rank, world);
  for (const auto& [k, v] : md) {
    if (k.rfind("slice.", 0) != 0) continue;
    const auto sp = v.find(' ');
    TR_CHECK(sp != std::string::npos, "{}: metadata {} is '{}', expected 'BEGIN COUNT'", path.string(), k, v);
    const int64_t b = metadata_integer(s.file, k, v.substr(0, sp), 0, int64_t{1} << 48);
    const int64_t n = metadata_integer(s.file, k, v.substr(sp + 1), 1, int64_t{1} << 48);
    s.slices[k.substr(6)] = {k.substr(6), b, n};
  }
  return s;
}

std::vector<StateSource> state_sources(const fs::path& dir, const nn::ParamList& masters) {
  std::vector<StateSource> out;
  if (fs::exists(dir / kWhole)) {
    out.push_back({io::SafetensorsFile::open((dir / kWhole).string()), {}});
    for (const auto& [name, p] : masters) out.back().slices[name] = {name, 0, p->numel()};
    return out;
  }
  const fs::path first = dir / rank_file(0);
  TR_CHECK(fs::exists(first), "checkpoint {}: missing {} (or the per-rank {} of a sharded run)", dir.string(),
           kWhole, rank_file(0));
  const io::SafetensorsFile head = io::SafetensorsFile::open(first.string());
  const auto& md = head.header().metadata;
  const auto it = md.find("zero_world_size");
  TR_CHECK(it != md.end(), "{}: metadata zero_world_size is missing (not a file of a sharded optimizer)",
           first.string());
  const int64_t world = metadata_integer(head, "zero_world_size", it->second, 1, 1 << 20);
  for (int64_t r = 0; r < world; ++r) {
    TR_CHECK(fs::exists(dir / rank_file(r)),
             "checkpoint {}: missing {}: its optimizer state was saved by {} ranks ({} says so)",
             dir.string(), rank_file(r), world, rank_file(0));
    out.push_back(rank_source(dir / rank_file(r), r, world));
  }
  return out;
}

// The parameter whose state `key` is ("exp_avg.h.0.attn.c_attn.weight" -> "h.0.attn.c_attn.weight").
const StateSlice* slice_of(const std::string& key, const std::map<std::string, StateSlice>& held) {
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) {
    const auto it = held.find(key.substr(dot + 1));
    if (it != held.end()) return &it->second;
  }
  return nullptr;
}

int64_t elements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Whether every file holding `key` holds one element per element of its slice of `param` (a per-element
// state such as exp_avg or momentum_buffer, not a step count). Each file's entry is checked, overlapping
// or not.
bool per_element(const std::string& key, const std::string& param, const std::vector<StateSource>& sources) {
  for (const auto& src : sources) {
    if (!src.file.contains(key)) continue;
    const auto it = src.slices.find(param);
    if (it == src.slices.end() || elements(src.file.info(key).shape) != it->second.count) return false;
  }
  return true;
}

// Elements [want.begin, + want.count) of state `key`, from whichever sources hold them, shaped `shape`.
Tensor assemble(const std::string& dir, const std::string& key, const Shape& shape, const StateSlice& want,
                const std::vector<StateSource>& sources) {
  std::optional<Tensor> out;
  int64_t covered = 0;
  for (const auto& src : sources) {
    const auto it = src.slices.find(want.param);
    if (it == src.slices.end() || !src.file.contains(key)) continue;
    const StateSlice& from = it->second;
    const int64_t lo = std::max(want.begin, from.begin),
                  hi = std::min(want.begin + want.count, from.begin + from.count);
    if (lo >= hi) continue;
    const Tensor t = ops::contiguous(src.file.load(key));
    if (!out) out = ops::zeros(shape, t.dtype(), Device::cpu());
    TR_CHECK(t.dtype() == out->dtype(), "{}: '{}' is {}, the other ranks' files hold {}", src.file.path(),
             key, dtype_name(t.dtype()), dtype_name(out->dtype()));
    const size_t es = dtype_size(t.dtype());
    std::memcpy(static_cast<char*>(out->data_ptr()) + (lo - want.begin) * es,
                static_cast<const char*>(t.data_ptr()) + (lo - from.begin) * es,
                static_cast<size_t>(hi - lo) * es);
    covered += hi - lo;
  }
  TR_CHECK(
      covered == want.count,
      "checkpoint {}: elements [{}, {}) of '{}' ({}) are in none of its optimizer files ({} of {} found)",
      dir, want.begin, want.begin + want.count, want.param, key, covered, want.count);
  return *out;
}

}  // namespace

bool has_optimizer_state(const std::string& dir) {
  return fs::exists(fs::path(dir) / kWhole) || fs::exists(fs::path(dir) / rank_file(0));
}

std::map<std::string, Tensor> load_optimizer_state(const std::string& dir, const optim::Optimizer& opt,
                                                   const nn::ParamList& masters) {
  const auto* sharded = dynamic_cast<const ShardedOptimizer*>(&opt);
  std::map<std::string, Tensor> state;
  const fs::path d(dir);
  if (!sharded && fs::exists(d / kWhole)) {  // the same layout: every entry as saved (load_state_dict checks)
    auto f = io::SafetensorsFile::open((d / kWhole).string());
    for (const auto& t : f.header().tensors) state[t.name] = f.load(t.name);
    return state;
  }
  const std::vector<StateSource> sources = state_sources(d, masters);
  std::map<std::string, StateSlice> whole, held;  // every parameter; the elements this optimizer holds
  std::map<std::string, Shape> shape;             // of a held parameter's state entries
  for (const auto& [name, p] : masters) whole[name] = {name, 0, p->numel()};
  if (sharded) {
    for (const auto& s : sharded->slices()) {
      held[s.param] = s;
      shape[s.param] = {s.count};
    }
  } else {
    held = whole;
    for (const auto& [name, p] : masters) shape[name] = p->shape();
  }
  // The entries the files hold (an optimizer makes some on its first step only: SGD's momentum buffers) and
  // those this one expects (a missing one is named by its load_state_dict).
  std::set<std::string> keys;
  for (const auto& [key, t] : opt.state_dict()) keys.insert(key);
  for (const auto& src : sources)
    for (const auto& t : src.file.header().tensors) keys.insert(t.name);
  for (const std::string& key : keys) {
    const StateSlice* param = slice_of(key, whole);
    if (param != nullptr && held.count(param->param) == 0) continue;  // another rank's slice
    if (param != nullptr && per_element(key, param->param, sources)) {
      const StateSlice& want = held.at(param->param);
      state[key] = assemble(dir, key, shape.at(want.param), want, sources);
      continue;
    }
    for (const auto& src : sources)  // not per element (a step count): any file's, they are equal
      if (src.file.contains(key)) {
        state[key] = src.file.load(key);
        break;
      }
  }
  return state;
}

void save_optimizer_state(const std::string& dir, const optim::Optimizer& opt) {
  if (const auto* sharded = dynamic_cast<const ShardedOptimizer*>(&opt))
    io::save_safetensors((fs::path(dir) / rank_file(sharded->rank())).string(), sharded->state_dict(),
                         sharded->shard_metadata());
  else
    io::save_safetensors((fs::path(dir) / kWhole).string(), opt.state_dict());
}

}  // namespace tr::train
