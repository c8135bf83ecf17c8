// The define-by-run tape: graph nodes, grad mode, and the backward engine.
// Note [Saved tensors]: a FunctionNode's backward closure owns the tensors it saved; the engine drops the
// closure right after calling it, so saved activations are freed as soon as backward has used them, and a
// second backward through the same graph throws.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tr::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: the input needs no gradient
  uint32_t input_nr = 0;
};

using Grads = std::vector<Tensor>;  // undefined entries mean "no gradient flows here" (zero)

class Node {
 public:
  Node(std::string name, uint32_t num_outputs);
  virtual ~Node() = default;
  // Given the gradients of this node's outputs, returns the gradients of its inputs (one per next edge).
  virtual Grads apply(Grads&& grad_outputs) = 0;
  const std::string& name() const { return name_; }
  uint32_t num_outputs() const { return num_outputs_; }
  uint64_t sequence_nr() const { return seq_; }
  std::vector<Edge> next_edges;

 private:
  std::string name_;
  uint32_t num_outputs_;
  uint64_t seq_;
};

// Accumulates the incoming gradient into a leaf tensor's .grad.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  Grads apply(Grads&& grad_outputs) override;
  const TensorImpl* leaf() const { return leaf_.get(); }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

using BackwardFn = std::function<Grads(const Grads& grad_outputs)>;

// A node whose backward is a closure written next to the op's forward.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, uint32_t num_outputs, BackwardFn fn);
  Grads apply(Grads&& grad_outputs) override;

 private:
  BackwardFn fn_;
};

// ---- grad mode (thread-local, like PyTorch's)
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// ---- recording
// True when grad mode is on and any of the tensors requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
// The edge through which a gradient for `t` flows (its grad_fn, an AccumulateGrad for leaves, or none).
Edge edge_of(const Tensor& t);
// Attaches a FunctionNode computing `fn` to `outputs`, with edges to `inputs`. Throws if `name` is not in
// the differentiable op list (autograd/op_list.h), so the list and the code cannot drift apart.
void record(const char* name, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
            BackwardFn fn);

// ---- leaves
void set_requires_grad(const Tensor& t, bool requires_grad);
void set_grad(const Tensor& t, const Tensor& grad);
void zero_grad(const Tensor& t);  // drops .grad, freeing its memory

// Runs backward from `roots` with the given gradients (undefined: ones for one-element roots).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {});

// ---- gradient-ready notifications (DDP launches a bucket's all-reduce while backward goes on)
// While a scope is alive on a thread, each backward pass on that thread calls `hook(leaf)` once for every leaf
// whose gradient that pass has finished: right after the last of the pass's AccumulateGrad nodes for it ran
// (a leaf used twice - tied embeddings - is reported after both uses). A nested pass (a checkpointed region
// rerun in backward) reports the leaves of its own graph. Scopes do not nest.
using GradReadyHook = std::function<void(const TensorImpl* leaf)>;
class GradReadyScope {
 public:
  explicit GradReadyScope(GradReadyHook hook);
  ~GradReadyScope();
  GradReadyScope(const GradReadyScope&) = delete;
  GradReadyScope& operator=(const GradReadyScope&) = delete;
};

}  // namespace tr::autograd
