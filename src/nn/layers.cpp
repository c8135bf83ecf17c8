// Parameter initialization helpers.
#include "nn/layers.h"

namespace tr::nn {

namespace {
Tensor param(Tensor t) {
  autograd::set_requires_grad(t, true);
  return t;
}
}  // namespace

Tensor materialize(const InitRecipe& r, const Shape& shape, DType dtype, Device device) {
  switch (r.kind) {
    case InitRecipe::Kind::normal: {
      Generator g(r.start.seed);
      g.set_state(r.start);
      return param(ops::randn(shape, g, dtype, device, 0.0, r.std));
    }
    case InitRecipe::Kind::zeros: return param(ops::zeros(shape, dtype, device));
    case InitRecipe::Kind::ones: return param(ops::ones(shape, dtype, device));
  }
  fail("materialize: unknown init kind");
}

namespace {
Tensor placeholder(InitLog& log, const Shape& s, DType dtype, const InitRecipe& r) {
  Tensor t = param(
      Tensor::over(std::make_shared<Storage>(nullptr, static_cast<size_t>(shape_numel(s)) * dtype_size(dtype),
                                             Device::meta(), nullptr),
                   s, dtype));
  log[t.impl_ptr().get()] = r;
  return t;
}
}  // namespace

Tensor Init::normal(const Shape& s, double std) const {
  if (log) {  // the draw's words reserved, as randn does, so the next parameter's start is the same
    const Generator::State start = gen->state();
    gen->reserve(2 * static_cast<uint64_t>(shape_numel(s)));
    return placeholder(*log, s, dtype, {InitRecipe::Kind::normal, std, start});
  }
  return param(ops::randn(s, *gen, dtype, device, 0.0, std));
}
Tensor Init::zeros(const Shape& s) const {
  return log ? placeholder(*log, s, dtype, {InitRecipe::Kind::zeros, 0, {}})
             : param(ops::zeros(s, dtype, device));
}
Tensor Init::ones(const Shape& s) const {
  return log ? placeholder(*log, s, dtype, {InitRecipe::Kind::ones, 0, {}})
             : param(ops::ones(s, dtype, device));
}
Linear Init::linear(int64_t in, int64_t out, bool bias, double std) const {
  return {normal({out, in}, std), bias ? zeros({out}) : Tensor()};
}

}  // namespace tr::nn
