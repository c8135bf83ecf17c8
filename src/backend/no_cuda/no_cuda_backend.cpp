// Built instead of backend/cuda when CUDA is off: every entry point says so clearly.
#include "backend/cuda_api.h"

namespace tr::backend {

bool cuda_compiled() { return false; }
bool cuda_available() { return false; }
Device default_device() { return Device::cpu(); }
int cuda_device_count() { return 0; }
std::string cuda_device_name(int) { return ""; }
std::string gpu_library_versions() { return ""; }
void cuda_use_cudnn_attention(bool) {}
CudnnAttentionCounts cuda_cudnn_attention_counts() { return {}; }
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
ComputeFence::ComputeFence(Device device) : device_(device) {
  TR_CHECK(!device.is_cuda(), "ComputeFence for {}: this build has no CUDA support", device.str());
}
ComputeFence::~ComputeFence() = default;
void ComputeFence::record() {}
void CopyStream::copy_async(const Tensor& host, const Tensor& dev) { cuda_copy_between_devices(host, dev); }
void CopyStream::make_compute_wait() {}
void CopyStream::synchronize() {}
}  // namespace tr::backend

namespace tr::backend {
// No NCCL without CUDA: a communicator is never made, so the members after the constructor are unreachable.
std::string NcclComm::unique_id() {
  fail("--ddp_backend nccl: this build of trainer has no CUDA support (rebuild with TRAINER_CUDA=ON)");
}
NcclComm::NcclComm(int, int, int, const std::string&, std::chrono::milliseconds)
    : device_(0), rank_(0), world_(0), timeout_(0) {
  unique_id();
}
NcclComm::NcclComm(int, int, int, void*, std::chrono::milliseconds)
    : device_(0), rank_(0), world_(0), timeout_(0) {
  unique_id();
}
NcclComm::~NcclComm() = default;
void NcclComm::all_reduce_sum(void*, size_t, DType) { unique_id(); }
void NcclComm::all_reduce_sum_device(void*, size_t, DType, const void*) { unique_id(); }
void NcclComm::reduce_scatter_sum_device(const float*, float*, size_t) { unique_id(); }
void NcclComm::reduce_blocks_device(const float*, const std::vector<int64_t>&, float*, const void*) {
  unique_id();
}
void NcclComm::all_gather_device(const void*, void*, size_t) { unique_id(); }
void NcclComm::all_gather_v_device(const void*, void*, const std::vector<size_t>&) { unique_id(); }
void NcclComm::broadcast(void*, size_t, int) { unique_id(); }
void NcclComm::all_gather(const void*, void*, size_t) { unique_id(); }
void NcclComm::exchange(const void*, const std::vector<size_t>&, void*, const std::vector<size_t>&) {
  unique_id();
}
std::unique_ptr<NcclComm> NcclComm::split(int, int) {
  unique_id();
  return nullptr;
}
void* NcclComm::staging(size_t) { return nullptr; }
void NcclComm::wait(const char*) {}
}  // namespace tr::backend
