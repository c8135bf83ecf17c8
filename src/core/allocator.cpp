// CPU and meta allocators with current/peak byte accounting.
#include "core/allocator.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace tr {

AllocatorStats Allocator::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> g(mu_);
  stats_.peak_bytes = stats_.current_bytes;
}

void Allocator::record_alloc(size_t nbytes) {
  std::lock_guard<std::mutex> g(mu_);
  stats_.current_bytes += static_cast<int64_t>(nbytes);
  stats_.num_allocs += 1;
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
}

void Allocator::record_free(size_t nbytes) {
  std::lock_guard<std::mutex> g(mu_);
  stats_.current_bytes -= static_cast<int64_t>(nbytes);
}

void* CpuAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  TR_CHECK(p != nullptr, "cpu allocator: out of memory allocating {} bytes (in use: {} bytes)", nbytes,
           stats().current_bytes);
  record_alloc(nbytes);
  if (poison()) std::memset(p, 0xff, rounded);
  return p;
}

void CpuAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  std::free(ptr);
  record_free(nbytes);
}

void* MetaAllocator::allocate(size_t nbytes) {
  record_alloc(nbytes);
  return nullptr;
}

void MetaAllocator::deallocate(void*, size_t nbytes) { record_free(nbytes); }

CpuAllocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

MetaAllocator& meta_allocator() {
  static MetaAllocator a;
  return a;
}

}  // namespace tr
