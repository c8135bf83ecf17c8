// Dense linear algebra beyond matmul: the thin SVD (GaLore's projections), on the tensor's device or, where
// its backend declines, on the host.
#include <algorithm>
#include <utility>

#include "ops/ops.h"

namespace tr::ops {

namespace {

backend::Backend& be(const Tensor& t) { return backend::backend_for(t.device()); }
bool runs(const Tensor& t) { return !t.device().is_meta() && t.numel() > 0; }

void check_svd_input(const Tensor& a) {
  TR_CHECK(a.dim() == 2 && (a.dtype() == DType::f32 || a.dtype() == DType::f64),
           "svd: expected a 2-D f32 or f64 matrix, got {}", a.describe());
}

// Backend::svd on a's device, or on the host when that backend declines.
void run_svd(const Tensor& a, const Tensor& u, const Tensor& s, const Tensor& vh) {
  const Tensor ac = contiguous(a);
  if (be(a).svd(ac, u, s, vh)) return;
  const auto host = [](const Tensor& t) { return t.defined() ? empty(t.shape(), t.dtype()) : Tensor(); };
  const Tensor hu = host(u), hs = host(s), hvh = host(vh);
  TR_CHECK(backend::backend_for(Device::cpu()).svd(to_device(ac, Device::cpu()), hu, hs, hvh),
           "svd: the CPU backend declined");
  for (const auto& [dst, src] : {std::pair{u, hu}, {s, hs}, {vh, hvh}})
    if (dst.defined()) copy_(dst, src);
}

}  // namespace

Svd svd(const Tensor& a) {
  check_svd_input(a);
  const int64_t m = a.shape()[0], n = a.shape()[1], k = std::min(m, n);
  Svd out{empty({m, k}, a.dtype(), a.device()), empty({k}, a.dtype(), a.device()),
          empty({k, n}, a.dtype(), a.device())};
  if (runs(out.u) || runs(out.vh)) run_svd(a, out.u, out.s, out.vh);
  return out;
}

void svd_into(const Tensor& a, const Tensor& u, const Tensor& vh) {
  check_svd_input(a);
  const int64_t m = a.shape()[0], n = a.shape()[1];
  const int64_t r = u.defined() ? u.shape()[1] : vh.defined() ? vh.shape()[0] : 0;
  for (const auto& [t, shape] : {std::pair{u, Shape{m, r}}, {vh, Shape{r, n}}})
    TR_CHECK(!t.defined() || (t.shape() == shape && t.dtype() == a.dtype() && t.device() == a.device() &&
                              t.is_contiguous()),
             "svd_into: an output of {} for a {}: expected a contiguous {} {}", t.describe(), a.describe(),
             shape_str(shape), dtype_name(a.dtype()));
  TR_CHECK(r >= 1 && r <= std::min(m, n), "svd_into: {} singular triplets asked of {}", r, a.describe());
  if (!a.device().is_meta() && a.numel() > 0) run_svd(a, u, Tensor(), vh);
}

}  // namespace tr::ops
