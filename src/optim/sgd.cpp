// SGD step in the operation order of torch.optim.SGD's single-tensor implementation: loops on the CPU
// (f32/f64), the same formulas as tensor ops on a GPU.
#include "optim/sgd.h"

#include <cmath>

#include "backend/backend.h"
#include "optim/common.h"

namespace tr::optim {

SGD::SGD(const nn::ParamList& params, OptimizerOptions opts) : Optimizer(params, std::move(opts)) {
  detail::check_params("SGD", params, {DType::f32, DType::f64}, /*any_device=*/true);
  detail::OptimArgs args("sgd", opts_.args);
  momentum_ = args.number("momentum", 0.0);
  dampening_ = args.number("dampening", 0.0);
  nesterov_ = args.flag("nesterov", false);
  args.check_all_used();
  // torch.optim.SGD's own argument checks
  TR_CHECK(opts_.lr >= 0, "sgd: invalid learning rate {}", opts_.lr);
  TR_CHECK(momentum_ >= 0, "sgd: invalid momentum {}", momentum_);
  TR_CHECK(opts_.weight_decay >= 0, "sgd: invalid weight_decay {}", opts_.weight_decay);
  TR_CHECK(!nesterov_ || (momentum_ > 0 && dampening_ == 0),
           "sgd: Nesterov momentum requires a momentum and zero dampening (momentum={}, dampening={})",
           momentum_, dampening_);
  for (const auto& [name, p] : params) slots_.push_back({name, p, Tensor(), decays(name)});
}

namespace {

struct SGDScalars {
  double lr, wd, momentum, dampening;
  bool nesterov, first;  // first: the momentum buffer is created from this gradient
};

// torch's add_(x, alpha) is a fused multiply-add on its CPU kernels, hence std::fma (see adamw.cpp).
template <typename T>
void sgd_elements(T* p, const T* g, T* buf, int64_t n, const SGDScalars& c) {
  const T wd = static_cast<T>(c.wd), mom = static_cast<T>(c.momentum);
  const T one_damp = static_cast<T>(1.0 - c.dampening), neg_lr = static_cast<T>(-c.lr);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    T d = c.wd != 0 ? std::fma(p[i], wd, g[i]) : g[i];  // d_p = grad.add(param, alpha=wd)
    if (buf) {
      buf[i] = c.first ? d : std::fma(d, one_damp, buf[i] * mom);  // buf.mul_(momentum).add_(d_p, 1-damp)
      d = c.nesterov ? std::fma(buf[i], mom, d) : buf[i];          // d_p.add(buf, alpha=momentum) or buf
    }
    p[i] = std::fma(d, neg_lr, p[i]);  // param.add_(d_p, alpha=-lr)
  }
}

template <typename T>
void sgd_tensor(T* p, const T* g, T* buf, int64_t n, const SGDScalars& c) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t b = k * kChunk;
    sgd_elements(p + b, g + b, buf ? buf + b : nullptr, std::min(kChunk, n - b), c);
  }
}

}  // namespace

void SGD::step() {
  ++step_;
  for (auto& s : slots_) {
    const Tensor g = detail::gradient("SGD", s.name, *s.param);
    if (!g.defined()) continue;  // as torch: parameters without a gradient are skipped
    SGDScalars c{opts_.lr, s.decay ? opts_.weight_decay : 0.0, momentum_, dampening_, nesterov_, false};
    if (momentum_ != 0 && !s.momentum_buffer.defined()) {
      s.momentum_buffer = ops::empty(s.param->shape(), s.param->dtype(), s.param->device());
      c.first = true;
    }
    if (!s.param->device().is_cpu()) {  // the loop's formulas as device ops
      using backend::BinaryOp;
      auto axpy = [](const Tensor& x, double a, const Tensor& y) {  // y + a * x
        return ops::binary(BinaryOp::add, y, ops::affine(x, a, 0.0));
      };
      Tensor d = c.wd != 0 ? axpy(*s.param, c.wd, g) : g;
      if (s.momentum_buffer.defined()) {
        ops::copy_(s.momentum_buffer,
                   c.first ? d : axpy(d, 1.0 - c.dampening, ops::affine(s.momentum_buffer, c.momentum, 0.0)));
        d = c.nesterov ? axpy(s.momentum_buffer, c.momentum, d) : s.momentum_buffer;
      }
      ops::copy_(*s.param, axpy(d, -c.lr, *s.param));
      continue;
    }
    const bool f32 = s.param->dtype() == DType::f32;
    if (f32)
      sgd_tensor(s.param->data<float>(), g.data<float>(),
                 s.momentum_buffer.defined() ? s.momentum_buffer.data<float>() : nullptr, s.param->numel(),
                 c);
    else
      sgd_tensor(s.param->data<double>(), g.data<double>(),
                 s.momentum_buffer.defined() ? s.momentum_buffer.data<double>() : nullptr, s.param->numel(),
                 c);
  }
}

std::vector<std::pair<std::string, Tensor>> SGD::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out{{"step", detail::step_tensor(step_)}};
  for (const auto& s : slots_)
    if (s.momentum_buffer.defined()) out.emplace_back("momentum_buffer." + s.name, s.momentum_buffer);
  return out;
}

void SGD::load_state_dict(const std::map<std::string, Tensor>& state) {
  const int64_t step = detail::load_step(state, "SGD");
  for (auto& s : slots_) {
    const std::string key = "momentum_buffer." + s.name;
    if (!state.count(key)) {
      s.momentum_buffer = Tensor();
      continue;
    }
    TR_CHECK(momentum_ != 0, "SGD state: '{}' is present but this SGD has no momentum", key);
    s.momentum_buffer = ops::empty(s.param->shape(), s.param->dtype(), s.param->device());
    detail::load_entry(state, key, s.momentum_buffer, "SGD");
  }
  step_ = step;
}

}  // namespace tr::optim
