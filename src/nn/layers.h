// Building blocks of the models with Hugging Face parameter names: Linear (weight [out, in]), Embedding,
// LayerNorm, RMSNorm, and the named-parameter list every model exposes.
#pragma once
#include <string>
#include <unordered_map>
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

// How a parameter was (or, made on the meta device, would have been) filled: enough to make it again later,
// alone, with the same bits - the generator is counter-based, so a draw depends only on its start state.
struct InitRecipe {
  enum class Kind { normal, zeros, ones } kind = Kind::zeros;
  double std = 0;
  Generator::State start;  // normal: the generator's state when the draw began
};
// The recipe of each parameter an Init made, by tensor.
using InitLog = std::unordered_map<const TensorImpl*, InitRecipe>;
// The tensor `r` describes, made now on `device` in `dtype` (requires_grad).
Tensor materialize(const InitRecipe& r, const Shape& shape, DType dtype, Device device);

// Parameter factories: allocated on `device` in `dtype`, filled as HF initializes, marked requires_grad.
// With `log`, each is a placeholder instead - a meta tensor over no memory, counted by no allocator (the meta
// device's included) - and its recipe is recorded: the model's shapes and how to make each parameter later.
struct Init {
  Generator* gen;
  Device device;
  DType dtype;
  InitLog* log = nullptr;
  Tensor normal(const Shape& s, double std) const;
  Tensor zeros(const Shape& s) const;
  Tensor ones(const Shape& s) const;
  Linear linear(int64_t in, int64_t out, bool bias, double std) const;
};

}  // namespace tr::nn
