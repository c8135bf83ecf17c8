// Graph nodes, grad mode, recording and the backward engine (dependency counting, newest node first).
#include "autograd/node.h"

#include <algorithm>
#include <atomic>
#include <queue>
#include <unordered_map>

#include "autograd/op_list.h"
#include "ops/ops.h"

namespace tr::autograd {

namespace {
std::atomic<uint64_t> next_seq{0};
thread_local bool t_grad_enabled = true;
thread_local GradReadyHook* t_grad_ready = nullptr;
}  // namespace

GradReadyScope::GradReadyScope(GradReadyHook hook) {
  TR_CHECK(t_grad_ready == nullptr, "GradReadyScope: a scope is already active on this thread");
  t_grad_ready = new GradReadyHook(std::move(hook));
}
GradReadyScope::~GradReadyScope() {
  delete t_grad_ready;
  t_grad_ready = nullptr;
}

Node::Node(std::string name, uint32_t num_outputs)
    : name_(std::move(name)), num_outputs_(num_outputs), seq_(next_seq.fetch_add(1)) {}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
    : Node("AccumulateGrad", 1), leaf_(std::move(leaf)) {}

Grads AccumulateGrad::apply(Grads&& grads) {
  Tensor g = grads[0];
  if (!g.defined()) return {};
  Tensor leaf(leaf_);
  TR_CHECK(g.shape() == leaf.shape(), "AccumulateGrad: gradient {} does not match parameter {}", g.describe(),
           leaf.describe());
  if (!leaf_->grad) {
    // Take ownership when nothing else can see the buffer (held only by `grads` and `g`); copy otherwise,
    // since later accumulation writes into it in place.
    const bool own = g.is_contiguous() && g.offset() == 0 && g.dtype() == leaf.dtype() &&
                     g.storage().use_count() == 1 && g.impl_ptr().use_count() <= 2;
    Tensor stored = own ? g : ops::clone(ops::to_dtype(g, leaf.dtype()));
    leaf_->grad = stored.impl_ptr();
  } else {
    Tensor acc(leaf_->grad);
    ops::binary_(ops::BinaryOp::add, acc, ops::to_dtype(g, acc.dtype()));
  }
  return {};
}

FunctionNode::FunctionNode(std::string name, uint32_t num_outputs, BackwardFn fn)
    : Node(std::move(name), num_outputs), fn_(std::move(fn)) {}

Grads FunctionNode::apply(Grads&& grads) {
  TR_CHECK(fn_ != nullptr,
           "backward through '{}' a second time: its saved tensors were freed after the first backward",
           name());
  BackwardFn fn = std::move(fn_);
  fn_ = nullptr;
  return fn(grads);  // `fn` (and the tensors it saved) dies at the end of this call
}

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = prev_; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

Edge edge_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.impl().output_nr};
  return {std::make_shared<AccumulateGrad>(t.impl_ptr()), 0};
}

void record(const char* name, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
            BackwardFn fn) {
  const std::string_view n(name);
  TR_CHECK(std::find(std::begin(kDifferentiableOps), std::end(kDifferentiableOps), n) !=
               std::end(kDifferentiableOps),
           "autograd: op '{}' is not in the differentiable op list (autograd/op_list.h)", name);
  auto node = std::make_shared<FunctionNode>(name, static_cast<uint32_t>(outputs.size()), std::move(fn));
  node->next_edges.reserve(inputs.size());
  for (const Tensor* t : inputs) node->next_edges.push_back(t ? edge_of(*t) : Edge{});
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    TensorImpl& impl = outputs[i]->impl();
    impl.requires_grad = true;
    impl.grad_fn = node;
    impl.output_nr = i;
  }
}

void set_requires_grad(const Tensor& t, bool requires_grad) {
  TR_CHECK(t.is_leaf(), "set_requires_grad: only leaf tensors can change requires_grad ({} has a grad_fn)",
           t.describe());
  TR_CHECK(!requires_grad || is_floating(t.dtype()), "set_requires_grad: {} is not floating", t.describe());
  t.impl().requires_grad = requires_grad;
}

void set_grad(const Tensor& t, const Tensor& grad) { t.impl().grad = grad.impl_ptr(); }
void zero_grad(const Tensor& t) { t.impl().grad.reset(); }

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  TR_CHECK(grads.empty() || grads.size() == roots.size(), "backward: {} gradients for {} roots", grads.size(),
           roots.size());
  // Gradient buffers per node, filled as producers finish.
  std::unordered_map<Node*, Grads> buffers;
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep;
  auto add_grad = [&](const std::shared_ptr<Node>& node, uint32_t slot, Tensor g) {
    Grads& buf = buffers[node.get()];
    if (buf.empty()) buf.resize(node->num_outputs());
    if (!g.defined()) return;
    if (!buf[slot].defined())
      buf[slot] = std::move(g);
    else
      buf[slot] = ops::binary(ops::BinaryOp::add, buf[slot], g);
  };
  // Count dependencies over the reachable graph.
  std::vector<std::shared_ptr<Node>> stack;
  for (const auto& r : roots) {
    TR_CHECK(r.defined() && r.requires_grad(), "backward: root {} does not require grad", r.describe());
    Edge e = edge_of(r);
    if (!keep.count(e.node.get())) {
      keep[e.node.get()] = e.node;
      stack.push_back(e.node);
    }
  }
  std::vector<Edge> root_edges;
  for (const auto& r : roots)
    root_edges.push_back(r.grad_fn() ? Edge{r.grad_fn(), r.impl().output_nr} : Edge{});
  while (!stack.empty()) {
    auto n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.node) continue;
      deps[e.node.get()] += 1;
      if (!keep.count(e.node.get())) {
        keep[e.node.get()] = e.node;
        stack.push_back(e.node);
      }
    }
  }
  for (size_t i = 0; i < roots.size(); ++i) {
    Tensor g = grads.empty() ? Tensor() : grads[i];
    if (!g.defined()) {
      TR_CHECK(roots[i].numel() == 1, "backward: a gradient is needed for non-scalar root {}",
               roots[i].describe());
      g = ops::ones(roots[i].shape(), roots[i].dtype(), roots[i].device());
    }
    TR_CHECK(g.shape() == roots[i].shape(), "backward: gradient {} does not match root {}", g.describe(),
             roots[i].describe());
    if (root_edges[i].node) {
      add_grad(root_edges[i].node, root_edges[i].input_nr, g);
    } else {
      // A leaf root: accumulate directly.
      AccumulateGrad acc(roots[i].impl_ptr());
      acc.apply({g});
    }
  }
  // Newest node first among the ready ones: the reverse of the order the forward ran.
  auto cmp = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr() < b->sequence_nr();
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(cmp)> ready(cmp);
  for (const auto& [ptr, node] : keep)
    if (deps[ptr] == 0 && buffers.count(ptr)) ready.push(node);
  // With a gradient-ready hook: how many AccumulateGrad nodes of this graph feed each leaf.
  GradReadyHook* const hook = t_grad_ready;
  std::unordered_map<const TensorImpl*, int> pending_leaf;
  if (hook)
    for (const auto& [ptr, node] : keep)
      if (auto* acc = dynamic_cast<AccumulateGrad*>(ptr)) ++pending_leaf[acc->leaf()];
  // A node that never runs (no gradient reached it) still finishes its leaf's count.
  auto leaf_done = [&](Node* n) {
    auto* acc = hook ? dynamic_cast<AccumulateGrad*>(n) : nullptr;
    if (acc && --pending_leaf[acc->leaf()] == 0) (*hook)(acc->leaf());
  };
  while (!ready.empty()) {
    auto node = ready.top();
    ready.pop();
    Grads in = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    // No gradient reached this node (e.g. an unused output of split or checkpoint): nothing flows on.
    const bool any = std::any_of(in.begin(), in.end(), [](const Tensor& t) { return t.defined(); });
    Grads out = any ? node->apply(std::move(in)) : Grads{};
    Grads().swap(in);  // apply takes a reference: the incoming gradients go now, before a hook runs
    leaf_done(node.get());
    TR_CHECK(out.size() == node->next_edges.size() || out.empty(),
             "autograd: '{}' returned {} gradients for {} inputs", node->name(), out.size(),
             node->next_edges.size());
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.node) continue;
      add_grad(e.node, e.input_nr, i < out.size() ? out[i] : Tensor());
      if (--deps[e.node.get()] == 0) ready.push(e.node);
    }
    keep.erase(node.get());  // drop the engine's reference as soon as the node is done
  }
}

}  // namespace tr::autograd
