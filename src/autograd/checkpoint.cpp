// checkpoint(): see Note [Checkpoint semantics] in checkpoint.h.
#include "autograd/checkpoint.h"

namespace tr::autograd {

std::vector<Tensor> checkpoint(const RegionFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options) {
  std::vector<Generator::State> rng;
  for (Generator* g : options.generators) rng.push_back(g->state());

  // Forward on detached inputs that keep requires_grad, so the region's graph stops at them.
  std::vector<Tensor> region_inputs;
  for (const auto& x : inputs) {
    Tensor d = detach(x);
    if (x.requires_grad() && grad_enabled()) set_requires_grad(d, true);
    region_inputs.push_back(d);
  }
  std::vector<Tensor> outs = fn(region_inputs);
  bool any = false;
  for (const auto& o : outs) any = any || (o.defined() && o.requires_grad());
  region_inputs.clear();
  if (!any || !grad_enabled()) return outs;

  // Drop the region's graph (and with it every activation it saved); keep only the outputs' values.
  // Outputs that need no gradient (undefined, integer, or independent of anything trainable) pass through.
  std::vector<Tensor> results;
  std::vector<Tensor*> outp;
  for (const auto& o : outs) results.push_back(o.defined() && o.requires_grad() ? detach(o) : o);
  for (size_t i = 0; i < results.size(); ++i)
    if (outs[i].defined() && outs[i].requires_grad()) outp.push_back(&results[i]);
  std::vector<bool> attached;
  for (const auto& o : outs) attached.push_back(o.defined() && o.requires_grad());
  outs.clear();
  std::vector<const Tensor*> inp;
  for (const auto& x : inputs) inp.push_back(&x);
  std::vector<bool> in_grad;
  for (const auto& x : inputs) in_grad.push_back(x.requires_grad());
  record("checkpoint", inp, outp,
         [fn, inputs, in_grad, rng, attached, gens = options.generators](const Grads& g_attached) -> Grads {
           // Spread the attached outputs' gradients back over all outputs.
           Grads g(attached.size());
           for (size_t i = 0, j = 0; i < attached.size(); ++i)
             if (attached[i]) g[i] = g_attached[j++];
           // Rewind the generators for the recomputation, then put them back.
           std::vector<Generator::State> now;
           for (size_t i = 0; i < gens.size(); ++i) {
             now.push_back(gens[i]->state());
             gens[i]->set_state(rng[i]);
           }
           std::vector<Tensor> xs;
           for (size_t i = 0; i < inputs.size(); ++i) {
             Tensor d = detach(inputs[i]);
             if (in_grad[i]) set_requires_grad(d, true);
             xs.push_back(d);
           }
           std::vector<Tensor> roots, root_grads;
           {
             EnableGradGuard enable;
             std::vector<Tensor> ys = fn(xs);
             for (size_t i = 0; i < ys.size() && i < g.size(); ++i) {
               if (g[i].defined() && ys[i].defined() && ys[i].requires_grad()) {
                 roots.push_back(ys[i]);
                 root_grads.push_back(g[i]);
               }
             }
           }
           for (size_t i = 0; i < gens.size(); ++i) gens[i]->set_state(now[i]);
           if (!roots.empty()) backward(roots, root_grads);
           Grads r;
           for (auto& x : xs) r.push_back(x.requires_grad() ? x.grad() : Tensor());
           return r;
         });
  return results;
}

}  // namespace tr::autograd
