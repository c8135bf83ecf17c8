// The sharded optimizers' collectives move host buffers; the tensors they fill and read live on the model's
// device or the shard's (a GPU, a host partition, the host itself). These move a contiguous stretch between
// the two: a memcpy where the tensor is in the host's own memory, else one copy through ops::copy_.
#pragma once
#include <cstring>
#include <memory>

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
  if (src.numel() == 0) return;
  if (direct(src)) {
    std::memcpy(dst, src.data_ptr(), src.nbytes());
    return;
  }
  ops::copy_(over(dst, src), src);
}

// Host memory at src into dst (contiguous), byte for byte.
inline void write(const void* src, const Tensor& dst) {
  if (dst.numel() == 0) return;
  if (direct(dst)) {
    std::memcpy(dst.data_ptr(), src, dst.nbytes());
    return;
  }
  ops::copy_(dst, over(const_cast<void*>(src), dst));
}

// Elements [at, at + n) of contiguous t as a 1-D view.
inline Tensor stretch(const Tensor& t, int64_t at, int64_t n) {
  return t.as_strided({n}, {1}, t.offset() + at);
}

}  // namespace tr::train::host_stage
