// Helpers shared by the tests: random tensors, closeness checks, error messages, and the list of backends to
// run.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "backend/cuda_api.h"
#include "core/error.h"
#include "ops/ops.h"

namespace tr::test {

inline Tensor randn(const Shape& s, uint64_t seed, DType dt = DType::f32, Device dev = Device::cpu(),
                    double std = 1.0) {
  Generator g(seed);
  return ops::randn(s, g, dt, dev, 0.0, std);
}

inline Tensor rand(const Shape& s, uint64_t seed, double lo, double hi, DType dt = DType::f32) {
  Generator g(seed);
  return ops::rand(s, g, dt, Device::cpu(), lo, hi);
}

inline std::vector<double> values(const Tensor& t) { return ops::to_vector<double>(t); }

// The message `fn` throws, or "(no error)".
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Max over elements of |a - b| / (atol + rtol * |b|); <= 1 means close. NaN anywhere fails.
inline ::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure()
           << "shapes differ: " << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  auto va = values(a), vb = values(b);
  double worst = 0;
  size_t wi = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) != std::isnan(vb[i]) || (std::isnan(va[i]) && std::isnan(vb[i])))
      return ::testing::AssertionFailure() << "NaN at " << i << ": " << va[i] << " vs " << vb[i];
    if (std::isinf(va[i]) || std::isinf(vb[i])) {
      if (va[i] != vb[i]) return ::testing::AssertionFailure() << "inf mismatch at " << i;
      continue;
    }
    double r = std::abs(va[i] - vb[i]) / (atol + rtol * std::abs(vb[i]));
    if (r > worst) {
      worst = r;
      wi = i;
    }
  }
  if (worst <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "element " << wi << ": " << va[wi] << " vs " << vb[wi] << " (ratio to tolerance " << worst << ")";
}

// Devices the op tests run on: the CPU always, the first GPU when this build and machine have one.
inline std::vector<Device> test_devices() {
  std::vector<Device> d{Device::cpu()};
  if (backend::cuda_available()) d.push_back(Device::cuda(0));
  return d;
}

}  // namespace tr::test
