// ZeRO's collectives over the model's device's own memory: ZeRO-2's (ShardedOptimizer, zero.h) gradients
// widened into a device buffer and reduced into the shard, the updated shard gathered into the model's
// weights; ZeRO-3's (FullShard, zero3.h) chunks gathered into the layers and their gradients reduced into
// the shard - each by device kernels and the group's device collectives (NCCL on its GPU), with no host copy
// in between.
#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"
#include "train/host_stage.h"
#include "train/zero.h"
#include "train/zero3.h"

namespace tr::train {

namespace {

using host_stage::stretch;

// Multiplies contiguous f32 `t` by the f32 value of `scale` in place: the host path's `x *= s` in f32.
void scale_in_place(const Tensor& t, double scale) {
  if (scale == 1.0 || t.numel() == 0) return;
  ops::binary_(ops::BinaryOp::mul, t, ops::full({1}, static_cast<float>(scale), DType::f32, t.device()));
}

// Elements [at, at + n) of gradient g (contiguous, any floating dtype; undefined: zeros) into f32 `dst`.
void widen_into(const Tensor& dst, const Tensor& g, int64_t at) {
  if (g.defined())
    ops::copy_(dst, stretch(g, at, dst.numel()));
  else
    ops::fill_(dst, 0.0);
}

}  // namespace

// A dry run (the meta device, a group that reads its memory) takes the same buffers and moves nothing.
bool ShardedOptimizer::device_comm() const {
  return !offloaded_ && dev_ != Device::cpu() && group_.reads(dev_);
}

// Round by round, as the host path: block j of the send buffer is the same stretch of rank j's shard, and
// the sum of every rank's block for this rank lands in the gradient shard itself.
void ShardedOptimizer::reduce_scatter_on_device(const std::vector<Tensor>& grads, double scale) {
  const int64_t S = layout_.shard, world = group_.size();
  std::vector<Tensor> g(grads.size());
  for (size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined()) {
      TR_CHECK(grads[i].device() == dev_, "ShardedOptimizer: gradient {} is {}, expected it on {}", i,
               grads[i].describe(), dev_.str());
      g[i] = ops::contiguous(grads[i]);
    }
  const Tensor send = ops::empty({world * std::min(round_, std::max<int64_t>(S, 1))}, DType::f32, dev_);
  for (int64_t k0 = 0; k0 < S; k0 += round_) {
    const int64_t n = std::min(round_, S - k0);
    ops::fill_(stretch(send, 0, world * n), 0.0);  // the padding past the last parameter sums to zeros
    for (int64_t j = 0; j < world; ++j)
      layout_.visit(j * S + k0, j * S + k0 + n, [&](size_t p, int64_t at, int64_t cnt, int64_t pos) {
        if (g[p].defined()) widen_into(stretch(send, j * n + pos, cnt), g[p], at);
      });
    const Tensor out = stretch(grad_flat_, k0, n);
    if (!dev_.is_meta())
      group_.reduce_scatter_sum_on(dev_, send.data<float>(), out.data<float>(), static_cast<size_t>(n));
    scale_in_place(out, scale);
  }
}

// The bucket's gradient stretch, in flat order (the concatenation of the ranks' blocks), widened into the
// slot by device copies queued on the training thread, before the gradients are dropped. The slots are made
// at the first bucket, for the cap: the allocation order does not depend on timing.
void ShardedOptimizer::pack_bucket_on_device(const Bucket& b, BucketSlot& s) {
  if (!s.send.defined()) {
    s.send = ops::empty({std::max<int64_t>(bucket_elems_, 1)}, DType::f32, dev_);
    s.scale = ops::empty({1}, DType::f32, dev_);
    if (dev_.is_cuda()) s.packed = std::make_unique<backend::ComputeFence>(dev_);
  }
  layout_.visit(b.lo, b.hi, [&](size_t p, int64_t at, int64_t cnt, int64_t pos) {
    const Tensor grad = params_[p].second->grad();
    widen_into(stretch(s.send, pos, cnt), grad.defined() ? ops::contiguous(grad) : grad, at);
  });
  if (bucket_scale_ != 1.0f) ops::fill_(s.scale, bucket_scale_);  // read by this slot's reduction
  // The reduction waits for this point, not for the rest of backward queued by the time it is issued.
  if (s.packed) s.packed->record();
}

// On the communication thread: the owners' sums straight into the gradient shard, scaled there in f32 (the
// host path's `x *= s`); nothing is allocated here.
void ShardedOptimizer::reduce_bucket_on_device(BucketSlot& s, const std::vector<int64_t>& counts,
                                               int64_t mine_lo, int64_t mine, float scale) {
  const Tensor out = stretch(grad_flat_, mine > 0 ? mine_lo : 0, mine);
  group_.reduce_blocks_on(dev_, s.send.data<float>(), counts, out.data<float>(), s.packed.get());
  if (scale != 1.0f && mine > 0) ops::binary_(ops::BinaryOp::mul, out, s.scale);
}

void ShardedOptimizer::gather_on_device(const std::function<const Tensor&(size_t)>& dst, DType dtype) {
  const int64_t S = layout_.shard, world = group_.size(), me = group_.rank(), base = me * S;
  const int64_t cap = std::min(round_, std::max<int64_t>(S, 1));
  const Tensor recv = ops::empty({world * cap}, dtype, dev_);
  const Tensor send = own_ ? Tensor() : ops::empty({cap}, dtype, dev_);
  for (int64_t k0 = 0; k0 < S; k0 += round_) {
    const int64_t n = std::min(round_, S - k0);
    Tensor mine;
    if (own_) {  // rounded on the device: the bits of rounding the gathered f32
      mine = ops::contiguous(ops::to_dtype(stretch(master_flat_, k0, n), dtype));
    } else {  // the fp32 parameters' slices of this stretch (zeros past the last parameter)
      mine = stretch(send, 0, n);
      ops::fill_(mine, 0.0);
      layout_.visit(base + k0, base + k0 + n, [&](size_t p, int64_t at, int64_t cnt, int64_t pos) {
        ops::copy_(stretch(mine, pos, cnt), stretch(*params_[p].second, at, cnt));
      });
    }
    if (dev_.is_meta()) continue;
    group_.all_gather_on(dev_, mine.data_ptr(), recv.data_ptr(), static_cast<size_t>(mine.nbytes()));
    for (int64_t j = 0; j < world; ++j) {
      if (!own_ && j == me) continue;  // fp32 parameters: this rank's slices were updated in place
      layout_.visit(j * S + k0, j * S + k0 + n, [&](size_t p, int64_t at, int64_t cnt, int64_t pos) {
        ops::copy_(stretch(dst(p), at, cnt), stretch(recv, j * n + pos, cnt));
      });
    }
  }
}

// This rank's pieces of the chunk rounded from its fp32 shard into one buffer; every rank's (the chunk in
// flat order, so by rank) gathered and copied into the parameters.
void FullShard::gather_chunk_on_device(const Chunk& c) {
  const Device dev = opt_.shard_device();
  const int me = opt_.rank();
  const int64_t base = static_cast<int64_t>(me) * opt_.layout().shard;
  const int64_t mine = c.per_rank[static_cast<size_t>(me)];
  const size_t es = dtype_size(dtype_);
  int64_t total = 0;
  std::vector<size_t> counts(c.per_rank.size());
  for (size_t j = 0; j < counts.size(); ++j) {
    counts[j] = static_cast<size_t>(c.per_rank[j]) * es;
    total += c.per_rank[j];
  }
  const Tensor& send = gather_send_;
  const Tensor& recv = gather_recv_;
  TR_CHECK(send.numel() >= mine && recv.numel() >= total && send.device() == dev,
           "FullShard: gather buffers of {} and {} elements for a chunk of {} ({} this rank's)", send.numel(),
           recv.numel(), total, mine);
  int64_t pos = 0;
  for (const Piece& p : c.pieces) {
    if (p.owner != me) continue;
    ops::copy_(stretch(send, pos, p.n), stretch(opt_.master_flat_, p.flat - base, p.n));
    pos += p.n;
  }
  opt_.group_.all_gather_v_on(dev, send.data_ptr(), static_cast<size_t>(mine) * es, recv.data_ptr(), counts);
  pos = 0;
  for (const Piece& p : c.pieces) {
    ops::copy_(stretch(*params_[p.param].second, p.at, p.n), stretch(recv, pos, p.n));
    pos += p.n;
  }
}

std::pair<int64_t, int64_t> FullShard::largest_chunk() const {
  int64_t mine = 1, total = 1;
  for (const Unit& u : units_)
    for (const Chunk& c : u.chunks) {
      int64_t t = 0;
      for (int64_t n : c.per_rank) t += n;
      mine = std::max(mine, c.per_rank[static_cast<size_t>(opt_.rank())]);
      total = std::max(total, t);
    }
  return {mine, total};
}

void FullShard::make_gather_buffers() {
  const auto [mine, total] = largest_chunk();
  gather_send_ = ops::empty({mine}, dtype_, opt_.shard_device());
  gather_recv_ = ops::empty({total}, dtype_, opt_.shard_device());
}

void FullShard::make_slots() {
  if (slots_[0].send.defined()) return;
  const auto [mine, total] = largest_chunk();
  const Device dev = opt_.shard_device();
  for (Slot& s : slots_) {
    s.send = ops::empty({total}, DType::f32, dev);
    s.sum = ops::empty({mine}, DType::f32, dev);
    s.scale = ops::empty({1}, DType::f32, dev);
    if (dev.is_cuda()) s.packed = std::make_unique<backend::ComputeFence>(dev);
  }
}

// The chunk's gradient pieces widened into the slot by device copies queued here, on the training thread,
// before the gradients are dropped: a gradient's memory is reused only after the copies that read it.
void FullShard::pack_chunk_on_device(const Chunk& c, Slot& s) {
  int64_t pos = 0;
  for (const Piece& p : c.pieces) {
    const Tensor g = params_[p.param].second->grad();
    widen_into(stretch(s.send, pos, p.n), g.defined() ? ops::contiguous(g) : g, p.at);
    pos += p.n;
  }
  if (scale_ != 1.0f) ops::fill_(s.scale, scale_);  // read by this slot's reduction, queued after
  if (s.packed) s.packed->record();                 // what the reduction waits for (not the rest of backward)
}

// Every rank's gradient pieces of the chunk summed into their owners; this rank's sums, times the scale,
// added into its gradient shard (accumulating over micro-batches), as the host path does in f32. On the
// communication thread: the collective waits for the packing copies (NCCL: for the compute-stream point the
// packing recorded), and the additions queue behind it; nothing is allocated here.
void FullShard::reduce_chunk_on_device(const Chunk& c, Slot& s, float scale) {
  const Device dev = opt_.shard_device();
  const int me = opt_.rank();
  const int64_t base = static_cast<int64_t>(me) * opt_.layout().shard;
  const int64_t mine = c.per_rank[static_cast<size_t>(me)];
  if (meta_) return;
  opt_.group_.reduce_blocks_on(dev, s.send.data<float>(), c.per_rank, s.sum.data<float>(), s.packed.get());
  const Tensor sum = stretch(s.sum, 0, mine);
  if (scale != 1.0f && mine > 0) ops::binary_(ops::BinaryOp::mul, sum, s.scale);
  int64_t pos = 0;
  for (const Piece& p : c.pieces) {
    if (p.owner != me) continue;
    ops::binary_(ops::BinaryOp::add, stretch(opt_.grad_flat_, p.flat - base, p.n), stretch(sum, pos, p.n));
    pos += p.n;
  }
}

}  // namespace tr::train
