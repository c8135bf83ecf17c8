// A block of device memory, either owned through an Allocator or borrowed from an owner that keeps it alive
// (a memory-mapped file); tensors share it through views.
#pragma once
#include <cstddef>
#include <memory>

#include "core/allocator.h"

namespace tr {

class Storage {
 public:
  Storage(size_t nbytes, Allocator& alloc) : nbytes_(nbytes), alloc_(&alloc), device_(alloc.device()) {
    data_ = alloc.allocate(nbytes);
  }
  // Storage of the allocator's that starts released (see release): taken at the first reacquire.
  struct Released {};
  Storage(size_t nbytes, Allocator& alloc, Released)
      : nbytes_(nbytes), alloc_(&alloc), device_(alloc.device()), released_(true) {}
  // Borrowed memory: not counted by any allocator, released when `owner` is.
  Storage(void* data, size_t nbytes, Device device, std::shared_ptr<void> owner)
      : data_(data), nbytes_(nbytes), device_(device), owner_(std::move(owner)) {}
  ~Storage() {
    if (alloc_ && !released_) alloc_->deallocate(data_, nbytes_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  // ZeRO-3 (full_shard): a parameter's bytes handed back to the allocator between uses, and taken again
  // before the next one; every tensor over this storage stays valid and sees the new bytes. Borrowed memory
  // cannot be released.
  void release() {
    if (alloc_ && !released_) alloc_->deallocate(data_, nbytes_);
    data_ = alloc_ ? nullptr : data_;
    released_ = alloc_ != nullptr;
  }
  void reacquire() {
    if (!released_) return;
    data_ = alloc_->allocate(nbytes_);
    released_ = false;
  }
  bool released() const { return released_; }
  Device device() const { return device_; }
  bool borrowed() const { return alloc_ == nullptr; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Allocator* alloc_ = nullptr;
  Device device_;
  std::shared_ptr<void> owner_;
  bool released_ = false;
};

}  // namespace tr
