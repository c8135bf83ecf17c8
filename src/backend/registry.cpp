// Picks the backend for a device and answers whether CUDA can be used.
#include "backend/backend.h"

#include <atomic>
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda_api.h"

namespace tr::backend {

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: return "neg";
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::rsqrt: return "rsqrt";
    case UnaryOp::tanh: return "tanh";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::relu: return "relu";
    case UnaryOp::gelu_tanh: return "gelu_tanh";
    case UnaryOp::gelu_erf: return "gelu_erf";
    case UnaryOp::silu: return "silu";
    case UnaryOp::abs: return "abs";
    case UnaryOp::square: return "square";
    case UnaryOp::reciprocal: return "reciprocal";
  }
  return "?";
}

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    case BinaryOp::div: return "div";
    case BinaryOp::maximum: return "maximum";
    case BinaryOp::minimum: return "minimum";
    case BinaryOp::eq: return "eq";
  }
  return "?";
}

namespace {
std::atomic<bool> g_allow_tf32{false};     // process-wide by design, as torch's flag (see backend.h)
std::atomic<bool> g_gemm_autotune{false};  // process-wide by design, as inductor's config (see backend.h)
}  // namespace

void set_gemm_autotune(bool on) { g_gemm_autotune = on; }
bool gemm_autotune() { return g_gemm_autotune.load(); }

void set_allow_tf32(bool on) { g_allow_tf32 = on; }
bool allow_tf32() { return g_allow_tf32.load(); }

namespace {
// The interposers of this thread's InterposeScopes, by device type (every index of a type).
thread_local Backend* t_interposer[3] = {nullptr, nullptr, nullptr};
size_t slot(Device d) { return static_cast<size_t>(d.type); }
}  // namespace

InterposeScope::InterposeScope(Device device, Backend& interposer)
    : device_(device), previous_(t_interposer[slot(device)]) {
  t_interposer[slot(device)] = &interposer;
}

InterposeScope::~InterposeScope() { t_interposer[slot(device_)] = previous_; }

Backend& backend_for(Device device) {
  // A GPU's work goes to that GPU (its stream, handles; an interposer's recorded calls too).
  if (device.is_cuda()) cuda_use_device(device.index);
  if (Backend* b = t_interposer[slot(device)]) return *b;
  switch (device.type) {
    case DeviceType::cpu:
    case DeviceType::meta: return cpu::cpu_backend();
    case DeviceType::cuda: return cuda_backend();
  }
  fail("no backend for device {}", device.str());
}

}  // namespace tr::backend
