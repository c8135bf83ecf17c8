// View ops: new geometry over the same storage (view, transpose, permute, narrow, expand, (un)squeeze),
// and reshape, which copies only when no view exists.
#include <optional>

#include "ops/ops.h"

namespace tr::ops {

Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      TR_CHECK(infer < 0, "{}: only one dimension can be -1 in {}", op, shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      TR_CHECK(out[i] >= 0, "{}: invalid size {} in {}", op, out[i], shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    TR_CHECK(known > 0 && numel % known == 0, "{}: shape {} is invalid for {} elements", op, shape_str(shape),
             numel);
    out[infer] = numel / known;
  }
  TR_CHECK(shape_numel(out) == numel, "{}: shape {} is invalid for {} elements", op, shape_str(shape), numel);
  return out;
}

namespace {

// Strides that let `shape` view a tensor of geometry (old_shape, old_strides), if any: dims of the new shape
// must split or merge runs of old dims that are contiguous with each other.
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& shape) {
  if (old_shape.empty()) return Strides(shape.size(), 1);
  if (shape_numel(old_shape) == 0) return contiguous_strides(shape);
  Strides st(shape.size(), 1);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        st[view_d] = view_numel * chunk_base;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return st;
}

}  // namespace

bool can_view(const Tensor& t, const Shape& shape) {
  return view_strides(t.shape(), t.strides(), infer_shape(shape, t.numel(), "view")).has_value();
}

Tensor view(const Tensor& t, Shape shape) {
  shape = infer_shape(shape, t.numel(), "view");
  auto st = view_strides(t.shape(), t.strides(), shape);
  TR_CHECK(st.has_value(),
           "view: cannot view {} with strides {} as {} (the dims to merge are not contiguous); use reshape",
           t.describe(), shape_str(t.strides()), shape_str(shape));
  return t.as_strided(shape, *st, t.offset());
}

Tensor reshape(const Tensor& t, Shape shape) {
  shape = infer_shape(shape, t.numel(), "reshape");
  if (auto st = view_strides(t.shape(), t.strides(), shape)) return t.as_strided(shape, *st, t.offset());
  return view(clone(t), shape);
}

Tensor transpose(const Tensor& t, int64_t d0, int64_t d1) {
  d0 = wrap_dim(d0, t.dim(), "transpose");
  d1 = wrap_dim(d1, t.dim(), "transpose");
  Shape sh = t.shape();
  Strides st = t.strides();
  std::swap(sh[d0], sh[d1]);
  std::swap(st[d0], st[d1]);
  return t.as_strided(sh, st, t.offset());
}

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  TR_CHECK(static_cast<int64_t>(dims.size()) == t.dim(), "permute: {} dims given for {}", dims.size(),
           t.describe());
  Shape sh(dims.size());
  Strides st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], t.dim(), "permute");
    TR_CHECK(!seen[d], "permute: dim {} repeated in [{}]", d, fmt::join(dims, ", "));
    seen[d] = true;
    sh[i] = t.shape()[d];
    st[i] = t.strides()[d];
  }
  return t.as_strided(sh, st, t.offset());
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  dim = wrap_dim(dim, t.dim(), "narrow");
  const int64_t size = t.shape()[dim];
  if (start < 0) start += size;
  TR_CHECK(start >= 0 && length >= 0 && start + length <= size,
           "narrow: range [{}, {}) is outside dim {} of size {} of {}", start, start + length, dim, size,
           t.describe());
  Shape sh = t.shape();
  sh[dim] = length;
  return t.as_strided(sh, t.strides(), t.offset() + start * t.strides()[dim]);
}

Tensor expand(const Tensor& t, const Shape& shape) {
  TR_CHECK(shape.size() >= t.shape().size(), "expand: cannot expand {} to fewer dims {}", t.describe(),
           shape_str(shape));
  const size_t lead = shape.size() - t.shape().size();
  Shape sh(shape.size());
  Strides st(shape.size(), 0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      TR_CHECK(shape[i] >= 0, "expand: size {} invalid for a new leading dim in {}", shape[i],
               shape_str(shape));
      sh[i] = shape[i];
      continue;
    }
    int64_t old = t.shape()[i - lead];
    int64_t want = shape[i] == -1 ? old : shape[i];
    TR_CHECK(old == want || old == 1, "expand: {} cannot be expanded to {} (dim {} has size {})",
             t.describe(), shape_str(shape), i, old);
    sh[i] = want;
    st[i] = old == want ? t.strides()[i - lead] : 0;
  }
  return t.as_strided(sh, st, t.offset());
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  dim = wrap_dim(dim, t.dim() + 1, "unsqueeze");
  Shape sh = t.shape();
  Strides st = t.strides();
  int64_t s = dim < t.dim() ? sh[dim] * st[dim] : 1;
  sh.insert(sh.begin() + dim, 1);
  st.insert(st.begin() + dim, s);
  return t.as_strided(sh, st, t.offset());
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  dim = wrap_dim(dim, t.dim(), "squeeze");
  if (t.shape()[dim] != 1) return t;
  Shape sh = t.shape();
  Strides st = t.strides();
  sh.erase(sh.begin() + dim);
  st.erase(st.begin() + dim);
  return t.as_strided(sh, st, t.offset());
}

}  // namespace tr::ops
