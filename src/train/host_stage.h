// The sharded optimizers' collectives move host buffers; the tensors they fill and read live on the model's
// device or the shard's (a GPU, a host partition, the host itself). These move a contiguous stretch between
// the two: a memcpy where the tensor is in the host's own memory, else one copy through ops::copy_.
#pragma once
#include <algorithm>
#include <cstring>
#include <memory>

#include "backend/cuda_api.h"
#include "core/error.h"
#include "core/storage.h"
#include "ops/ops.h"

namespace tr::train::host_stage {

// Whether the host reads and writes t through its pointer (the host device itself; a host partition such as
// cpu:1 goes through copies, as a GPU does, so the staged path runs on every machine).
inline bool direct(const Tensor& t) { return t.device() == Device::cpu(); }

// A host tensor of `like`'s shape and dtype over `data` (borrowed: no allocator counts it).
inline Tensor over(void* data, const Tensor& like) {
  return Tensor::over(std::make_shared<Storage>(data, like.nbytes(), Device::cpu(), nullptr), like.shape(),
                      like.dtype());
}

// src's bytes (contiguous) into host memory at dst.
inline void read(const Tensor& src, void* dst) {
  TR_CHECK(src.is_contiguous(), "host_stage::read: {} is not contiguous", src.describe());
  if (src.numel() == 0) return;
  if (direct(src)) {
    std::memcpy(dst, src.data_ptr(), src.nbytes());
    return;
  }
  ops::copy_(over(dst, src), src);
}

// Host memory at src into dst (contiguous), byte for byte.
inline void write(const void* src, const Tensor& dst) {
  TR_CHECK(dst.is_contiguous(), "host_stage::write: {} is not contiguous", dst.describe());
  if (dst.numel() == 0) return;
  if (direct(dst)) {
    std::memcpy(dst.data_ptr(), src, dst.nbytes());
    return;
  }
  ops::copy_(dst, over(const_cast<void*>(src), dst));
}

// Elements [at, at + n) of contiguous t as a 1-D view.
inline Tensor stretch(const Tensor& t, int64_t at, int64_t n) {
  TR_CHECK(t.is_contiguous() && at >= 0 && n >= 0 && at + n <= t.numel(),
           "host_stage::stretch: elements [{}, {}) of {}", at, at + n, t.describe());
  return t.as_strided({n}, {1}, t.offset() + at);
}

// A growable host buffer on the host side of those copies, with std::vector's resize (new elements zeroed,
// contents kept): page-locked where the other side is a GPU, so a copy runs at the bus's speed without the
// driver's bounce through its own pinned buffer; else plain host memory that no allocator counts (a CPU run's
// peaks stay what they were).
template <typename T>
class StagingBuffer {
 public:
  StagingBuffer() = default;
  ~StagingBuffer() { free(); }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  // Before the first use: whether the copies go to and from a GPU.
  void pin(bool pinned) {
    if (pinned == pinned_) return;
    free();
    n_ = 0;
    pinned_ = pinned;
  }
  void resize(size_t n) {
    if (n > cap_) {
      T* q = pinned_ ? static_cast<T*>(backend::pinned_host_allocator().allocate(n * sizeof(T))) : new T[n];
      if (n_ > 0) std::memcpy(q, p_, n_ * sizeof(T));
      free();
      p_ = q;
      cap_ = n;
    }
    if (n > n_) std::fill(p_ + n_, p_ + n, T{});
    n_ = n;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }
  T& operator[](size_t i) { return p_[i]; }

 private:
  void free() {
    if (p_ == nullptr) return;
    if (pinned_)
      backend::pinned_host_allocator().deallocate(p_, cap_ * sizeof(T));
    else
      delete[] p_;
    p_ = nullptr;
    cap_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0, cap_ = 0;
  bool pinned_ = false;
};

}  // namespace tr::train::host_stage
