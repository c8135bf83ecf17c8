// Helpers the attention tests share (tests/test_attention_blocked.cpp, tests/test_attention_dropout.cpp): the
// key padding of their cases and a logsumexp comparison that treats "nothing visible" exactly.
#pragma once
#include <cmath>

#include "test_util.h"

namespace tr::test {

// bool [B, S] keys to keep when `padded` (undefined otherwise): batch 0 hides key 1, batch 2 (when there is
// one) every key, so one row of queries sees nothing.
inline Tensor attention_keep_mask(int64_t B, int64_t S, bool padded) {
  if (!padded) return Tensor();
  Tensor keep = ops::full({B, S}, 1.0, DType::boolean);
  bool* k = keep.data<bool>();
  k[1] = false;
  if (B > 2)
    for (int64_t s = 0; s < S; ++s) k[2 * S + s] = false;
  return keep;
}

// A tensor's values on the host, as f64.
inline std::vector<double> host_values(const Tensor& t) { return values(ops::to_device(t, Device::cpu())); }

// lse: -inf where nothing is visible on both sides, close elsewhere.
inline ::testing::AssertionResult same_lse(const Tensor& a, const Tensor& b, double tol) {
  auto x = host_values(a), y = host_values(b);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isinf(x[i]) || std::isinf(y[i])) {
      if (x[i] != y[i]) return ::testing::AssertionFailure() << "lse " << i << ": " << x[i] << " vs " << y[i];
      continue;
    }
    if (std::abs(x[i] - y[i]) > tol * (1 + std::abs(y[i])))
      return ::testing::AssertionFailure() << "lse " << i << ": " << x[i] << " vs " << y[i];
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tr::test
