// Parameter broadcast and bucketed gradient all-reduce; see ddp.h.
#include "train/ddp.h"

#include <algorithm>
#include <cstring>

#include "autograd/node.h"
#include "ops/ops.h"

namespace tr::train {

namespace {

// `t` as contiguous f32 on the host: `t` itself when it already is (writes then land in place).
Tensor host_f32(const Tensor& t) {
  return ops::contiguous(ops::to_dtype(ops::to_device(t, Device::cpu()), DType::f32));
}

// Writes `h` (host f32) back into `t` unless it is `t`'s own storage.
void write_back(const Tensor& t, const Tensor& h) {
  if (h.impl_ptr() == t.impl_ptr()) return;
  ops::copy_(t, ops::to_device(ops::to_dtype(h, t.dtype()), t.device()));
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

// A gradient whose elements sit in one or more buckets: its host f32 copy, and how many of them are summed.
struct GradReducer::Pending {
  Tensor grad, host;
  int64_t summed = 0;
};

GradReducer::GradReducer(dist::ProcessGroup& group, int64_t bucket_cap_bytes, double scale)
    : group_(group),
      cap_elems_(std::max<int64_t>(1, bucket_cap_bytes / static_cast<int64_t>(sizeof(float)))),
      scale_(static_cast<float>(scale)) {}

void GradReducer::reduce(const nn::ParamList& params) {
  bucket_.resize(static_cast<size_t>(cap_elems_));
  // Segments of the current bucket: (pending index, element offset in the gradient, count, bucket offset).
  struct Segment {
    size_t pending;
    int64_t at, n, slot;
  };
  std::vector<Pending> pending;
  std::vector<Segment> segs;
  int64_t fill = 0;
  auto flush = [&] {
    if (fill == 0) return;
    group_.all_reduce_sum(bucket_.data(), static_cast<size_t>(fill));
    ++buckets_;
    if (scale_ != 1.0f)
      for (int64_t i = 0; i < fill; ++i) bucket_[static_cast<size_t>(i)] *= scale_;
    for (const auto& s : segs) {
      Pending& p = pending[s.pending];
      std::memcpy(p.host.data<float>() + s.at, bucket_.data() + s.slot, static_cast<size_t>(s.n) * 4);
      p.summed += s.n;
      if (p.summed == p.host.numel()) {
        write_back(p.grad, p.host);
        p.host = Tensor();  // a half gradient's f32 copy lives only while its buckets are in flight
        p.grad = Tensor();
      }
    }
    segs.clear();
    fill = 0;
  };
  pending.reserve(params.size());
  for (auto it = params.rbegin(); it != params.rend(); ++it) {  // backward finishes the last layers first
    const Tensor& param = *it->second;
    Tensor g = param.grad();
    if (!g.defined()) {
      g = ops::zeros(param.shape(), param.dtype(), param.device());
      autograd::set_grad(param, g);
    }
    if (g.numel() == 0) continue;
    pending.push_back({g, host_f32(g), 0});
    const size_t k = pending.size() - 1;
    for (int64_t at = 0; at < g.numel();) {
      if (fill == cap_elems_) flush();
      const int64_t n = std::min(g.numel() - at, cap_elems_ - fill);
      std::memcpy(bucket_.data() + fill, pending[k].host.data<float>() + at, static_cast<size_t>(n) * 4);
      segs.push_back({k, at, n, fill});
      fill += n;
      at += n;
    }
  }
  flush();
}

}  // namespace tr::train
