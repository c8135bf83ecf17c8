// Entry points the CUDA backend provides; backend/cuda implements them with CUDA and backend/no_cuda with
// clear errors, so no code outside the backends needs an #ifdef.
#pragma once
#include <string>

#include "backend/backend.h"

namespace tr::backend {

// cuBLASLt's workspace per device (PyTorch's size for Hopper): cudaMalloc'd once, outside the caching
// allocator; `trainer estimate --device cuda` counts it.
inline constexpr size_t kCublasLtWorkspaceBytes = size_t{32} << 20;

// True when compiled with CUDA support (whether or not a GPU is present).
bool cuda_compiled();
// The CUDA backend; throws when built without CUDA or when no GPU is present.
Backend& cuda_backend();
// Makes cuda:index the calling thread's current device - the one kernels, streams, cuBLAS handles and graph
// captures of the backend follow - as PyTorch's device guard; backend_for(cuda:i) calls it, so an op on
// another GPU's tensors runs on that GPU. Cheap when it already is current.
void cuda_use_device(int index);
// Copies between host and a GPU (or two GPUs): both contiguous, same dtype and size.
void cuda_copy_between_devices(const Tensor& src, const Tensor& dst);
// Host memory for data headed to a GPU: page-locked (cudaHostAlloc) when a GPU is usable, else plain
// 64-byte-aligned memory. Counts like any allocator.
Allocator& pinned_host_allocator();

// A dedicated stream for host-to-device copies. copy_async() queues the copy of a contiguous host tensor
// (page-locked for true overlap) into a same-sized device tensor, after the work the compute stream has
// queued so far (the caching allocator may hand out a block that queued kernels still read: a copy on another
// stream must not overwrite it before they ran); make_compute_wait() orders the device's compute stream after
// every copy queued so far. Neither blocks the host.
class CopyStream {
 public:
  explicit CopyStream(Device device);
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  void copy_async(const Tensor& host, const Tensor& dev);
  void make_compute_wait();
  // Blocks until every queued copy is done (before their host buffers are reused or freed).
  void synchronize();

 private:
  Device device_;
  void* stream_ = nullptr;   // cudaStream_t
  void* event_ = nullptr;    // cudaEvent_t: the copies queued so far
  void* compute_ = nullptr;  // cudaEvent_t: the compute work queued before a copy
};

// cuda:0 when a GPU is usable, else the CPU (a CUDA build without a GPU says so once on stderr).
Device default_device();
// cuda:<index>'s name ("NVIDIA H200"); empty when there is no such GPU or no CUDA.
std::string cuda_device_name(int index);
// One line about the CUDA runtime, driver and devices (or why there is none).
std::string cuda_summary();

}  // namespace tr::backend
