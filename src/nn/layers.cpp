// Parameter initialization helpers.
#include "nn/layers.h"

namespace tr::nn {

namespace {
Tensor param(Tensor t) {
  autograd::set_requires_grad(t, true);
  return t;
}
}  // namespace

Tensor Init::normal(const Shape& s, double std) const {
  return param(ops::randn(s, *gen, dtype, device, 0.0, std));
}
Tensor Init::zeros(const Shape& s) const { return param(ops::zeros(s, dtype, device)); }
Tensor Init::ones(const Shape& s) const { return param(ops::ones(s, dtype, device)); }
Linear Init::linear(int64_t in, int64_t out, bool bias, double std) const {
  return {normal({out, in}, std), bias ? zeros({out}) : Tensor()};
}

}  // namespace tr::nn
