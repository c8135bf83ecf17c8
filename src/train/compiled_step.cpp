// The captured training step (torch_compile); see train_step.h. The first step of each shape runs eagerly
// under a compile::Recorder; its forward and backward become a planned compile::Graph that later steps of
// that shape replay, copying the batch into the graph's static inputs. Gradient statistics and the
// optimizer run after the replay as in the eager step, so the two give the same bits.
#include <algorithm>
#include <cstdio>
#include <map>

#include <fmt/format.h>

#include "autograd/node.h"
#include "compile/graph.h"
#include "ops/ops.h"
#include "train/step_core.h"

namespace tr::train {

namespace {

constexpr size_t kMaxPlans = 8;  // torch._dynamo's cache_size_limit

// What a plan is valid for: the micro-batch shapes. The values that change from step to step with the same
// shapes - the label-token count (the losses' divisor), the fp16 loss scale (the backward's seed) and the
// dropout generator's position - are read by the captured calls from fixed buffers or shifted at replay, so
// one plan serves every step of a shape.
std::string shape_key(const std::vector<data::Batch>& micro) {
  std::string k = fmt::format("{} x", micro.size());
  for (const auto& b : micro) k += fmt::format(" [{}, {}]", b.input_ids.size(0), b.input_ids.size(1));
  return k;
}

// The loader's labels are its input ids (the model shifts them): then the plan's static inputs hold one
// buffer for both, as the eager step does. A batch with labels of its own (masked with -100) needs its own.
bool labels_are_ids(const data::Batch& b) {
  const Tensor &l = b.labels, &i = b.input_ids;
  return l.same(i) || (l.storage() == i.storage() && l.offset() == i.offset() && l.shape() == i.shape() &&
                       l.strides() == i.strides() && l.dtype() == i.dtype());
}

std::string plan_key(const std::vector<data::Batch>& micro) {
  std::string k = shape_key(micro);
  for (const auto& b : micro) k += labels_are_ids(b) ? "" : "*";
  return k;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

struct Plan {
  std::vector<data::Batch> inputs;  // static: each step's batch is copied here
  int64_t input_bytes = 0;          // theirs (the loader's batches of a step take as much)
  int64_t held_bytes = 0;           // allocated between steps after the capture, this plan's inputs held
  int64_t finish_bytes = 0;         // what the optimizer step allocates for itself, beside the arena
  std::unique_ptr<compile::Graph> graph;
  uint64_t philox_base = 0, philox_used = 0;  // the dropout generator at capture, and what a step draws
  bool said_graph = false;                    // device graphs: the notice of its first replay given
};

class CompiledStep final : public TrainStep {
 public:
  // DDP buckets go after backward: a replay runs no autograd engine to report gradients ready.
  CompiledStep(StepState s, StepOptions o) : core_(s, std::move(o), /*overlap=*/false) {}

  StepResult run(int64_t step, std::vector<data::Batch> micro, double lr) override {
    core_.load_step_scalars(core_.label_tokens(micro));  // outside any capture: read, not recorded
    if (core_.state().opt.updates_in_backward()) {
      // A replay runs no autograd engine to report gradients final, and would bake each step's learning
      // rate into the updates it recorded (torch.compile breaks its graph at lomo_optim's hooks as well).
      if (!said_backward_updates_)
        std::fprintf(
            stderr,
            "\ntorch_compile: the step runs eagerly: this optimizer updates each parameter during "
            "backward, as the engine reports its gradient final, which a captured step cannot replay\n");
      said_backward_updates_ = true;
      return eager(step, micro, lr);
    }
    const std::string key = plan_key(micro);
    if (auto it = plans_.find(key); it != plans_.end()) {
      if (it->second.graph) return replay(it->second, key, step, std::move(micro), lr);
      return eager(step, micro, lr);  // this shape could not be captured (said once)
    }
    if (plans_.size() >= kMaxPlans) {
      if (!said_cap_)
        std::fprintf(stderr, "\ntorch_compile: %zu step shapes captured (the cap); new shapes run eagerly\n",
                     kMaxPlans);
      said_cap_ = true;
      return eager(step, micro, lr);
    }
    return capture(key, step, std::move(micro), lr);
  }

  // The shared arena's size: the largest plan's.
  int64_t largest_arena() const {
    int64_t m = 0;
    for (const auto& [key, plan] : plans_)
      if (plan.graph) m = std::max(m, plan.graph->arena_bytes());
    return m;
  }

  int64_t captured_shapes() const override {
    return std::count_if(plans_.begin(), plans_.end(),
                         [](const auto& kv) { return kv.second.graph != nullptr; });
  }

  int64_t device_graph_captures() const override {
    int64_t n = 0;
    for (const auto& [key, plan] : plans_)
      if (plan.graph) n += plan.graph->device_graph_captures();
    return n;
  }
  int64_t planned_peak_bytes() const override { return planned_peak_; }
  int64_t replayed_peak_bytes() const override { return replayed_peak_; }

  // What a replay of `p` holds at most, as planned at its capture with the shared arena as it is now: the
  // loader's batches at the start (the arena is not held then), then the arena and the optimizer step.
  // With device graphs the arena stays between steps (a graph is bound to its address), beside the batch.
  int64_t planned_peak(const Plan& p) const {
    if (keeps_arena()) return p.held_bytes + largest_arena() + std::max(p.input_bytes, p.finish_bytes);
    return p.held_bytes + std::max(p.input_bytes, largest_arena() + p.finish_bytes);
  }

  void release_memory() override {
    for (auto& [key, plan] : plans_) {
      if (plan.graph) plan.graph->release();
      set_inputs_held(plan, false);
    }
    replaying_ = nullptr;
    arena_.reset();
  }

 private:
  bool keeps_arena() const { return core_.options().device_graphs; }

  // A plan that draws (dropout) replays as a graph where the device adds each step's Philox shift at launch.
  bool graphs_for(const Plan& p) const {
    return core_.options().device_graphs &&
           (p.philox_used == 0 || backend::backend_for(core_.options().device).philox_shift_on_device());
  }

  // Once per plan, on a GPU: whether its replays are one CUDA graph launch, and why not.
  void say_graph(Plan& p, const std::string& key) {
    if (p.said_graph || !core_.options().device_graphs) return;
    p.said_graph = true;
    const std::string why = graphs_for(p)
                                ? p.graph->device_graph_break()
                                : "dropout draws new Philox offsets every step, which this backend's "
                                  "graphs would replay as constants";
    if (why.empty())
      std::fprintf(stderr, "torch_compile: the step for %s replays as one CUDA graph (%zu kernel calls)\n",
                   key.c_str(), p.graph->num_calls());
    else
      std::fprintf(stderr, "torch_compile: the step for %s replays kernel by kernel: %s\n", key.c_str(),
                   why.c_str());
  }

  // The loader's copy of a batch, once the static inputs hold it: freed now (when nothing else holds it),
  // so that the step's memory is the eager step's and not one batch more.
  static void drop_batch(data::Batch& b) { b.input_ids = b.labels = b.host_labels = Tensor(); }

  // A plan's static inputs are memory only while it replays: released for the others' replays, evaluation
  // and saves (the graph keeps its binding; the bytes come back, possibly elsewhere, before the copy in).
  static void set_inputs_held(Plan& p, bool held) {
    for (auto& b : p.inputs)
      for (const Tensor* t : {&b.input_ids, &b.labels}) {
        if (held)
          t->storage()->reacquire();
        else
          t->storage()->release();
      }
  }

  StepResult eager(int64_t step, const std::vector<data::Batch>& micro, double lr) {
    release_memory();  // with eager's memory, not beside the arena
    StepResult r;
    const Tensor loss = core_.forward_backward(step, micro, r, lr);
    core_.finish(step, lr, loss, r);
    return r;
  }

  StepResult capture(const std::string& key, int64_t step, std::vector<data::Batch> micro, double lr) {
    release_memory();  // the capture runs eagerly: with eager's memory, not beside the arena
    Plan& p = plans_[key];
    for (auto& b : micro) {  // the graph reads its inputs from buffers it owns, in place of the loader's
      data::Batch s = b;
      s.input_ids = ops::clone(b.input_ids);
      s.labels = labels_are_ids(b) ? s.input_ids : ops::clone(b.labels);
      s.host_labels = Tensor();  // counted before the step (run()); a replay counts its own batch's
      p.input_bytes +=
          static_cast<int64_t>(s.input_ids.nbytes() + (labels_are_ids(b) ? 0 : s.labels.nbytes()));
      p.inputs.push_back(std::move(s));
      drop_batch(b);
    }
    const Device dev = core_.options().device;
    Generator& gen = core_.state().dropout_gen;
    compile::Recorder rec(backend::backend_for(dev));
    p.philox_base = gen.state().offset;
    StepResult r;
    Tensor loss;
    {
      const backend::InterposeScope scope(dev, rec);
      loss = core_.forward_backward(step, p.inputs, r, lr);
    }
    p.philox_used = gen.state().offset - p.philox_base;
    std::string why = rec.break_reason();
    if (why.empty()) {
      std::vector<Tensor> outputs = core_.state().mp.model_grads();
      outputs.push_back(loss);
      try {
        p.graph = std::make_unique<compile::Graph>(rec, outputs, dev, core_.options().fuse_elementwise);
      } catch (const Error& e) {
        why = e.what();
      }
    }
    // This step's own result (the capture ran it), and what the optimizer step allocates for itself, which
    // a replay adds beside the arena (the state a first step creates stays: it is counted in what is held).
    Allocator& alloc = ops::allocator_for(dev);
    const int64_t at_finish = alloc.stats().current_bytes, state_before = core_.state().opt.state_bytes();
    alloc.begin_window();
    core_.finish(step, lr, loss, r);
    loss = Tensor();
    // The window's peak read first: state_bytes() may materialize small tensors (state_dict's step counts).
    const int64_t window_peak = alloc.stats().window_peak_bytes;
    const int64_t finish_own = window_peak - at_finish - (core_.state().opt.state_bytes() - state_before);
    if (p.graph) {
      // Between steps only what outlives a step is allocated: parameters, optimizer state, this plan's static
      // inputs (the arena is released).
      p.held_bytes = alloc.stats().current_bytes;
      p.finish_bytes = std::max<int64_t>(finish_own, 0);
      const compile::FuseResult& fu = p.graph->fusion();
      const std::string fused = fu.chains
                                    ? fmt::format(" ({} elementwise calls fused into {}, {} buffers elided)",
                                                  fu.calls_fused, fu.chains, fu.buffers_elided)
                                    : "";
      std::fprintf(
          stderr,
          "\ntorch_compile: captured the step for %s: %zu kernel calls%s; planned peak %.1f MiB = arena "
          "%.1f MiB (live peak %.1f MiB) + %.1f MiB held between steps + %.1f MiB the optimizer step's own\n",
          key.c_str(), p.graph->num_calls(), fused.c_str(), mib(planned_peak(p)), mib(largest_arena()),
          mib(p.graph->live_peak()), mib(p.held_bytes), mib(p.finish_bytes));
      replaying_ = &p;  // its inputs are held
    } else {
      std::fprintf(stderr, "\ntorch_compile: the step for %s runs eagerly: %s\n", key.c_str(), why.c_str());
    }
    return r;
  }

  StepResult replay(Plan& p, const std::string& key, int64_t step, std::vector<data::Batch> micro,
                    double lr) {
    const Device dev = core_.options().device;
    StepResult r;
    Allocator& alloc = ops::allocator_for(dev);
    alloc.begin_window();    // from the loader's batch (already drawn) to the end of the optimizer step
    if (&p != replaying_) {  // only one plan's inputs are held at a time
      for (auto& [key, other] : plans_) set_inputs_held(other, false);
      set_inputs_held(p, true);
      replaying_ = &p;
    }
    for (size_t i = 0; i < micro.size(); ++i) {
      if (core_.options().on_micro_batch) core_.options().on_micro_batch(step, micro[i].input_ids);
      ops::copy_(p.inputs[i].input_ids, micro[i].input_ids);
      if (!labels_are_ids(micro[i])) ops::copy_(p.inputs[i].labels, micro[i].labels);
      r.tokens += micro[i].input_ids.numel();
      drop_batch(micro[i]);
    }
    Generator& gen = core_.state().dropout_gen;
    const Generator::State g = gen.state();
    // One arena for every plan (one replays at a time), sized for the largest: after a release (capture,
    // evaluation, save) it comes back at that size, so it never grows while a smaller one is still bound.
    // Between steps its bytes go back to the allocator (whose cache returns the same block on the CPU) so
    // that the loader's next batches never sit beside it; the binding stays. Not with device graphs, which
    // would be captured again whenever the bytes came back elsewhere.
    if (!arena_) {
      arena_ = std::make_shared<Storage>(static_cast<size_t>(std::max<int64_t>(largest_arena(), 1)),
                                         ops::allocator_for(dev), Storage::Released{});
    }
    arena_->reacquire();
    {
      const ops::Range span(dev, "compiled forward + backward (replay)");
      p.graph->replay(backend::backend_for(dev), g.offset - p.philox_base, arena_, graphs_for(p));
    }
    say_graph(p, key);
    gen.set_state({g.seed, g.offset + p.philox_used});
    if (core_.empties_cache(step)) core_.empty_cache(r);
    // The gradients back in the parameters' slots, as the backward left them; the loss is the last output.
    const std::vector<Tensor>& out = p.graph->outputs();
    const nn::ParamList& params = core_.params();
    for (size_t i = 0; i + 1 < out.size(); ++i)
      if (out[i].defined()) autograd::set_grad(*params[i].second, out[i]);
    core_.finish(step, lr, out.back(), r);  // the gradients dropped: nothing in the arena is read again
    if (!keeps_arena()) arena_->release();
    planned_peak_ = std::max(planned_peak_, planned_peak(p));
    replayed_peak_ = std::max(replayed_peak_, alloc.stats().window_peak_bytes);
    return r;
  }

  StepCore core_;
  std::map<std::string, Plan> plans_;
  std::shared_ptr<Storage> arena_;
  bool said_cap_ = false, said_backward_updates_ = false;
  int64_t planned_peak_ = 0, replayed_peak_ = 0;  // over the replays so far: as planned, as measured
  const Plan* replaying_ = nullptr;  // the plan whose static inputs are held (null: none since a release)
};

}  // namespace

std::unique_ptr<TrainStep> make_compiled_step(StepState state, StepOptions options) {
  return std::make_unique<CompiledStep>(state, std::move(options));
}

}  // namespace tr::train
