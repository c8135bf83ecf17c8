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
  // Kept from step to step (one bucket's worth, at most --ddp_bucket_cap_mb; `trainer estimate` counts it).
  const bool on_device = device_ != Device::cpu() && !device_.is_meta();
  if (!on_device || (device_bucket_.defined() && device_bucket_.device() != device_))
    device_bucket_ = Tensor();
  if (on_device && (!device_bucket_.defined() || device_bucket_.numel() < largest)) {
    device_bucket_ = Tensor();  // the old one goes first: never two at once
    device_bucket_ = ops::empty({std::max<int64_t>(largest, 1)}, DType::f32, device_);
  }
  finishing_ = abort_ = false;
  error_ = nullptr;
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
}

void GradReducer::finish() {
  if (!comm_.joinable()) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    finishing_ = true;
  }
  cv_.notify_all();
  comm_.join();
  if (error_) std::rethrow_exception(error_);
}

// The communication thread: bucket k is reduced after k - 1 on every rank (collectives pair up by order),
// once its gradients are final or backward has ended.
void GradReducer::run_buckets() {
  try {
    for (auto& b : plan_) {
      bool early = false;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return b.waiting <= 0 || finishing_ || abort_; });
        if (abort_) return;
        early = b.waiting <= 0 && !finishing_;
      }
      early_ += early ? 1 : 0;
      if (device_bucket_.defined())
        reduce_device_bucket(b);
      else
        reduce_bucket(b);
    }
  } catch (...) {
    error_ = std::current_exception();
  }
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

// Off the host: each segment widened into the device bucket, the bucket summed in place where the transport
// reads the device's memory (NCCL on its GPU, any group on a host partition) or else staged through host
// memory (Gloo beside a GPU: the same bits as a host gradient's bucket), scaled in f32, and each segment
// rounded back into its gradient at once (no whole-gradient copy anywhere).
void GradReducer::reduce_device_bucket(Bucket& b) {
  const Tensor bucket = host_stage::stretch(device_bucket_, 0, b.elems);
  std::vector<Tensor> grads(b.segs.size());
  for (size_t i = 0; i < b.segs.size(); ++i) {
    const Segment& s = b.segs[i];
    const Tensor& p = *params_[s.param];
    Tensor g = p.grad();
    if (!g.defined() || !g.is_contiguous()) {  // missing: zeros; strided: made contiguous (the same values)
      g = g.defined() ? ops::contiguous(g) : ops::zeros(p.shape(), p.dtype(), p.device());
      autograd::set_grad(p, g);
    }
    grads[i] = g;
    ops::copy_(host_stage::stretch(bucket, s.slot, s.n), host_stage::stretch(g, s.at, s.n));
  }
  ++buckets_;
  if (group_.reads(device_)) {
    group_.all_reduce_sum_on(device_, bucket.data<float>(), static_cast<size_t>(b.elems));
    // The scale and the rounding in one pass into each gradient: no bucket-sized temporary.
    const Tensor scale = ops::full({1}, scale_, DType::f32, device_);
    for (size_t i = 0; i < b.segs.size(); ++i) {
      const Segment& s = b.segs[i];
      ops::scaled_copy_(host_stage::stretch(grads[i], s.at, s.n), host_stage::stretch(bucket, s.slot, s.n),
                        scale);
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
