// Shared by the optimizer-state fuzz targets: small deterministic parameters and gradients.
#pragma once
#include <vector>

#include "ops/ops.h"

namespace tr::fuzz {

// Values scale x (-3 .. 3), repeating, in `shape`.
inline Tensor ramp(const Shape& shape, float scale) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % 7) - 3);
  return ops::from_vector(v, shape);
}

}  // namespace tr::fuzz
