// Helpers of the optimizer tests (test_optim.cpp, test_optim_8bit.cpp): named parameters with gradients,
// tensors as floats, and the message of an expected error.
#pragma once
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/layers.h"
#include "test_util.h"

namespace tr::optim_test {

// Parameters with stable addresses, their HF-style names, and gradients set by the tests.
struct Params {
  std::deque<Tensor> tensors;
  nn::ParamList list;
  void add(const std::string& name, const Tensor& t) {
    tensors.push_back(ops::clone(t));
    list.emplace_back(name, &tensors.back());
  }
  Params clone() const {
    Params out;
    for (const auto& [name, p] : list) out.add(name, *p);
    return out;
  }
};

inline std::vector<float> floats(const Tensor& t) { return ops::to_vector<float>(t); }

// test::error_of, and a failure when `f` throws nothing ("" then).
inline std::string expect_error(const std::function<void()>& f) {
  bool threw = true;
  std::string e = test::error_of([&] {
    f();
    threw = false;
  });
  if (!threw) ADD_FAILURE() << "no error thrown";
  return threw ? e : "";
}

}  // namespace tr::optim_test
