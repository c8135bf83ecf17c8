// Building blocks of the models with Hugging Face parameter names: Linear (weight [out, in]), Embedding,
// LayerNorm, RMSNorm, and the named-parameter list every model exposes.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "autograd/functions.h"

namespace tr::nn {

// (HF name, parameter) in the model's canonical order.
using ParamList = std::vector<std::pair<std::string, Tensor*>>;

struct Linear {
  Tensor weight, bias;  // weight [out, in]; bias [out] or undefined
  Tensor operator()(const Tensor& x) const { return linear(x, weight, bias); }
  void params(const std::string& prefix, ParamList& out) {
    out.emplace_back(prefix + ".weight", &weight);
    if (bias.defined()) out.emplace_back(prefix + ".bias", &bias);
  }
};

struct Embedding {
  Tensor weight;  // [num, dim]
  Tensor operator()(const Tensor& ids) const { return embedding(weight, ids); }
  void params(const std::string& prefix, ParamList& out) { out.emplace_back(prefix + ".weight", &weight); }
};

struct LayerNorm {
  Tensor weight, bias;
  double eps = 1e-5;
  Tensor operator()(const Tensor& x) const { return layer_norm(x, weight, bias, eps); }
  void params(const std::string& prefix, ParamList& out) {
    out.emplace_back(prefix + ".weight", &weight);
    out.emplace_back(prefix + ".bias", &bias);
  }
};

struct RMSNorm {
  Tensor weight;
  double eps = 1e-6;
  Tensor operator()(const Tensor& x) const { return rms_norm(x, weight, eps); }
  void params(const std::string& prefix, ParamList& out) { out.emplace_back(prefix + ".weight", &weight); }
};

// Parameter factories: allocated on `device` in `dtype`, filled as HF initializes, marked requires_grad.
struct Init {
  Generator* gen;
  Device device;
  DType dtype;
  Tensor normal(const Shape& s, double std) const;
  Tensor zeros(const Shape& s) const;
  Tensor ones(const Shape& s) const;
  Linear linear(int64_t in, int64_t out, bool bias, double std) const;
};

}  // namespace tr::nn
