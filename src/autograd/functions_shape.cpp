// Differentiable views and shape ops (view, reshape, transpose, permute, narrow, expand, contiguous,
// cat, split), moves between devices, plus detach and requires_grad_.
#include "autograd/functions.h"

namespace tr {

using autograd::Grads;
using autograd::needs_grad;
using autograd::record;

namespace {

// Records `name` with backward `fn` unless the op returned its input unchanged (nothing to record).
template <typename F>
Tensor shape_op(const char* name, const Tensor& x, Tensor y, F fn) {
  if (y.same(x) || !needs_grad({&x})) return y;
  record(name, {&x}, {&y}, std::move(fn));
  return y;
}

// The pieces' common buffer when they are exactly the pieces of one contiguous tensor of shape xs cut along d
// (attention writes q/k/v's gradients so into one buffer): the split's backward is then that buffer, no copy.
Tensor joined(const Grads& g, const Shape& xs, int64_t d, const std::vector<int64_t>& sizes) {
  const Strides st = contiguous_strides(xs);
  const int64_t base = g[0].offset();
  int64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Shape piece = xs;
    piece[d] = sizes[i];
    if (g[i].storage() != g[0].storage() || g[i].dtype() != g[0].dtype() || g[i].shape() != piece ||
        g[i].offset() != base + at * st[d])
      return {};
    for (size_t k = 0; k < xs.size(); ++k)  // a dim of size 1 may carry any stride
      if (piece[k] != 1 && g[i].stride(static_cast<int64_t>(k)) != st[k]) return {};
    at += sizes[i];
  }
  return g[0].as_strided(xs, st, base);
}

}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  const Shape xs = x.shape();
  return shape_op("view", x, ops::view(x, shape),
                  [xs](const Grads& g) -> Grads { return {ops::reshape(g[0], xs)}; });
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  const Shape xs = x.shape();
  return shape_op("reshape", x, ops::reshape(x, shape),
                  [xs](const Grads& g) -> Grads { return {ops::reshape(g[0], xs)}; });
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  return shape_op("transpose", x, ops::transpose(x, d0, d1),
                  [d0, d1](const Grads& g) -> Grads { return {ops::transpose(g[0], d0, d1)}; });
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> inv(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inv[static_cast<size_t>(wrap_dim(dims[i], x.dim(), "permute"))] = static_cast<int64_t>(i);
  return shape_op("permute", x, ops::permute(x, dims),
                  [inv](const Grads& g) -> Grads { return {ops::permute(g[0], inv)}; });
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  const Shape xs = x.shape();
  const int64_t d = wrap_dim(dim, x.dim(), "narrow");
  const int64_t s = start < 0 ? start + xs[d] : start;
  return shape_op("narrow", x, ops::narrow(x, dim, start, length),
                  [xs, d, s, length](const Grads& g) -> Grads {
                    Tensor gx = ops::zeros(xs, g[0].dtype(), g[0].device());
                    ops::copy_(ops::narrow(gx, d, s, length), g[0]);
                    return {gx};
                  });
}

Tensor expand(const Tensor& x, const Shape& shape) {
  const Shape xs = x.shape();
  return shape_op("expand", x, ops::expand(x, shape),
                  [xs](const Grads& g) -> Grads { return {ops::sum_to_shape(g[0], xs)}; });
}

Tensor contiguous(const Tensor& x) {
  return shape_op("contiguous", x, ops::contiguous(x), [](const Grads& g) -> Grads { return {g[0]}; });
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  Shape s = x.shape();
  s.insert(s.begin() + wrap_dim(dim, x.dim() + 1, "unsqueeze"), 1);
  return view(x, s);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim(), "squeeze");
  if (x.shape()[d] != 1) return x;
  Shape s = x.shape();
  s.erase(s.begin() + d);
  return view(x, s);
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  Tensor y = ops::cat(xs, dim);
  bool any = false;
  std::vector<const Tensor*> ins;
  for (const auto& x : xs) {
    any = any || needs_grad({&x});
    ins.push_back(&x);
  }
  if (any) {
    const int64_t d = wrap_dim(dim, xs[0].dim(), "cat");
    std::vector<int64_t> sizes;
    for (const auto& x : xs) sizes.push_back(x.size(d));
    record("cat", ins, {&y}, [d, sizes](const Grads& g) -> Grads {
      Grads r;
      int64_t at = 0;
      for (int64_t s : sizes) {
        r.push_back(ops::narrow(g[0], d, at, s));
        at += s;
      }
      return r;
    });
  }
  return y;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  TR_CHECK(total == x.shape()[d], "split: sizes [{}] do not add up to dim {} of {}", fmt::join(sizes, ", "),
           d, x.describe());
  std::vector<Tensor> outs;
  int64_t at = 0;
  for (int64_t s : sizes) {
    outs.push_back(ops::narrow(x, d, at, s));
    at += s;
  }
  if (needs_grad({&x})) {
    std::vector<Tensor*> outp;
    for (auto& o : outs) outp.push_back(&o);
    const Shape xs = x.shape();
    record("split", {&x}, outp, [xs, d, sizes](const Grads& g) -> Grads {
      // One gradient tensor for the whole input; pieces without a gradient stay zero.
      const Tensor* ref = nullptr;
      bool all = true;
      for (const auto& gi : g) {
        if (!gi.defined())
          all = false;
        else if (!ref)
          ref = &gi;
      }
      if (!ref) return {Tensor()};
      if (all) {
        if (Tensor whole = joined(g, xs, d, sizes); whole.defined()) return {whole};
      }
      Tensor gx =
          all ? ops::empty(xs, ref->dtype(), ref->device()) : ops::zeros(xs, ref->dtype(), ref->device());
      int64_t at2 = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        if (g[i].defined()) ops::copy_(ops::narrow(gx, d, at2, sizes[i]), g[i]);
        at2 += sizes[i];
      }
      return {gx};
    });
  }
  return outs;
}

Tensor to_device(const Tensor& x, Device device) {
  const Device from = x.device();
  return shape_op("to_device", x, ops::to_device(x, device),
                  [from](const Grads& g) -> Grads { return {ops::to_device(g[0], from)}; });
}

Tensor detach(const Tensor& x) { return x.as_strided(x.shape(), x.strides(), x.offset()); }

Tensor backward_hook(const Tensor& x, std::function<void()> hook) {
  if (!needs_grad({&x})) return x;
  Tensor y = detach(x);
  record("backward_hook", {&x}, {&y}, [hook = std::move(hook)](const Grads& g) -> Grads {
    hook();
    return {g[0]};
  });
  return y;
}

Tensor& requires_grad_(Tensor& x, bool requires_grad) {
  autograd::set_requires_grad(x, requires_grad);
  return x;
}

}  // namespace tr
