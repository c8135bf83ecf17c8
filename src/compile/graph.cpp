// Planning and replaying a captured region; see graph.h.
#include "compile/graph.h"

#include <algorithm>

namespace tr::compile {

Graph::Graph(Recorder& recorder, const std::vector<Tensor>& outputs, Device device, bool fuse) {
  std::vector<int32_t> out_ids;
  for (const Tensor& t : outputs) {
    const int32_t id = recorder.buffer_of(t);
    TR_CHECK(!t.defined() || id >= 0, "compile: output {} was not produced by the captured region",
             t.describe());
    out_ids.push_back(id);
  }
  calls_ = recorder.take_calls();
  buffers_ = recorder.take_buffers();
  const auto end = static_cast<int64_t>(calls_.size());
  for (int32_t id : out_ids)
    if (id >= 0) buffers_[static_cast<size_t>(id)].last = end;  // read after the region
  if (fuse) {
    TR_CHECK(backend::backend_for(device).fuses_elementwise(),
             "compile: the {} backend does not run fused elementwise calls", device.str());
    fusion_ = fuse_elementwise(calls_, buffers_);
  }
  // Only the region's own buffers are planned; externals keep their storage (and count apart).
  std::vector<PlanBuffer> planned;
  std::vector<size_t> planned_id;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const Buffer& b = buffers_[i];
    TR_CHECK(b.device == device, "compile: the captured region touched a buffer on {} (capturing {})",
             b.device.str(), device.str());
    if (b.external) {
      external_bytes_ += b.bytes;
      continue;
    }
    if (b.elided) continue;
    planned.push_back({b.bytes, b.first, b.last});
    planned_id.push_back(i);
  }
  plan_ = plan_memory(planned);
  offset_of_.assign(buffers_.size(), -1);
  for (size_t j = 0; j < planned.size(); ++j) offset_of_[planned_id[j]] = plan_.offsets[j];
  for (size_t k = 0; k < outputs.size(); ++k) {
    const Tensor& o = outputs[k];
    output_args_.push_back(
        out_ids[k] < 0 ? Arg{}
                       : Arg{out_ids[k], o.shape(), o.strides(), o.offset(), o.dtype(), Access::read});
  }
  device_ = device;
}

// Every call's tensors bound to `arena` once (a new one when null).
void Graph::materialize(std::shared_ptr<Storage> arena) {
  if (!arena) {
    Allocator& alloc = backend::backend_for(device_).allocator(device_.index);
    arena = std::make_shared<Storage>(static_cast<size_t>(std::max<int64_t>(plan_.arena_bytes, 1)), alloc);
  }
  TR_CHECK(static_cast<int64_t>(arena->nbytes()) >= plan_.arena_bytes && arena->device() == device_,
           "compile: an arena of {} bytes on {} for a plan of {} bytes on {}", arena->nbytes(),
           arena->device().str(), plan_.arena_bytes, device_.str());
  TR_CHECK(!arena->released(), "compile: replay into a released arena (take its bytes back first)");
  arena_ = std::move(arena);
  bound_base_ = arena_->data();
  bound_.clear();
  outputs_.clear();
  bound_.reserve(calls_.size());
  for (const Call& c : calls_) {
    std::vector<Tensor> t;
    t.reserve(c.args.size());
    for (const Arg& a : c.args) t.push_back(bind(a));
    bound_.push_back(std::move(t));
  }
  for (const Arg& a : output_args_) outputs_.push_back(bind(a));
}

Tensor Graph::bind(const Arg& a) const {
  if (a.buffer < 0) return Tensor();
  const Buffer& b = buffers_[static_cast<size_t>(a.buffer)];
  std::shared_ptr<Storage> s = b.storage;
  if (!b.external) {
    auto* base = static_cast<char*>(arena_->data()) + offset_of_[static_cast<size_t>(a.buffer)];
    s = std::make_shared<Storage>(base, static_cast<size_t>(b.bytes), b.device, arena_);
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(s);
  impl->shape = a.shape;
  impl->strides = a.strides;
  impl->offset = a.offset;
  impl->dtype = a.dtype;
  return Tensor(std::move(impl));
}

void Graph::release() {
  device_graph_.reset();
  arena_.reset();
  bound_.clear();
  outputs_.clear();
}

std::vector<uint64_t> Graph::graph_key(uint64_t philox_shift) const {
  std::vector<uint64_t> k{philox_shift, reinterpret_cast<uintptr_t>(arena_->data())};
  for (const Buffer& buf : buffers_)
    if (buf.external) k.push_back(reinterpret_cast<uintptr_t>(buf.storage->data()));
  return k;
}

void Graph::replay(backend::Backend& b, uint64_t philox_shift, const std::shared_ptr<Storage>& arena,
                   bool device_graph) {
  // Bound tensors point into the arena: bind again when it is another, or its bytes moved (released and
  // taken again between replays).
  if (!arena_ || (arena && arena != arena_) || arena_->data() != bound_base_)
    materialize(arena ? arena : arena_);
  const auto run_calls = [&](uint64_t shift) {
    for (size_t i = 0; i < calls_.size(); ++i) calls_[i].run(b, bound_[i], shift);
  };
  if (device_graph) {
    // Where the device adds the shift at launch, the graph is captured unshifted and serves every step;
    // elsewhere the shift is baked in and a new one captures again.
    const bool on_device = b.philox_shift_on_device();
    if (on_device) b.set_philox_shift(device_.index, philox_shift);
    const auto capture = [&](const std::function<void()>& work) {
      return b.capture_graph(device_.index, work);
    };
    if (device_graph_.run(graph_key(on_device ? 0 : philox_shift), capture,
                          [&] { run_calls(on_device ? 0 : philox_shift); }))
      return;
  }
  run_calls(philox_shift);
}

}  // namespace tr::compile
