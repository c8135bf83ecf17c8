// A CUDA device's compute stream and its caching allocator (cuda_backend.cpp owns one per device).
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"
#include "core/allocator.h"
#include "core/caching_allocator.h"

namespace tr::cuda {

// A device's compute stream: every launcher, copy and GEMM queues there (created on first use, non-blocking:
// nothing orders it with the legacy default stream, which nothing of ours uses). A stream of our own is what
// CUDA graph capture and NCCL overlap need.
class ComputeStream {
 public:
  explicit ComputeStream(int index) : index_(index) {}
  ~ComputeStream() {
    if (s_) cudaStreamDestroy(s_);  // at exit the driver may be gone: nothing to report
  }
  cudaStream_t get() {
    std::call_once(once_, [this] {
      int prev = 0;
      TR_CUDA_CHECK(cudaGetDevice(&prev));
      TR_CUDA_CHECK(cudaSetDevice(index_));
      const cudaError_t e = cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking);
      cudaSetDevice(prev);
      TR_CUDA_CHECK(e);
    });
    return s_;
  }

 private:
  int index_;
  std::once_flag once_;
  cudaStream_t s_ = nullptr;
};

// Device memory through the caching allocator (core/caching_allocator.h): cudaMalloc'd segments carved
// into blocks that are reused step after step, as PyTorch's allocator does; empty_cache() returns the unused
// segments. Statistics of the Allocator base count requested bytes (what the meta device predicts); the
// core's own statistics (allocated/reserved/peak) are in memory_summary().
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index)
      : index_(index),
        stream_(std::make_unique<ComputeStream>(index)),
        core_(make_backend(index, stream_.get())) {}
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    check_limit(nbytes);
    // Stream 0 of the core is this device's compute stream: a freed block is reused in that stream's order.
    void* p = core_.allocate(nbytes, 0);
    record_alloc(nbytes);
    notify_alloc(p, nbytes);  // (an allocation trace, TRAINER_ALLOCATOR_TRACE)
    if (poison()) TR_CUDA_CHECK(cudaMemsetAsync(p, 0xff, nbytes, stream_->get()));
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    // Told before the block can be handed out again (another thread may allocate on this device: the loader,
    // ZeRO's communication thread), so a trace never sees its address reused before its free.
    record_free(nbytes);
    notify_free(ptr);
    core_.free(ptr);
  }
  Device device() const override { return Device::cuda(index_); }
  void empty_cache() override {
    core_.empty_cache();
    notify_empty_cache();
  }
  int64_t capacity() const override { return static_cast<int64_t>(core_.capacity()); }
  int64_t peak_reserved_bytes() const override { return core_.stats().peak_reserved_bytes; }
  void reset_peak_reserved() override { core_.reset_peak(); }
  CachingAllocatorCore& core() { return core_; }
  cudaStream_t stream() { return stream_->get(); }

 private:
  // Runs fn with index as the current device, restoring the caller's.
  template <typename F>
  static auto on_device(int index, F&& fn) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(index);
    auto r = fn();
    cudaSetDevice(prev);
    return r;
  }
  static CachingAllocatorCore::Backend make_backend(int index, ComputeStream* compute) {
    CachingAllocatorCore::Backend b;
    b.alloc_segment = [index](size_t n) -> void* {
      return on_device(index, [&]() -> void* {
        void* p = nullptr;
        if (cudaMalloc(&p, n) != cudaSuccess) {
          cudaGetLastError();  // not sticky: the caller flushes its cache and retries
          return nullptr;
        }
        return p;
      });
    };
    b.free_segment = [index](void* p, size_t) { on_device(index, [&] { return cudaFree(p); }); };
    b.record_event = [index, compute](uint64_t stream) {
      return on_device(index, [&] {
        cudaEvent_t e = nullptr;
        TR_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        const cudaStream_t s = stream == 0 ? compute->get() : reinterpret_cast<cudaStream_t>(stream);
        TR_CUDA_CHECK(cudaEventRecord(e, s));
        return reinterpret_cast<uint64_t>(e);
      });
    };
    b.event_done = [](uint64_t e) {
      const cudaError_t r = cudaEventQuery(reinterpret_cast<cudaEvent_t>(e));
      if (r == cudaErrorNotReady) return false;
      TR_CUDA_CHECK(r);
      return true;
    };
    b.release_event = [](uint64_t e) { cudaEventDestroy(reinterpret_cast<cudaEvent_t>(e)); };
    b.device_summary = [index] {
      size_t free_b = 0, total_b = 0;
      on_device(index, [&] { return cudaMemGetInfo(&free_b, &total_b); });
      return fmt::format("cuda:{} ({:.2f} GiB free of {:.2f} GiB)", index, free_b / 1073741824.0,
                         total_b / 1073741824.0);
    };
    // From the properties, not cudaMemGetInfo: that would create a context on every visible GPU in every
    // process (8 ranks on 8 GPUs: 8 contexts a GPU).
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) cudaGetLastError();
    b.total_memory = prop.totalGlobalMem;
    return b;
  }

  int index_;
  std::unique_ptr<ComputeStream> stream_;  // before core_, whose backend uses it
  CachingAllocatorCore core_;
};

}  // namespace tr::cuda
