// A block of device memory owned through an Allocator; tensors share it through views.
#pragma once
#include <cstddef>
#include <memory>

#include "core/allocator.h"

namespace tr {

class Storage {
 public:
  Storage(size_t nbytes, Allocator& alloc) : nbytes_(nbytes), alloc_(&alloc) {
    data_ = alloc.allocate(nbytes);
  }
  ~Storage() { alloc_->deallocate(data_, nbytes_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return alloc_->device(); }
  Allocator& allocator() const { return *alloc_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Allocator* alloc_;
};

}  // namespace tr
