// The optimizer passes (gradient statistics and transform, multi-tensor AdamW, 8-bit AdamW, SGD): the checks
// the backends rely on - one device, contiguous operands, sizes and dtypes as backend.h documents - then
// dispatch, one pass per device for a model split by device_map. Optimizers and the Trainer call these, never
// a backend directly.
#include <algorithm>
#include <cmath>

#include "ops/ops.h"

namespace tr::ops {

namespace {

bool is_float(DType d) { return d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16; }
bool is_master(DType d) { return d == DType::f32 || d == DType::f64; }

// Every tensor of a multi-tensor pass on `device`, contiguous, `numel` elements.
void check_operand(const char* op, const char* role, const Tensor& t, Device device, int64_t numel) {
  TR_CHECK(t.defined(), "{}: {} is missing", op, role);
  TR_CHECK(t.device() == device, "{}: {} {} is not on {} like the first tensor", op, role, t.describe(),
           device.str());
  TR_CHECK(t.is_contiguous(), "{}: {} {} is not contiguous", op, role, t.describe());
  TR_CHECK(numel < 0 || t.numel() == numel, "{}: {} {} has {} elements, expected {}", op, role, t.describe(),
           t.numel(), numel);
}

void check_stats(const char* op, const Tensor& stats, Device device) {
  TR_CHECK(stats.defined() && stats.dtype() == DType::f64 && stats.numel() == 2 && stats.is_contiguous(),
           "{}: the statistics must be a contiguous f64 tensor of 2 elements, got {}", op,
           stats.defined() ? stats.describe() : std::string("none"));
  TR_CHECK(stats.device() == device, "{}: the statistics {} are not on {}", op, stats.describe(),
           device.str());
}

void check_transform(const char* op, const backend::Backend::GradTransform& t, Device device) {
  TR_CHECK(std::isfinite(t.inv_scale) && t.inv_scale > 0, "{}: inverse loss scale {} is not positive", op,
           t.inv_scale);
  if (t.max_norm > 0) check_stats(op, t.stats, device);
}

// The items of a multi-tensor pass by device, each device's in their order. The passes are element-wise, so
// running one per device changes no bits.
template <typename T, typename DeviceOf>
std::vector<std::pair<Device, std::vector<T>>> by_device(const std::vector<T>& items, DeviceOf device_of) {
  std::vector<std::pair<Device, std::vector<T>>> groups;
  for (const T& x : items) {
    const Device d = device_of(x);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == d; });
    if (it == groups.end()) it = groups.insert(groups.end(), {d, {}});
    it->second.push_back(x);
  }
  return groups;
}

// The transform with its statistics on `device` (a split model's clipping reads one global norm everywhere).
backend::Backend::GradTransform transform_on(const backend::Backend::GradTransform& t, Device device) {
  backend::Backend::GradTransform on = t;
  if (t.max_norm > 0 && t.stats.defined() && t.stats.device() != device)
    on.stats = to_device(t.stats, device);
  return on;
}

Device device_or(const Tensor& t, Device fallback) { return t.defined() ? t.device() : fallback; }

void transform_grads_on(const std::vector<std::pair<Tensor, Tensor>>& src_dst,
                        const backend::Backend::GradTransform& t);
void fused_adamw_on(const std::vector<backend::Backend::AdamWTensors>& tensors,
                    const backend::Backend::AdamWHyper& h, const backend::Backend::GradTransform& t);
void adamw_8bit_on(const std::vector<backend::Backend::AdamW8bitTensors>& tensors, const Tensor& signed_map,
                   const Tensor& unsigned_map);

}  // namespace

Tensor grad_stats(const std::vector<Tensor>& grads, double inv_scale, Device device) {
  std::vector<Tensor> present;
  present.reserve(grads.size());
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    TR_CHECK(is_float(g.dtype()), "grad_stats: gradient {} is not floating point", g.describe());
    TR_CHECK(g.device() == device || g.device().is_meta() == device.is_meta(),
             "grad_stats: gradient {} is not on {}", g.describe(), device.str());
    present.push_back(contiguous(g));
  }
  TR_CHECK(std::isfinite(inv_scale) && inv_scale > 0, "grad_stats: inverse loss scale {} is not positive",
           inv_scale);
  if (present.empty()) return zeros({2}, DType::f64, device);
  // The backends add into the statistics chunk by chunk: a split model's consecutive runs of gradients on
  // one device continue the same sum, so the norm has the bits of the one-device run. A dry run (meta) walks
  // the same allocations.
  Tensor stats = zeros({2}, DType::f64, present.front().device());
  for (size_t i = 0; i < present.size();) {
    const Device d = present[i].device();
    size_t j = i;
    while (j < present.size() && present[j].device() == d) ++j;
    if (stats.device() != d) stats = to_device(stats, d);
    if (!d.is_meta())
      backend::backend_for(d).grad_stats({present.begin() + static_cast<std::ptrdiff_t>(i),
                                          present.begin() + static_cast<std::ptrdiff_t>(j)},
                                         inv_scale, stats);
    i = j;
  }
  return stats.device() == device ? stats : to_device(stats, device);
}

void grad_stats_into(const Tensor& grad, const Tensor& stats) {
  fill_(stats, 0.0);
  grad_stats_add(grad, 1.0, stats);
}

void grad_stats_add(const Tensor& grad, double inv_scale, const Tensor& stats) {
  TR_CHECK(is_float(grad.dtype()) && grad.is_contiguous(),
           "grad_stats_add: gradient {} is not contiguous floating point", grad.describe());
  TR_CHECK(stats.dtype() == DType::f64 && stats.numel() == 2 && stats.device() == grad.device() &&
               stats.is_contiguous(),
           "grad_stats_add: statistics {} must be f64 [2] on {}", stats.describe(), grad.device().str());
  TR_CHECK(std::isfinite(inv_scale) && inv_scale > 0, "grad_stats_add: inverse loss scale {} is not positive",
           inv_scale);
  if (!grad.device().is_meta() && grad.numel() > 0)
    backend::backend_for(grad.device()).grad_stats({grad}, inv_scale, stats);
}

void transform_grads(const std::vector<std::pair<Tensor, Tensor>>& src_dst,
                     const backend::Backend::GradTransform& t) {
  if (src_dst.empty()) return;
  const Device first = device_or(src_dst.front().first, Device::cpu());
  for (const auto& [d, group] : by_device(src_dst, [&](const auto& x) { return device_or(x.first, first); }))
    transform_grads_on(group, transform_on(t, d));
}

namespace {

void transform_grads_on(const std::vector<std::pair<Tensor, Tensor>>& src_dst,
                        const backend::Backend::GradTransform& t) {
  const Device device = src_dst.front().first.device();
  check_transform("transform_grads", t, device);
  for (const auto& [src, dst] : src_dst) {
    check_operand("transform_grads", "gradient", src, device, -1);
    TR_CHECK(is_float(src.dtype()), "transform_grads: gradient {} is not floating point", src.describe());
    check_operand("transform_grads", "destination", dst, device, src.numel());
    // A half destination: half weights' gradients, transformed in place (f32 math, one rounding).
    TR_CHECK(is_float(dst.dtype()), "transform_grads: destination {} is not floating point", dst.describe());
  }
  if (!device.is_meta()) backend::backend_for(device).transform_grads(src_dst, t);
}

}  // namespace

void fused_adamw(const std::vector<backend::Backend::AdamWTensors>& tensors,
                 const backend::Backend::AdamWHyper& h, const backend::Backend::GradTransform& t) {
  if (tensors.empty()) return;
  const Device first = device_or(tensors.front().param, Device::cpu());
  for (const auto& [d, group] : by_device(tensors, [&](const auto& x) { return device_or(x.param, first); }))
    fused_adamw_on(group, h, transform_on(t, d));
}

namespace {

void fused_adamw_on(const std::vector<backend::Backend::AdamWTensors>& tensors,
                    const backend::Backend::AdamWHyper& h, const backend::Backend::GradTransform& t) {
  const Device device = tensors.front().param.device();
  check_transform("fused_adamw", t, device);
  TR_CHECK(h.step >= 1, "fused_adamw: step {} (bias correction needs a step count from 1)", h.step);
  for (const auto& x : tensors) {
    const int64_t n = x.param.defined() ? x.param.numel() : -1;
    check_operand("fused_adamw", "parameter", x.param, device, -1);
    // bf16/f16: half-precision weights with moments of their dtype, and no separate copy.
    TR_CHECK(is_float(x.param.dtype()), "fused_adamw: parameter {} is not floating point",
             x.param.describe());
    TR_CHECK(!is_half(x.param.dtype()) || !x.param_copy.defined(),
             "fused_adamw: half parameter {} is the model's weight: it takes no copy", x.param.describe());
    check_operand("fused_adamw", "gradient", x.grad, device, n);
    TR_CHECK(is_float(x.grad.dtype()), "fused_adamw: gradient {} is not floating point", x.grad.describe());
    check_operand("fused_adamw", "exp_avg", x.exp_avg, device, n);
    check_operand("fused_adamw", "exp_avg_sq", x.exp_avg_sq, device, n);
    TR_CHECK(x.exp_avg.dtype() == x.param.dtype() && x.exp_avg_sq.dtype() == x.param.dtype(),
             "fused_adamw: moments {} and {} must have the parameter's dtype {}", x.exp_avg.describe(),
             x.exp_avg_sq.describe(), dtype_name(x.param.dtype()));
    if (x.param_copy.defined()) check_operand("fused_adamw", "parameter copy", x.param_copy, device, n);
  }
  if (!device.is_meta()) backend::backend_for(device).fused_adamw(tensors, h, t);
}

}  // namespace

void adamw_8bit(const std::vector<backend::Backend::AdamW8bitTensors>& tensors, const Tensor& signed_map,
                const Tensor& unsigned_map) {
  if (tensors.empty()) return;
  const Device first = device_or(tensors.front().param, Device::cpu());
  for (const auto& [d, group] :
       by_device(tensors, [&](const auto& x) { return device_or(x.param, first); })) {
    const Device dev = d;  // (clang 14 cannot capture a structured binding)
    const auto on = [&](const Tensor& m) {
      return !m.defined() || m.device() == dev ? m : to_device(m, dev);
    };
    adamw_8bit_on(group, on(signed_map), on(unsigned_map));  // the code maps go along
  }
}

namespace {

void adamw_8bit_on(const std::vector<backend::Backend::AdamW8bitTensors>& tensors, const Tensor& signed_map,
                   const Tensor& unsigned_map) {
  const Device device = tensors.front().param.device();
  for (const Tensor* map : {&signed_map, &unsigned_map}) {
    check_operand("adamw_8bit", "code map", *map, device, 256);
    TR_CHECK(map->dtype() == DType::f32, "adamw_8bit: code map {} must be f32", map->describe());
  }
  for (const auto& x : tensors) {
    const int64_t n = x.param.defined() ? x.param.numel() : -1;
    check_operand("adamw_8bit", "parameter", x.param, device, -1);
    check_operand("adamw_8bit", "gradient", x.grad, device, n);
    TR_CHECK(x.param.dtype() == DType::f32 && x.grad.dtype() == DType::f32,
             "adamw_8bit: parameter {} and gradient {} must be f32", x.param.describe(), x.grad.describe());
    const DType state = x.eight_bit ? DType::u8 : DType::f32;
    check_operand("adamw_8bit", "state1", x.state1, device, n);
    check_operand("adamw_8bit", "state2", x.state2, device, n);
    TR_CHECK(x.state1.dtype() == state && x.state2.dtype() == state,
             "adamw_8bit: states {} and {} must be {}", x.state1.describe(), x.state2.describe(),
             dtype_name(state));
    if (x.k.ademamix) {  // AdEMAMix's slow EMA, in state1's form
      check_operand("adamw_8bit", "state3", x.state3, device, n);
      TR_CHECK(x.state3.dtype() == state, "adamw_8bit: state {} must be {}", x.state3.describe(),
               dtype_name(state));
    }
    if (x.eight_bit) {
      const int64_t blocks = (n + 255) / 256;
      check_operand("adamw_8bit", "absmax1", x.absmax1, device, blocks);
      check_operand("adamw_8bit", "absmax2", x.absmax2, device, blocks);
      TR_CHECK(x.absmax1.dtype() == DType::f32 && x.absmax2.dtype() == DType::f32,
               "adamw_8bit: absmax {} and {} must be f32", x.absmax1.describe(), x.absmax2.describe());
      if (x.k.ademamix) {
        check_operand("adamw_8bit", "absmax3", x.absmax3, device, blocks);
        TR_CHECK(x.absmax3.dtype() == DType::f32, "adamw_8bit: absmax {} must be f32", x.absmax3.describe());
      }
    }
  }
  if (!device.is_meta()) backend::backend_for(device).adamw_8bit(tensors, signed_map, unsigned_map);
}

}  // namespace

void sgd(const std::vector<backend::Backend::SgdTensors>& tensors, const backend::Backend::SgdHyper& h) {
  if (tensors.empty()) return;
  const Device first = device_or(tensors.front().param, Device::cpu());
  for (const auto& [d, group] :
       by_device(tensors, [&](const auto& x) { return device_or(x.param, first); })) {
    for (const auto& x : group) {
      const int64_t n = x.param.defined() ? x.param.numel() : -1;
      check_operand("sgd", "parameter", x.param, d, -1);
      TR_CHECK(is_master(x.param.dtype()), "sgd: parameter {} must be f32 or f64", x.param.describe());
      check_operand("sgd", "gradient", x.grad, d, n);
      TR_CHECK(x.grad.dtype() == x.param.dtype(), "sgd: gradient {} must have the parameter's dtype {}",
               x.grad.describe(), dtype_name(x.param.dtype()));
      if (x.momentum_buffer.defined()) {
        check_operand("sgd", "momentum buffer", x.momentum_buffer, d, n);
        TR_CHECK(x.momentum_buffer.dtype() == x.param.dtype(), "sgd: momentum buffer {} must be {}",
                 x.momentum_buffer.describe(), dtype_name(x.param.dtype()));
      }
    }
    if (!d.is_meta()) backend::backend_for(d).sgd(group, h);  // in place: a dry run allocates nothing here
  }
}

void anyprecision_adamw(const std::vector<backend::Backend::AnyPrecisionTensors>& tensors,
                        const backend::Backend::AnyPrecisionHyper& h) {
  if (tensors.empty()) return;
  TR_CHECK(h.step >= 1, "anyprecision_adamw: step {} (bias correction needs a step count from 1)", h.step);
  const Device first = device_or(tensors.front().param, Device::cpu());
  for (const auto& [d, group] :
       by_device(tensors, [&](const auto& x) { return device_or(x.param, first); })) {
    for (const auto& x : group) {
      const int64_t n = x.param.defined() ? x.param.numel() : -1;
      for (const auto& [what, t] : {std::pair<const char*, const Tensor*>{"parameter", &x.param},
                                    {"gradient", &x.grad},
                                    {"exp_avg", &x.exp_avg},
                                    {"exp_avg_sq", &x.exp_avg_sq},
                                    {"compensation", &x.compensation}}) {
        if (t == &x.compensation && !t->defined()) continue;  // no Kahan summation
        check_operand("anyprecision_adamw", what, *t, d, t == &x.param ? -1 : n);
        TR_CHECK(t->dtype() == DType::f32 || is_half(t->dtype()),
                 "anyprecision_adamw: {} {} must be f32, bf16 or f16", what, t->describe());
      }
    }
    if (!d.is_meta()) backend::backend_for(d).anyprecision_adamw(group, h);  // in place
  }
}

void elementwise_step(const std::vector<backend::Backend::ElementwiseTensors>& tensors,
                      const backend::Backend::ElementwiseHyper& h) {
  if (tensors.empty()) return;
  const bool f32_only =
      h.rule == backend::ElementwiseRule::lion || h.rule == backend::ElementwiseRule::rmsprop_bnb;
  const Device first = device_or(tensors.front().param, Device::cpu());
  for (const auto& [d, group] :
       by_device(tensors, [&](const auto& x) { return device_or(x.param, first); })) {
    for (const auto& x : group) {
      const int64_t n = x.param.defined() ? x.param.numel() : -1;
      check_operand("elementwise_step", "parameter", x.param, d, -1);
      TR_CHECK(f32_only ? x.param.dtype() == DType::f32 : is_master(x.param.dtype()),
               "elementwise_step: parameter {} must be {}", x.param.describe(),
               f32_only ? "f32" : "f32 or f64");
      for (const auto& [what, t] : {std::pair<const char*, const Tensor*>{"gradient", &x.grad},
                                    {"state", &x.state1},
                                    {"second state", &x.state2}}) {
        if (t == &x.state2 && !t->defined()) continue;  // optional
        if (t == &x.grad && !t->defined() && !backend::reads_gradient(h.rule)) continue;
        check_operand("elementwise_step", what, *t, d, n);
        TR_CHECK(t->dtype() == x.param.dtype(), "elementwise_step: {} {} must have the parameter's dtype {}",
                 what, t->describe(), dtype_name(x.param.dtype()));
      }
    }
    if (!d.is_meta()) backend::backend_for(d).elementwise_step(group, h);  // in place: nothing to allocate
  }
}

void elementwise_8bit(const std::vector<backend::Backend::Elementwise8bitTensors>& tensors,
                      const backend::Backend::ElementwiseHyper& h, const Tensor& signed_map) {
  if (tensors.empty()) return;
  TR_CHECK(h.rule == backend::ElementwiseRule::lion || h.rule == backend::ElementwiseRule::rmsprop_bnb,
           "elementwise_8bit: only Lion and bitsandbytes' RMSprop keep 8-bit state");
  const Device first = device_or(tensors.front().param, Device::cpu());
  for (const auto& [d, group] :
       by_device(tensors, [&](const auto& x) { return device_or(x.param, first); })) {
    const Tensor map =
        signed_map.defined() && signed_map.device() != d ? to_device(signed_map, d) : signed_map;
    check_operand("elementwise_8bit", "code map", map, d, 256);
    TR_CHECK(map.dtype() == DType::f32, "elementwise_8bit: code map {} must be f32", map.describe());
    for (const auto& x : group) {
      const int64_t n = x.param.defined() ? x.param.numel() : -1;
      check_operand("elementwise_8bit", "parameter", x.param, d, -1);
      check_operand("elementwise_8bit", "gradient", x.grad, d, n);
      check_operand("elementwise_8bit", "codes", x.state1, d, n);
      check_operand("elementwise_8bit", "absmax", x.absmax1, d,
                    (n + backend::kAdam8bitBlock - 1) / backend::kAdam8bitBlock);
      TR_CHECK(x.param.dtype() == DType::f32 && x.grad.dtype() == DType::f32 &&
                   x.state1.dtype() == DType::u8 && x.absmax1.dtype() == DType::f32,
               "elementwise_8bit: parameter {} and gradient f32, codes u8, absmax f32", x.param.describe());
    }
    if (!d.is_meta()) backend::backend_for(d).elementwise_8bit(group, h, map);
  }
}

}  // namespace tr::ops
