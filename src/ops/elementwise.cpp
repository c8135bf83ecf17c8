// Elementwise ops, reductions, top-k and softmax: checks, output allocation, dispatch.
#include <algorithm>
#include <functional>
#include <numeric>

#include "ops/ops.h"

namespace tr::ops {

namespace {

backend::Backend& be(const Tensor& t) { return backend::backend_for(t.device()); }
bool runs(const Tensor& t) { return !t.device().is_meta() && t.numel() > 0; }

void check_pair(const char* op, const Tensor& a, const Tensor& b) {
  TR_CHECK(a.device() == b.device(), "{}: tensors on different devices: {} and {}", op, a.describe(),
           b.describe());
  TR_CHECK(a.dtype() == b.dtype(), "{}: dtypes differ: {} and {} (cast one explicitly)", op, a.describe(),
           b.describe());
}

void check_float(const char* op, const Tensor& t) {
  TR_CHECK(is_floating(t.dtype()), "{}: expected a floating tensor, got {}", op, t.describe());
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x) {
  check_float(backend::unary_name(op), x);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (runs(out)) be(x).unary(op, x, out);
  return out;
}

void unary_(UnaryOp op, const Tensor& x) {
  check_float(backend::unary_name(op), x);
  TR_CHECK(x.is_contiguous(), "{}_: in-place target {} must be contiguous", backend::unary_name(op),
           x.describe());
  if (runs(x)) be(x).unary(op, x, x);
}

Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& gy) {
  check_pair(backend::unary_name(op), x, gy);
  Tensor xc = contiguous(x), gc = contiguous(gy);
  Tensor gx = empty(x.shape(), x.dtype(), x.device());
  if (runs(gx)) be(x).unary_backward(op, xc, gc, gx);
  return gx;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = backend::binary_name(op);
  check_pair(name, a, b);
  check_float(name, a);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, a.dtype(), a.device());
  if (runs(out)) be(a).binary(op, expand(a, shape), expand(b, shape), out);
  return out;
}

void binary_(BinaryOp op, const Tensor& out, const Tensor& b) {
  const char* name = backend::binary_name(op);
  check_pair(name, out, b);
  TR_CHECK(out.is_contiguous(), "{}_: in-place target {} must be contiguous", name, out.describe());
  // An operand that shares memory with the target in another layout would be read after being written.
  const bool overlap =
      b.storage() == out.storage() &&
      !(b.shape() == out.shape() && b.strides() == out.strides() && b.offset() == out.offset());
  Tensor bb = expand(overlap ? clone(b) : b, out.shape());
  if (runs(out)) be(out).binary(op, out, bb, out);
}

void scaled_copy_(const Tensor& dst, const Tensor& x, const Tensor& s) {
  TR_CHECK(x.shape() == dst.shape() && x.is_contiguous() &&
               (x.dtype() == DType::f32 || x.dtype() == DType::f64) && is_floating(dst.dtype()) &&
               s.numel() == 1 && s.dtype() == x.dtype() && x.device() == dst.device() &&
               s.device() == x.device(),
           "scaled_copy_: x {} (contiguous f32/f64), scale {} (one element of its dtype) and destination {} "
           "must share a shape and a device",
           x.describe(), s.describe(), dst.describe());
  TR_CHECK(
      s.storage() != x.storage() && dst.storage() != x.storage(),
      "scaled_copy_: the scale {} and the destination {} must not share memory with x {} (x is consumed)",
      s.describe(), dst.describe(), x.describe());
  if (runs(dst)) be(dst).scaled_copy(x, s, dst);
}

Tensor affine(const Tensor& x, double alpha, double beta) {
  check_float("affine", x);
  Tensor xc = contiguous(x);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (runs(out)) be(x).affine(xc, alpha, beta, out);
  return out;
}

Tensor pow_scalar(const Tensor& x, double exponent) {
  check_float("pow", x);
  Tensor xc = contiguous(x);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (runs(out)) be(x).pow_scalar(xc, exponent, out);
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_float("masked_fill", x);
  TR_CHECK(mask.dtype() == DType::boolean, "masked_fill: mask must be bool, got {}", mask.describe());
  TR_CHECK(mask.device() == x.device(), "masked_fill: mask {} and input {} are on different devices",
           mask.describe(), x.describe());
  Shape shape = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  TR_CHECK(shape == x.shape(), "masked_fill: mask {} would broadcast the input {} to {}", mask.describe(),
           x.describe(), shape_str(shape));
  Tensor xc = contiguous(x);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (runs(out)) be(x).masked_fill(xc, expand(mask, shape), value, out);
  return out;
}

Tensor sum_to_shape(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const size_t lead = g.shape().size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < g.shape().size(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  }
  Tensor r = dims.empty() ? g : reduce(ReduceOp::sum, g, dims, true);
  return view(contiguous(r), shape);
}

namespace {

// reduce and reduce_into: `into` (when given) receives the result instead of a new tensor.
Tensor reduce_impl(ReduceOp op, const Tensor& x, std::vector<int64_t> dims, bool keepdim,
                   const Tensor* into) {
  check_float("reduce", x);
  const int64_t nd = x.dim();
  if (dims.empty())
    for (int64_t i = 0; i < nd; ++i) dims.push_back(i);
  for (auto& d : dims) d = wrap_dim(d, nd, "reduce");
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  std::vector<bool> red(static_cast<size_t>(nd), false);
  for (auto d : dims) red[d] = true;
  Shape out_shape;
  for (int64_t i = 0; i < nd; ++i) {
    if (!red[i])
      out_shape.push_back(x.shape()[i]);
    else if (keepdim)
      out_shape.push_back(1);
  }
  int64_t r = 1;
  for (auto d : dims) r *= x.shape()[d];
  if (op == ReduceOp::max || op == ReduceOp::min)
    TR_CHECK(r > 0, "reduce: max/min over an empty dimension of {}", x.describe());
  Tensor out;
  if (into) {
    const int64_t want = std::accumulate(out_shape.begin(), out_shape.end(), int64_t{1}, std::multiplies<>());
    TR_CHECK(into->numel() == want && into->is_contiguous() && into->dtype() == x.dtype() &&
                 into->device() == x.device(),
             "reduce_into: the output {} must be contiguous with {} elements of {}'s dtype and device",
             into->describe(), want, x.describe());
    out = *into;
  } else {
    out = empty(out_shape, x.dtype(), x.device());
  }
  if (out.numel() == 0) return out;
  const bool block = nd == 0 || dims.back() - dims.front() + 1 == static_cast<int64_t>(dims.size());
  Tensor xc;
  int64_t outer = 1, inner = 1;
  if (block && nd > 0) {
    xc = contiguous(x);
    for (int64_t i = 0; i < dims.front(); ++i) outer *= x.shape()[i];
    for (int64_t i = dims.back() + 1; i < nd; ++i) inner *= x.shape()[i];
  } else {
    std::vector<int64_t> perm;
    for (int64_t i = 0; i < nd; ++i)
      if (!red[i]) perm.push_back(i);
    for (auto d : dims) perm.push_back(d);
    xc = contiguous(permute(x, perm));
    outer = out.numel();
  }
  // Temporaries are made on the meta device too, so a dry run counts the same bytes.
  if (runs(out)) be(x).reduce(op, xc, outer, r, inner, out);
  return out;
}

}  // namespace

Tensor reduce(ReduceOp op, const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce_impl(op, x, std::move(dims), keepdim, nullptr);
}

void reduce_into(ReduceOp op, const Tensor& x, std::vector<int64_t> dims, const Tensor& out) {
  reduce_impl(op, x, std::move(dims), false, &out);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  check_float("argmax", x);
  dim = wrap_dim(dim, x.dim(), "argmax");
  TR_CHECK(x.shape()[dim] > 0, "argmax: dim {} of {} is empty", dim, x.describe());
  Shape out_shape = x.shape();
  if (keepdim)
    out_shape[dim] = 1;
  else
    out_shape.erase(out_shape.begin() + dim);
  Tensor xc = contiguous(x);
  Tensor out = empty(out_shape, DType::i64, x.device());
  if (!runs(out)) return out;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dim; ++i) outer *= x.shape()[i];
  for (int64_t i = dim + 1; i < x.dim(); ++i) inner *= x.shape()[i];
  be(x).argmax(xc, outer, x.shape()[dim], inner, out);
  return out;
}

TopK topk(const Tensor& x, int64_t k) {
  check_float("topk", x);
  TR_CHECK(x.dim() >= 1, "topk: needs at least one dim, got {}", x.describe());
  TR_CHECK(k >= 0 && k <= x.shape().back(), "topk: k={} out of range for last dim of {}", k, x.describe());
  Shape s = x.shape();
  s.back() = k;
  Tensor xc = contiguous(x);
  TopK out{empty(s, x.dtype(), x.device()), empty(s, DType::i64, x.device())};
  if (runs(out.values)) be(x).topk(xc, k, out.values, out.indices);
  return out;
}

Tensor softmax(const Tensor& x, int64_t dim, bool log) {
  check_float("softmax", x);
  dim = wrap_dim(dim, x.dim(), "softmax");
  if (x.dim() > 0 && dim != x.dim() - 1)
    return contiguous(transpose(softmax(contiguous(transpose(x, dim, -1)), -1, log), dim, -1));
  Tensor xc = contiguous(x);
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  if (runs(y)) be(x).softmax(xc, log, y);
  return y;
}

Tensor softmax_backward(const Tensor& y, const Tensor& gy, int64_t dim, bool log) {
  check_pair("softmax_backward", y, gy);
  dim = wrap_dim(dim, y.dim(), "softmax_backward");
  if (y.dim() > 0 && dim != y.dim() - 1) {
    Tensor r =
        softmax_backward(contiguous(transpose(y, dim, -1)), contiguous(transpose(gy, dim, -1)), -1, log);
    return contiguous(transpose(r, dim, -1));
  }
  Tensor yc = contiguous(y), gc = contiguous(gy);
  Tensor gx = empty(y.shape(), y.dtype(), y.device());
  if (runs(gx)) be(y).softmax_backward(yc, gc, log, gx);
  return gx;
}

}  // namespace tr::ops
