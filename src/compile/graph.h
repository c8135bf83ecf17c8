// A captured region planned for replay: the recorded calls with every tensor rebound once - buffers the
// region creates to fixed offsets of one arena (compile/memory_plan.h), buffers that existed before it
// (parameters, inputs, model constants) to themselves - so a replay is the flat list of kernel calls, with
// no ops layer, autograd, shape checks or allocator calls.
#pragma once
#include <vector>

#include "compile/device_graph.h"
#include "compile/fuse.h"
#include "compile/memory_plan.h"
#include "compile/recorder.h"

namespace tr::compile {

class Graph {
 public:
  // `outputs`: tensors the caller reads after the region (the gradients, the loss); their buffers are kept
  // to the end of the region, and outputs() gives them as views of the arena. Plans only: the arena is
  // allocated by the first replay, once the capture's own buffers are gone, so the two never add up.
  // `fuse`: merge elementwise chains (compile/fuse.h); the device's backend must run fused calls.
  Graph(Recorder& recorder, const std::vector<Tensor>& outputs, Device device, bool fuse = false);
  // Runs every call on `b` (the device's backend) with Philox offsets moved by `philox_shift`, in `arena`
  // (at least arena_bytes() on the device; graphs that never run at once may share one) or, when null, in
  // an arena of its own allocated by the first replay.
  // With `device_graph`, the calls go to the device as one graph where the backend records them (a CUDA
  // graph: captured at the first such replay, launched after, captured again when an address or the Philox
  // shift it baked in changed); where it cannot, the calls run one by one and device_graph_break() says why.
  void replay(backend::Backend& b, uint64_t philox_shift, const std::shared_ptr<Storage>& arena = nullptr,
              bool device_graph = false);
  // Drops the binding to the arena (the next replay binds again) and any device graph, so that the arena can
  // be freed.
  void release();
  int64_t device_graph_captures() const { return device_graph_.captures(); }
  const std::string& device_graph_break() const { return device_graph_.broken(); }
  // Valid after the first replay.
  const std::vector<Tensor>& outputs() const { return outputs_; }
  size_t num_calls() const { return calls_.size(); }
  int64_t arena_bytes() const { return plan_.arena_bytes; }
  int64_t live_peak() const { return plan_.live_peak; }
  int64_t external_bytes() const { return external_bytes_; }
  const FuseResult& fusion() const { return fusion_; }

 private:
  Tensor bind(const Arg& a) const;
  void materialize(std::shared_ptr<Storage> arena);
  // What a device graph bakes in: the arena's and every external buffer's address, and the Philox shift.
  std::vector<uint64_t> graph_key(uint64_t philox_shift) const;

  std::vector<Call> calls_;
  std::vector<Buffer> buffers_;
  MemoryPlan plan_;
  std::vector<int64_t> offset_of_;  // per buffer: arena offset, -1 for externals
  std::shared_ptr<Storage> arena_;
  const void* bound_base_ = nullptr;        // the arena's bytes when the calls were bound
  std::vector<std::vector<Tensor>> bound_;  // per call, its tensors
  std::vector<Arg> output_args_;
  std::vector<Tensor> outputs_;
  Device device_;
  int64_t external_bytes_ = 0;
  FuseResult fusion_;
  DeviceGraphCache device_graph_;
};

}  // namespace tr::compile
