// The CUDA backend's entry points of cuda_api.h on the host side: the devices present and their summary, the
// default device, the device guard (cuda_use_device), page-locked host memory, CopyStream and the copies
// between host and GPUs. The backend itself is cuda_backend.cpp.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn_version.h>
#include <dlfcn.h>
#include <nccl.h>
#include <fmt/format.h>

#include <cstdio>
#include <mutex>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/streams.h"
#include "backend/cuda_api.h"
#include "core/error.h"

namespace tr::backend {

namespace {

int device_count_uncached() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

}  // namespace

bool cuda_compiled() { return true; }
int cuda_device_count() {
  static const int n = device_count_uncached();
  return n;
}
bool cuda_available() { return cuda_device_count() > 0; }

Device default_device() {
  if (cuda_available()) return Device::cuda(0);
  static std::once_flag noticed;
  std::call_once(noticed, [] {
    std::fprintf(stderr, "trainer: built with CUDA but no GPU is present (%s); running on the CPU\n",
                 cuda_summary().c_str());
  });
  return Device::cpu();
}

Backend& cuda_backend() {
  TR_CHECK(cuda_available(), "a cuda tensor was requested, but no CUDA GPU is present ({})", cuda_summary());
  return cuda::backend_instance();
}

void cuda_use_device(int index) {
  if (!cuda_available()) return;  // (cuda_backend() then says why)
  int current = -1;
  TR_CUDA_CHECK(cudaGetDevice(&current));
  if (current == index) return;
  TR_CHECK(index >= 0 && index < cuda_device_count(), "cuda:{} does not exist ({} GPUs present)", index,
           cuda_device_count());
  TR_CUDA_CHECK(cudaSetDevice(index));
}

std::string cuda_device_name(int index) {
  cudaDeviceProp p{};
  if (!cuda_available() || cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return p.name;
}

std::string cuda_summary() {
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  if (cudaDriverGetVersion(&drv) != cudaSuccess) cudaGetLastError();
  const int n = cuda_device_count();
  std::string s = fmt::format("CUDA runtime {}.{}, driver {}.{}, {} GPU(s)", rt / 1000, (rt % 1000) / 10,
                              drv / 1000, (drv % 1000) / 10, n);
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) == cudaSuccess)
      s += fmt::format("; cuda:{} {} sm_{}{} {:.1f} GiB", i, p.name, p.major, p.minor,
                       static_cast<double>(p.totalGlobalMem) / (1 << 30));
  }
  return s;
}

namespace {

// major.minor.patch of a version code major * 10000 + minor * 100 + patch (cuBLAS, cuDNN 9, NCCL >= 2.9).
std::string dotted(size_t code) {
  return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
}

// A library's version at run time through dlopen (nullopt-like 0 when it is absent or lacks the symbol).
template <typename Fn, typename Get>
size_t runtime_version(const char* lib, const char* symbol, Get get) {
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return 0;
  const auto fn = reinterpret_cast<Fn>(dlsym(h, symbol));
  return fn ? get(fn) : 0;
}

}  // namespace

void cuda_use_cudnn_attention(bool on) {
  if (cuda_available()) cuda::use_cudnn_attention(on);
}

CudnnAttentionCounts cuda_cudnn_attention_counts() {
  return cuda_available() ? cuda::cudnn_attention_counts() : CudnnAttentionCounts{};
}

std::string gpu_library_versions() {
  const size_t nccl = runtime_version<int (*)(int*)>("libnccl.so.2", "ncclGetVersion", [](auto fn) {
    int v = 0;
    return fn(&v) == 0 ? static_cast<size_t>(v) : size_t{0};
  });
  const size_t cudnn =
      runtime_version<size_t (*)()>("libcudnn.so.9", "cudnnGetVersion", [](auto fn) { return fn(); });
  return fmt::format(
      "cuBLASLt {} (built against {}); NCCL {} (built against {}; opened at the first communicator); cuDNN "
      "{} (built against {}; its fused attention runs bf16/f16 attention without padding masks or dropout, "
      "our flash and tiled kernels the rest)",
      dotted(cublasLtGetVersion()), dotted(CUBLAS_VERSION), nccl ? dotted(nccl) : "not found (libnccl.so.2)",
      dotted(NCCL_VERSION_CODE), cudnn ? dotted(cudnn) : "not found (libcudnn.so.9)", dotted(CUDNN_VERSION));
}

namespace {

// cudaHostAlloc-backed host memory (falls back to the CPU allocator without a GPU).
class PinnedAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    void* p = nullptr;
    TR_CUDA_CHECK(cudaHostAlloc(&p, nbytes, cudaHostAllocDefault));
    record_alloc(nbytes);
    return p;
  }
  void deallocate(void* p, size_t nbytes) override {
    if (!p) return;
    cudaFreeHost(p);
    record_free(nbytes);
  }
  Device device() const override { return Device::cpu(); }
};

}  // namespace

Allocator& pinned_host_allocator() {
  if (!cuda_available()) return cpu_allocator();
  static PinnedAllocator a;
  return a;
}

CopyStream::CopyStream(Device device) : device_(device) {
  if (!device.is_cuda()) return;
  cuda_backend();
  cuda_use_device(device.index);  // the stream and events belong to the device copied to
  cudaStream_t s = nullptr;
  cudaEvent_t e = nullptr, c = nullptr;
  TR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  TR_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  event_ = e;
  TR_CUDA_CHECK(cudaEventCreateWithFlags(&c, cudaEventDisableTiming));
  compute_ = c;
}

CopyStream::~CopyStream() {
  if (compute_) cudaEventDestroy(static_cast<cudaEvent_t>(compute_));
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void CopyStream::copy_async(const Tensor& host, const Tensor& dev) {
  TR_CHECK(host.device().is_cpu() && dev.device() == device_ && host.is_contiguous() && dev.is_contiguous() &&
               host.nbytes() == dev.nbytes() && host.dtype() == dev.dtype(),
           "copy_async: {} -> {} must be contiguous host -> {} tensors of one size", host.describe(),
           dev.describe(), device_.str());
  if (!stream_) {
    cuda_copy_between_devices(host, dev);
    return;
  }
  // The device block may have been freed by tensors that kernels queued on the compute stream still read:
  // the copy waits for them on the device, not on the host.
  cuda_use_device(device_.index);
  TR_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(compute_), cuda::compute_stream(device_.index)));
  TR_CUDA_CHECK(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(compute_), 0));
  TR_CUDA_CHECK(cudaMemcpyAsync(dev.data_ptr(), host.data_ptr(), host.nbytes(), cudaMemcpyHostToDevice,
                                static_cast<cudaStream_t>(stream_)));
}

void CopyStream::make_compute_wait() {
  if (!stream_) return;
  cuda_use_device(device_.index);
  TR_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream_)));
  // The compute stream waits for the event, the host does not.
  TR_CUDA_CHECK(
      cudaStreamWaitEvent(cuda::compute_stream(device_.index), static_cast<cudaEvent_t>(event_), 0));
}

void CopyStream::synchronize() {
  if (stream_) TR_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
}

ComputeFence::ComputeFence(Device device) : device_(device) {
  if (!device.is_cuda()) return;
  cuda_backend();
  cuda_use_device(device.index);
  cudaEvent_t e = nullptr;
  TR_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  event_ = e;
}

ComputeFence::~ComputeFence() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void ComputeFence::record() {
  if (!event_) return;
  cuda_use_device(device_.index);
  TR_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), cuda::compute_stream(device_.index)));
  recorded_ = true;
}

void cuda_copy_between_devices(const Tensor& src, const Tensor& dst) {
  TR_CHECK(src.nbytes() == dst.nbytes() && src.dtype() == dst.dtype(), "copy between {} and {}: sizes differ",
           src.describe(), dst.describe());
  if (src.nbytes() == 0) return;
  cudaMemcpyKind kind = src.device().is_cpu()   ? cudaMemcpyHostToDevice
                        : dst.device().is_cpu() ? cudaMemcpyDeviceToHost
                                                : cudaMemcpyDeviceToDevice;
  if (!src.device().is_cpu()) cuda_backend();
  if (!dst.device().is_cpu()) cuda_backend();
  // From another GPU: what src's device still has queued for it finishes first (its stream is not ours).
  if (kind == cudaMemcpyDeviceToDevice && src.device() != dst.device()) {
    cuda_use_device(src.device().index);
    TR_CUDA_CHECK(cudaStreamSynchronize(cuda::compute_stream(src.device().index)));
  }
  // On the compute stream of the device copied to (from, for the host), after what is queued there, and
  // finished before returning (as cudaMemcpy).
  const int on = dst.device().is_cpu() ? src.device().index : dst.device().index;
  cuda_use_device(on);
  const cudaStream_t stream = cuda::compute_stream(on);
  TR_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), kind, stream));
  TR_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (kind == cudaMemcpyDeviceToHost) cuda::report_device_errors();  // the queue has drained
}

}  // namespace tr::backend
