// ScratchPool: best-fit reuse of the widened GEMMs' f32 buffers, huge-page backed.
#include "backend/cpu/scratch_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace tr::cpu {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}

ScratchPool::Lease ScratchPool::take(size_t n) {
  {
    std::lock_guard<std::mutex> g(mu_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->capacity >= n && (best == free_.end() || it->capacity < best->capacity)) best = it;
    if (best != free_.end()) {
      Block b = *best;
      free_.erase(best);
      return Lease(*this, b.p, b.capacity);
    }
  }
  const size_t bytes = (std::max<size_t>(n, 1) * sizeof(float) + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, bytes);
  TR_CHECK(p != nullptr, "cpu backend: out of memory allocating {} bytes of GEMM scratch", bytes);
  madvise(p, bytes, MADV_HUGEPAGE);  // a hint: fewer page faults on first touch
  return Lease(*this, static_cast<float*>(p), bytes / sizeof(float));
}

void ScratchPool::give_back(float* p, size_t capacity) {
  std::lock_guard<std::mutex> g(mu_);
  free_.push_back({p, capacity});
  if (free_.size() > kKeep) {  // drop the smallest: the large ones are the expensive ones to fault in
    auto smallest = std::min_element(free_.begin(), free_.end(),
                                     [](const Block& a, const Block& b) { return a.capacity < b.capacity; });
    std::free(smallest->p);
    free_.erase(smallest);
  }
}

void ScratchPool::release_all() {
  std::lock_guard<std::mutex> g(mu_);
  for (Block& b : free_) std::free(b.p);
  free_.clear();
}

size_t ScratchPool::pooled_bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  size_t total = 0;
  for (const Block& b : free_) total += b.capacity * sizeof(float);
  return total;
}

}  // namespace tr::cpu
