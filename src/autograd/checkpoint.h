// Activation checkpointing: run a region keeping only its inputs, recompute it during backward.
// Note [Checkpoint semantics]: non-reentrant in effect. The forward runs normally (so requires_grad of the
// outputs reflects inputs AND parameters used inside), then the region's graph is dropped and the outputs
// are re-attached to one "checkpoint" node that saves only the inputs. Backward re-runs `fn` with grad mode
// on and the listed generators rewound, so dropout masks repeat exactly; parameters get their gradients
// accumulated directly, inputs that need no gradient (frozen) are simply not differentiated.
#pragma once
#include <functional>
#include <vector>

#include "autograd/functions.h"

namespace tr::autograd {

using RegionFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct CheckpointOptions {
  // Generators used inside the region (e.g. for dropout); rewound for the recomputation.
  std::vector<Generator*> generators;
};

std::vector<Tensor> checkpoint(const RegionFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options = {});

}  // namespace tr::autograd
