// Parameter broadcast and bucketed gradient all-reduce overlapping backward; see ddp.h.
#include "train/ddp.h"

#include <algorithm>
#include <cstring>

#include "autograd/node.h"
#include "ops/ops.h"
#include "train/host_stage.h"

namespace tr::train {

namespace {

// `t` as contiguous f32 on the host: `t` itself when it already is (writes then land in place).
Tensor host_f32(const Tensor& t) {
  return ops::contiguous(ops::to_dtype(ops::to_device(t, Device::cpu()), DType::f32));
}

}  // namespace

void broadcast_parameters(dist::ProcessGroup& group, const nn::ParamList& params) {
  for (const auto& [name, p] : params) {
    if (p->device().is_meta()) continue;
    Tensor h = ops::contiguous(ops::to_device(*p, Device::cpu()));
    group.broadcast(h.data_ptr(), h.nbytes(), 0);
    if (h.impl_ptr() != p->impl_ptr()) ops::copy_(*p, ops::to_device(h, p->device()));
  }
}

GradReducer::GradReducer(dist::ProcessGroup& group, int64_t bucket_cap_bytes, double scale)
    : group_(group),
      cap_elems_(std::max<int64_t>(1, bucket_cap_bytes / static_cast<int64_t>(sizeof(float)))),
      scale_(static_cast<float>(scale)) {}

GradReducer::~GradReducer() {
  if (comm_.joinable()) {
    {
      std::lock_guard<std::mutex> g(mu_);
      abort_ = true;
    }
    cv_.notify_all();
    comm_.join();
  }
}

// Buckets fill with the parameters in reverse (backward finishes the last layers first); a gradient larger
// than what is left of a bucket continues in the next one, so no bucket exceeds the cap.
void GradReducer::begin(const nn::ParamList& params) {
  TR_CHECK(!comm_.joinable(), "GradReducer::begin: the previous step's reduction is still running");
  params_.clear();
  index_.clear();
  plan_.clear();
  for (const auto& [name, p] : params) params_.push_back(p);
  device_ = params_.empty() ? Device::cpu() : params_.front()->device();
  for (const Tensor* p : params_)
    TR_CHECK(p->device() == device_, "DDP: parameters on {} and {}; the reducer takes one device",
             device_.str(), p->device().str());
  const size_t n = params_.size();
  host_.assign(n, Tensor());
  summed_.assign(n, 0);
  buckets_of_.assign(n, {});
  plan_.emplace_back();
  for (size_t k = n; k-- > 0;) {
    index_[params_[k]->impl_ptr().get()] = k;
    for (int64_t at = 0, total = params_[k]->numel(); at < total;) {
      if (plan_.back().elems == cap_elems_) plan_.emplace_back();
      Bucket& b = plan_.back();
      const int64_t take = std::min(total - at, cap_elems_ - b.elems);
      b.segs.push_back({k, at, take, b.elems});
      if (buckets_of_[k].empty() || buckets_of_[k].back() != plan_.size() - 1) {
        buckets_of_[k].push_back(plan_.size() - 1);
        ++b.waiting;
      }
      b.elems += take;
      at += take;
    }
  }
  if (plan_.back().elems == 0) plan_.pop_back();
  int64_t largest = 0;
  for (const auto& b : plan_) largest = std::max(largest, b.elems);
  buffer_.pin(device_.is_cuda());
  buffer_.resize(static_cast<size_t>(largest));
  // Made here, on the training thread: allocations keep their order whatever the communication thread does.
  // Kept from step to step (two buckets' worth, each at most --ddp_bucket_cap_mb; `trainer estimate` counts
  // them).
  on_device_ = device_ != Device::cpu() && !device_.is_meta();
  const bool remake = !on_device_ || !slots_[0].bucket.defined() || slots_[0].bucket.device() != device_ ||
                      slots_[0].bucket.numel() < largest;
  if (remake) {
    for (Slot& s : slots_) s = Slot();  // the old ones go first: never more than two at once
    scale_t_ = Tensor();
  }
  if (on_device_ && remake) {
    for (Slot& s : slots_) {
      s.bucket = ops::empty({std::max<int64_t>(largest, 1)}, DType::f32, device_);
      if (device_.is_cuda()) s.packed = std::make_unique<backend::ComputeFence>(device_);
    }
    scale_t_ = ops::empty({1}, DType::f32, device_);
  }
  if (on_device_) ops::fill_(scale_t_, scale_);
  finishing_ = abort_ = false;
  error_ = nullptr;
  next_pack_ = packed_ = reduced_ = 0;
  comm_ = std::thread([this] { run_buckets(); });
}

void GradReducer::grad_ready(const TensorImpl* leaf) {
  const auto it = index_.find(leaf);
  if (it == index_.end()) return;  // not a parameter of this model (a test's input, say)
  {
    std::lock_guard<std::mutex> g(mu_);
    for (size_t b : buckets_of_[it->second]) --plan_[b].waiting;
  }
  cv_.notify_all();
  if (on_device_) pack_ready();
}

void GradReducer::pack_ready() {
  while (next_pack_ < plan_.size()) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (plan_[next_pack_].waiting > 0 && !finishing_) return;
      // The slot's last bucket (next_pack_ - 2) reduced and unpacked first; after a failure, nothing more.
      cv_.wait(lk, [&] { return reduced_ + 2 > next_pack_ || error_ || abort_; });
      if (error_ || abort_) return;
    }
    pack(next_pack_);
    {
      std::lock_guard<std::mutex> g(mu_);
      packed_ = ++next_pack_;
    }
    cv_.notify_all();
  }
}

// Bucket k's segments widened into its slot by copies queued here (a GPU's on the compute stream, right
// after the backward kernels that finished the gradients), then the fence its all-reduce waits for. A
// missing gradient becomes zeros and a strided one contiguous (the same values), here on the training thread.
void GradReducer::pack(size_t k) {
  Slot& s = slots_[k % 2];
  const Bucket& b = plan_[k];
  s.grads.assign(b.segs.size(), Tensor());
  for (size_t i = 0; i < b.segs.size(); ++i) {
    const Segment& seg = b.segs[i];
    const Tensor& p = *params_[seg.param];
    Tensor g = p.grad();
    if (!g.defined() || !g.is_contiguous()) {
      g = g.defined() ? ops::contiguous(g) : ops::zeros(p.shape(), p.dtype(), p.device());
      autograd::set_grad(p, g);
    }
    s.grads[i] = g;
    ops::copy_(host_stage::stretch(s.bucket, seg.slot, seg.n), host_stage::stretch(g, seg.at, seg.n));
  }
  if (s.packed) s.packed->record();
}

void GradReducer::finish() {
  if (!comm_.joinable()) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    finishing_ = true;
  }
  cv_.notify_all();
  if (on_device_) pack_ready();  // the buckets left, whatever their reports
  comm_.join();
  for (Slot& s : slots_) s.grads.clear();  // the gradients are the optimizer's to free now
  if (error_) std::rethrow_exception(error_);
}

// The communication thread: bucket k is reduced after k - 1 on every rank (collectives pair up by order),
// once its gradients are final or backward has ended (host gradients), or once the training thread has
// packed it (a device's).
void GradReducer::run_buckets() {
  try {
    for (size_t k = 0; k < plan_.size(); ++k) {
      Bucket& b = plan_[k];
      bool early = false;
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (on_device_) {
          cv_.wait(lk, [&] { return packed_ > k || abort_; });
          early = !finishing_;
        } else {
          cv_.wait(lk, [&] { return b.waiting <= 0 || finishing_ || abort_; });
          early = b.waiting <= 0 && !finishing_;
        }
        if (abort_) return;
      }
      early_ += early ? 1 : 0;
      if (!on_device_) {
        reduce_bucket(b);
        continue;
      }
      reduce_slot(k);
      {
        std::lock_guard<std::mutex> g(mu_);
        reduced_ = k + 1;
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> g(mu_);
    error_ = std::current_exception();
  }
  cv_.notify_all();  // a training thread waiting for a slot
}

void GradReducer::reduce_bucket(Bucket& b) {
  for (const auto& s : b.segs) {
    if (s.at == 0) {  // the gradient's first bucket: its host f32 copy (a missing gradient: zeros)
      const Tensor& p = *params_[s.param];
      Tensor g = p.grad();
      if (!g.defined()) {
        g = ops::zeros(p.shape(), p.dtype(), p.device());
        autograd::set_grad(p, g);
      }
      host_[s.param] = host_f32(g);
    }
    std::memcpy(buffer_.data() + s.slot, host_[s.param].data<float>() + s.at, static_cast<size_t>(s.n) * 4);
  }
  group_.all_reduce_sum(buffer_.data(), static_cast<size_t>(b.elems));
  ++buckets_;
  if (scale_ != 1.0f)
    for (int64_t i = 0; i < b.elems; ++i) buffer_[static_cast<size_t>(i)] *= scale_;
  for (const auto& s : b.segs) {
    Tensor& h = host_[s.param];
    std::memcpy(h.data<float>() + s.at, buffer_.data() + s.slot, static_cast<size_t>(s.n) * 4);
    summed_[s.param] += s.n;
    if (summed_[s.param] == h.numel()) {  // the whole gradient is summed: back into its own dtype and device
      const Tensor g = params_[s.param]->grad();
      if (h.impl_ptr() != g.impl_ptr())
        ops::copy_(g, ops::to_device(ops::to_dtype(h, g.dtype()), g.device()));
      h = Tensor();
    }
  }
}

// Off the host: bucket k's slot (packed on the training thread) summed in place where the transport reads
// the device's memory (NCCL on its GPU, after the packing's fence; any group on a host partition) or else
// staged through host memory (Gloo beside a GPU: the same bits as a host gradient's bucket), scaled in f32,
// and each segment rounded back into its gradient at once (no whole-gradient copy anywhere). Nothing is
// allocated here.
void GradReducer::reduce_slot(size_t k) {
  const Bucket& b = plan_[k];
  Slot& slot = slots_[k % 2];
  const Tensor bucket = host_stage::stretch(slot.bucket, 0, b.elems);
  const std::vector<Tensor>& grads = slot.grads;
  ++buckets_;
  if (group_.reads(device_)) {
    group_.all_reduce_sum_on(device_, bucket.data<float>(), static_cast<size_t>(b.elems), slot.packed.get());
    // The scale and the rounding in one pass into each gradient: no bucket-sized temporary.
    for (size_t i = 0; i < b.segs.size(); ++i) {
      const Segment& s = b.segs[i];
      ops::scaled_copy_(host_stage::stretch(grads[i], s.at, s.n), host_stage::stretch(bucket, s.slot, s.n),
                        scale_t_);
    }
    return;
  }
  host_stage::read(bucket, buffer_.data());
  group_.all_reduce_sum(buffer_.data(), static_cast<size_t>(b.elems));
  if (scale_ != 1.0f)
    for (int64_t i = 0; i < b.elems; ++i) buffer_[static_cast<size_t>(i)] *= scale_;
  host_stage::write(buffer_.data(), bucket);
  for (size_t i = 0; i < b.segs.size(); ++i) {
    const Segment& s = b.segs[i];
    ops::copy_(host_stage::stretch(grads[i], s.at, s.n), host_stage::stretch(bucket, s.slot, s.n));
  }
}

}  // namespace tr::train
