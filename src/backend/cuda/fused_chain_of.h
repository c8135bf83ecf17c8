// The backend's fused stages (Backend::FusedStage) as the CUDA kernel's chain (kernels.h FusedChain): host
// code shared by cuda_backend.cpp and the emulated parity test (tests/test_chain_emulated.cpp), which so
// checks the conversion the GPU runs, not a copy of it.
#pragma once
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"

namespace tr::cuda {

inline FusedChain chain_of(const std::vector<backend::Backend::FusedStage>& stages,
                           const std::vector<void*>& tensors) {
  using S = backend::Backend::FusedStage;
  using K = FusedChainStage::Kind;
  static_assert(kFusedStages == backend::Backend::kMaxFusedStages);
  static_assert(static_cast<int>(S::Kind::unary) == static_cast<int>(K::unary) &&
                static_cast<int>(S::Kind::unary_backward) == static_cast<int>(K::unary_backward) &&
                static_cast<int>(S::Kind::binary) == static_cast<int>(K::binary) &&
                static_cast<int>(S::Kind::affine) == static_cast<int>(K::affine) &&
                static_cast<int>(S::Kind::dropout) == static_cast<int>(K::dropout));
  FusedChain c;
  c.stages = static_cast<int>(stages.size());
  for (size_t k = 0; k < stages.size(); ++k) {
    const S& s = stages[k];
    c.stage[k] = {static_cast<K>(s.kind),
                  s.unary,
                  s.binary,
                  {s.in[0], s.in[1]},
                  s.out,
                  s.alpha,
                  s.beta,
                  s.seed,
                  s.offset};
  }
  for (size_t i = 0; i < tensors.size(); ++i) c.tensor[i] = tensors[i];
  return c;
}

}  // namespace tr::cuda
