// CPU and meta allocators with current/peak byte accounting.
#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <sys/mman.h>

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

void Allocator::begin_window() {
  std::lock_guard<std::mutex> g(mu_);
  stats_.window_peak_bytes = stats_.current_bytes;
}

void Allocator::record_alloc(size_t nbytes) {
  std::lock_guard<std::mutex> g(mu_);
  stats_.current_bytes += static_cast<int64_t>(nbytes);
  stats_.num_allocs += 1;
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  if (stats_.current_bytes > stats_.window_peak_bytes) stats_.window_peak_bytes = stats_.current_bytes;
}

void Allocator::set_limit(int64_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  limit_ = bytes;
}

int64_t Allocator::limit() const {
  std::lock_guard<std::mutex> g(mu_);
  return limit_;
}

void Allocator::check_limit(size_t nbytes) const {
  std::lock_guard<std::mutex> g(mu_);
  if (limit_ <= 0 || stats_.current_bytes + static_cast<int64_t>(nbytes) <= limit_) return;
  throw OutOfMemoryError(
      fmt::format("{} out of memory: tried to allocate {:.1f} MiB with {:.1f} MiB in use (peak {:.1f} MiB) "
                  "under a limit of "
                  "{:.1f} MiB",
                  device().str(), nbytes / 1048576.0, stats_.current_bytes / 1048576.0,
                  stats_.peak_bytes / 1048576.0, limit_ / 1048576.0));
}

void Allocator::record_free(size_t nbytes) {
  std::lock_guard<std::mutex> g(mu_);
  stats_.current_bytes -= static_cast<int64_t>(nbytes);
}

void Allocator::set_observer(AllocationObserver* observer) {
  std::lock_guard<std::mutex> g(mu_);
  TR_CHECK(observer == nullptr || observer_ == nullptr || observer_ == observer,
           "{} allocator: already observed", device().str());
  observer_ = observer;
  observed_.store(observer != nullptr, std::memory_order_release);
}

bool Allocator::observed() const {
  std::lock_guard<std::mutex> g(mu_);
  return observer_ != nullptr;
}

void Allocator::notify_alloc(const void* block, size_t nbytes) {
  if (!observed_.load(std::memory_order_acquire)) return;  // the common case: no lock per allocation
  std::lock_guard<std::mutex> g(mu_);
  if (observer_) observer_->allocated(block, nbytes);
}

void Allocator::notify_free(const void* block) {
  if (!observed_.load(std::memory_order_acquire)) return;  // the common case: no lock per allocation
  std::lock_guard<std::mutex> g(mu_);
  if (observer_) observer_->freed(block);
}

void Allocator::notify_empty_cache() {
  if (!observed_.load(std::memory_order_acquire)) return;  // the common case: no lock per allocation
  std::lock_guard<std::mutex> g(mu_);
  if (observer_) observer_->cache_emptied();
}

ObserveAllocations::ObserveAllocations(Allocator& alloc, AllocationObserver& observer) : alloc_(alloc) {
  TR_CHECK(!alloc.observed(), "{} allocator: already observed", alloc.device().str());
  alloc.set_observer(&observer);
}

ObserveAllocations::~ObserveAllocations() { alloc_.set_observer(nullptr); }

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t block_size(size_t nbytes) {
  if (nbytes >= CpuAllocator::kLargeBlock) return (nbytes + kHugePage - 1) / kHugePage * kHugePage;
  return (nbytes + CpuAllocator::kAlignment - 1) / CpuAllocator::kAlignment * CpuAllocator::kAlignment;
}

}  // namespace

CpuAllocator::~CpuAllocator() { empty_cache(); }

void* CpuAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  check_limit(nbytes);
  const size_t size = block_size(nbytes);
  void* p = nullptr;
  if (nbytes >= kLargeBlock) {
    std::lock_guard<std::mutex> g(cache_mu_);
    auto it = cache_.find(size);
    if (it != cache_.end()) {
      p = it->second;
      cache_.erase(it);
      cached_ -= size;
    }
  }
  if (p == nullptr) {
    p = std::aligned_alloc(nbytes >= kLargeBlock ? kHugePage : kAlignment, size);
    if (p == nullptr) {
      empty_cache();
      p = std::aligned_alloc(nbytes >= kLargeBlock ? kHugePage : kAlignment, size);
    }
    TR_CHECK(p != nullptr, "cpu allocator: out of memory allocating {} bytes (in use: {} bytes)", nbytes,
             stats().current_bytes);
    if (nbytes >= kLargeBlock) madvise(p, size, MADV_HUGEPAGE);  // fewer page faults; a hint only
  }
  record_alloc(nbytes);
  notify_alloc(p, nbytes);
  if (poison()) std::memset(p, 0xff, size);
  return p;
}

void CpuAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  record_free(nbytes);
  notify_free(ptr);
  if (nbytes >= kLargeBlock) {
    const size_t size = block_size(nbytes);
    std::lock_guard<std::mutex> g(cache_mu_);
    if (cached_ + size <= cache_limit_) {
      cache_.emplace(size, ptr);
      cached_ += size;
      return;
    }
  }
  std::free(ptr);
}

void CpuAllocator::empty_cache() {
  {
    std::lock_guard<std::mutex> g(cache_mu_);
    for (auto& [size, p] : cache_) std::free(p);
    cache_.clear();
    cached_ = 0;
  }
  notify_empty_cache();
}

void CpuAllocator::set_cache_limit(size_t bytes) {
  {
    std::lock_guard<std::mutex> g(cache_mu_);
    cache_limit_ = bytes;
  }
  if (cached_bytes() > bytes) empty_cache();
}

size_t CpuAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> g(cache_mu_);
  return cached_;
}

void* MetaAllocator::allocate(size_t nbytes) {
  record_alloc(nbytes);
  if (nbytes == 0 || !observed()) return nullptr;
  void* key = reinterpret_cast<void*>((next_key_.fetch_add(1) + 1) * 64);
  notify_alloc(key, nbytes);
  return key;
}

void MetaAllocator::deallocate(void* ptr, size_t nbytes) {
  record_free(nbytes);
  if (ptr) notify_free(ptr);
}

CpuAllocator& cpu_allocator(int index) {
  static CpuAllocator a;
  if (index == 0) return a;
  TR_CHECK(index > 0 && index < CpuAllocator::kHostPartitions, "cpu:{}: host partitions are cpu:1 to cpu:{}",
           index, CpuAllocator::kHostPartitions - 1);
  static CpuAllocator partitions[CpuAllocator::kHostPartitions] = {
      CpuAllocator(0), CpuAllocator(1), CpuAllocator(2), CpuAllocator(3),
      CpuAllocator(4), CpuAllocator(5), CpuAllocator(6), CpuAllocator(7)};
  return partitions[index];
}

MetaAllocator& meta_allocator(int index) {
  TR_CHECK(index >= 0 && index < MetaAllocator::kDevices,
           "meta:{}: the meta devices are meta and meta:1 to meta:{}", index, MetaAllocator::kDevices - 1);
  static const auto all = [] {
    std::vector<std::unique_ptr<MetaAllocator>> v;
    for (int i = 0; i < MetaAllocator::kDevices; ++i) v.push_back(std::make_unique<MetaAllocator>(i));
    return v;
  }();
  return *all[static_cast<size_t>(index)];
}

}  // namespace tr
