// Differentiable elementwise ops, reductions and softmax: forward and backward side by side.
#include "autograd/functions.h"

namespace tr {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;
using ops::BinaryOp;
using ops::UnaryOp;

namespace {

Tensor binary_op(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor y = ops::binary(op, a, b);
  if (!needs_grad({&a, &b})) return y;
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  const Shape sa = a.shape(), sb = b.shape();
  switch (op) {
    case BinaryOp::add:
    case BinaryOp::sub:
      record(backend::binary_name(op), {&a, &b}, {&y}, [op, sa, sb](const Grads& g) -> Grads {
        Tensor gb_ = ops::sum_to_shape(g[0], sb);
        return {ops::sum_to_shape(g[0], sa), op == BinaryOp::sub ? ops::affine(gb_, -1.0, 0.0) : gb_};
      });
      break;
    case BinaryOp::mul: {
      Tensor sa_b = ga ? b : Tensor(), sb_a = gb ? a : Tensor();
      record("mul", {&a, &b}, {&y}, [sa_b, sb_a, sa, sb](const Grads& g) -> Grads {
        Grads r(2);
        if (sa_b.defined()) r[0] = ops::sum_to_shape(ops::binary(BinaryOp::mul, g[0], sa_b), sa);
        if (sb_a.defined()) r[1] = ops::sum_to_shape(ops::binary(BinaryOp::mul, g[0], sb_a), sb);
        return r;
      });
      break;
    }
    case BinaryOp::div: {
      Tensor saved_b = b, saved_y = gb ? y.as_strided(y.shape(), y.strides(), y.offset()) : Tensor();
      record("div", {&a, &b}, {&y}, [saved_b, saved_y, sa, sb, ga](const Grads& g) -> Grads {
        Grads r(2);
        Tensor gq = ops::binary(BinaryOp::div, g[0], saved_b);
        if (ga) r[0] = ops::sum_to_shape(gq, sa);
        if (saved_y.defined())  // d(a/b)/db = -y/b
          r[1] = ops::sum_to_shape(ops::affine(ops::binary(BinaryOp::mul, gq, saved_y), -1.0, 0.0), sb);
        return r;
      });
      break;
    }
    case BinaryOp::maximum:
    case BinaryOp::minimum: {
      // The larger (smaller) input gets the gradient; ties split it evenly, as in PyTorch.
      record(backend::binary_name(op), {&a, &b}, {&y}, [op, a, b, sa, sb](const Grads& g) -> Grads {
        Tensor d =
            op == BinaryOp::maximum ? ops::binary(BinaryOp::sub, a, b) : ops::binary(BinaryOp::sub, b, a);
        Tensor gs = ops::unary_backward(UnaryOp::abs, ops::contiguous(d),
                                        ops::contiguous(ops::expand(g[0], d.shape())));
        Tensor ga_ = ops::affine(ops::binary(BinaryOp::add, g[0], gs), 0.5, 0.0);
        Tensor gb_ = ops::affine(ops::binary(BinaryOp::sub, g[0], gs), 0.5, 0.0);
        return {ops::sum_to_shape(ga_, sa), ops::sum_to_shape(gb_, sb)};
      });
      break;
    }
    case BinaryOp::eq: break;
  }
  return y;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary_op(BinaryOp::minimum, a, b); }

Tensor unary(UnaryOp op, const Tensor& x) {
  Tensor y = ops::unary(op, x);
  if (needs_grad({&x})) {
    record(backend::unary_name(op), {&x}, {&y},
           [op, x](const Grads& g) -> Grads { return {ops::unary_backward(op, x, g[0])}; });
  }
  return y;
}

Tensor neg(const Tensor& x) { return unary(UnaryOp::neg, x); }
Tensor exp(const Tensor& x) { return unary(UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return unary(UnaryOp::log, x); }
Tensor sqrt(const Tensor& x) { return unary(UnaryOp::sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary(UnaryOp::rsqrt, x); }
Tensor tanh(const Tensor& x) { return unary(UnaryOp::tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::sigmoid, x); }
Tensor relu(const Tensor& x) { return unary(UnaryOp::relu, x); }
Tensor gelu(const Tensor& x, bool approximate) {
  return unary(approximate ? UnaryOp::gelu_tanh : UnaryOp::gelu_erf, x);
}
Tensor silu(const Tensor& x) { return unary(UnaryOp::silu, x); }
Tensor abs(const Tensor& x) { return unary(UnaryOp::abs, x); }
Tensor square(const Tensor& x) { return unary(UnaryOp::square, x); }
Tensor reciprocal(const Tensor& x) { return unary(UnaryOp::reciprocal, x); }

Tensor affine(const Tensor& x, double alpha, double beta) {
  Tensor y = ops::affine(x, alpha, beta);
  if (needs_grad({&x}))
    record("affine", {&x}, {&y},
           [alpha](const Grads& g) -> Grads { return {ops::affine(g[0], alpha, 0.0)}; });
  return y;
}
Tensor mul_scalar(const Tensor& x, double s) { return affine(x, s, 0.0); }
Tensor add_scalar(const Tensor& x, double s) { return affine(x, 1.0, s); }

Tensor pow(const Tensor& x, double e) {
  Tensor y = ops::pow_scalar(x, e);
  if (needs_grad({&x}))
    record("pow", {&x}, {&y}, [x, e](const Grads& g) -> Grads {
      return {ops::binary(BinaryOp::mul, g[0], ops::affine(ops::pow_scalar(x, e - 1.0), e, 0.0))};
    });
  return y;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  Tensor y = ops::masked_fill(x, mask, value);
  if (needs_grad({&x}))
    record("masked_fill", {&x}, {&y},
           [mask](const Grads& g) -> Grads { return {ops::masked_fill(g[0], mask, 0.0)}; });
  return y;
}

Tensor dropout(const Tensor& x, double p, Generator& gen, bool training) {
  if (!training || p == 0.0) return x;
  const uint64_t seed = gen.seed(), offset = gen.reserve(static_cast<uint64_t>(x.numel()));
  Tensor y = ops::dropout(x, p, seed, offset);
  if (needs_grad({&x}))
    record("dropout", {&x}, {&y},
           [p, seed, offset](const Grads& g) -> Grads { return {ops::dropout(g[0], p, seed, offset)}; });
  return y;
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor y = ops::to_dtype(x, dtype);
  const DType from = x.dtype();
  if (needs_grad({&x}) && is_floating(dtype))
    record("cast", {&x}, {&y}, [from](const Grads& g) -> Grads { return {ops::to_dtype(g[0], from)}; });
  return y;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator*(const Tensor& a, double s) { return mul_scalar(a, s); }
Tensor operator*(double s, const Tensor& a) { return mul_scalar(a, s); }
Tensor operator+(const Tensor& a, double s) { return add_scalar(a, s); }

namespace {

// Shape of a reduction result with keepdim, so a gradient can be broadcast back.
Shape keep_shape(const Tensor& x, std::vector<int64_t> dims) {
  Shape s = x.shape();
  if (dims.empty()) return Shape(s.size(), 1);
  for (auto d : dims) s[wrap_dim(d, x.dim(), "reduce")] = 1;
  return s;
}

int64_t reduced_count(const Tensor& x, const std::vector<int64_t>& dims) {
  if (dims.empty()) return x.numel();
  std::vector<bool> seen(static_cast<size_t>(x.dim()), false);
  int64_t n = 1;
  for (auto d : dims) {
    const int64_t w = wrap_dim(d, x.dim(), "reduce");
    if (!seen[static_cast<size_t>(w)]) n *= x.shape()[w];
    seen[static_cast<size_t>(w)] = true;
  }
  return n;
}

}  // namespace

Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  Tensor y = ops::reduce(ops::ReduceOp::sum, x, dims, keepdim);
  if (needs_grad({&x})) {
    Shape ks = keep_shape(x, dims), xs = x.shape();
    record("sum", {&x}, {&y},
           [ks, xs](const Grads& g) -> Grads { return {ops::expand(ops::reshape(g[0], ks), xs)}; });
  }
  return y;
}

Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  Tensor y = ops::reduce(ops::ReduceOp::mean, x, dims, keepdim);
  if (needs_grad({&x})) {
    Shape ks = keep_shape(x, dims), xs = x.shape();
    const double inv = 1.0 / static_cast<double>(std::max<int64_t>(reduced_count(x, dims), 1));
    record("mean", {&x}, {&y}, [ks, xs, inv](const Grads& g) -> Grads {
      return {ops::expand(ops::reshape(ops::affine(g[0], inv, 0.0), ks), xs)};
    });
  }
  return y;
}

Tensor amax(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  Tensor y = ops::reduce(ops::ReduceOp::max, x, dims, keepdim);
  if (needs_grad({&x})) {
    Shape ks = keep_shape(x, dims);
    Tensor yk = ops::reshape(y, ks);
    record("amax", {&x}, {&y}, [x, yk, ks, dims](const Grads& g) -> Grads {
      // Ties share the gradient evenly, as torch.amax does.
      Tensor hit = ops::binary(BinaryOp::eq, x, ops::expand(yk, x.shape()));
      Tensor cnt = ops::reduce(ops::ReduceOp::sum, hit, dims, true);
      Tensor share = ops::binary(BinaryOp::div, ops::reshape(g[0], ks), cnt);
      return {ops::binary(BinaryOp::mul, hit, share)};
    });
  }
  return y;
}

Tensor softmax(const Tensor& x, int64_t dim) {
  Tensor y = ops::softmax(x, dim, false);
  if (needs_grad({&x})) {
    Tensor saved = y.as_strided(y.shape(), y.strides(), y.offset());  // alias without autograd history
    record("softmax", {&x}, {&y}, [saved, dim](const Grads& g) -> Grads {
      return {ops::softmax_backward(saved, g[0], dim, false)};
    });
  }
  return y;
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  Tensor y = ops::softmax(x, dim, true);
  if (needs_grad({&x})) {
    Tensor saved = y.as_strided(y.shape(), y.strides(), y.offset());
    record("log_softmax", {&x}, {&y},
           [saved, dim](const Grads& g) -> Grads { return {ops::softmax_backward(saved, g[0], dim, true)}; });
  }
  return y;
}

}  // namespace tr
