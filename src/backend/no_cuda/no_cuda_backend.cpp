// Built instead of backend/cuda when CUDA is off: every entry point says so clearly.
#include "backend/cuda_api.h"

namespace tr::backend {

bool cuda_compiled() { return false; }
bool cuda_available() { return false; }
Device default_device() { return Device::cpu(); }
int cuda_device_count() { return 0; }
std::string cuda_device_name(int) { return ""; }
std::string cuda_summary() {
  return "CUDA: not compiled in (configure with -DTRAINER_CUDA=ON and nvcc present)";
}
Backend& cuda_backend() {
  fail(
      "a cuda tensor was requested, but this build of trainer has no CUDA support (rebuild with "
      "TRAINER_CUDA=ON)");
}

}  // namespace tr::backend

namespace tr::backend {
void cuda_use_device(int) {}  // (backend_for then calls cuda_backend(), which says why there is no GPU)
void cuda_copy_between_devices(const Tensor&, const Tensor&) { cuda_backend(); }

Allocator& pinned_host_allocator() { return cpu_allocator(); }

CopyStream::CopyStream(Device device) : device_(device) {
  TR_CHECK(!device.is_cuda(), "CopyStream for {}: this build has no CUDA support", device.str());
}
CopyStream::~CopyStream() = default;
void CopyStream::copy_async(const Tensor& host, const Tensor& dev) { cuda_copy_between_devices(host, dev); }
void CopyStream::make_compute_wait() {}
void CopyStream::synchronize() {}
}  // namespace tr::backend
