// Block pools, splitting, merging, stream events and the out-of-memory path; see caching_allocator.h.
#include "core/caching_allocator.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace tr {

namespace {
double mib(int64_t b) { return static_cast<double>(b) / 1048576.0; }
}  // namespace

CachingAllocatorCore::CachingAllocatorCore(Backend backend) : backend_(std::move(backend)) {}

CachingAllocatorCore::~CachingAllocatorCore() {
  // Segments still holding live blocks are left to the driver's teardown (their memory may still be read);
  // free ones go back now. The bookkeeping of every block is ours to delete either way.
  std::lock_guard<std::mutex> g(mu_);
  release_free_segments();
  for (Block* first : segments_)
    for (Block* b = first; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
}

size_t CachingAllocatorCore::round_size(size_t n) {
  return std::max(kRound, (n + kRound - 1) / kRound * kRound);
}

size_t CachingAllocatorCore::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded <= kMidSize) return kLargeSegment;
  return (rounded + kSegmentRound - 1) / kSegmentRound * kSegmentRound;
}

CachingAllocatorCore::Block* CachingAllocatorCore::find_free(Pool& pool, size_t size, Stream stream) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

CachingAllocatorCore::Block* CachingAllocatorCore::new_segment(size_t size, Stream stream, bool small) {
  void* p = backend_.alloc_segment(size);
  if (!p) return nullptr;
  auto* b = new Block;
  b->size = size;
  b->ptr = p;
  b->stream = stream;
  b->small = small;
  segments_.insert(b);
  stats_.reserved_bytes += static_cast<int64_t>(size);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  ++stats_.num_segments;
  ++stats_.num_segment_allocs;
  return b;
}

void CachingAllocatorCore::release_free_segments() {
  for (auto it = segments_.begin(); it != segments_.end();) {
    Block* b = *it;
    if (b->allocated || b->pending_events > 0 || b->next) {  // in use, or split into live pieces
      ++it;
      continue;
    }
    (b->small ? small_ : large_).erase(b);
    backend_.free_segment(b->ptr, b->size);
    stats_.reserved_bytes -= static_cast<int64_t>(b->size);
    --stats_.num_segments;
    ++stats_.num_segment_frees;
    delete b;
    it = segments_.erase(it);
  }
}

void* CachingAllocatorCore::allocate(size_t nbytes, Stream stream) {
  if (nbytes == 0) return nullptr;
  std::lock_guard<std::mutex> g(mu_);
  process_events();
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallSize;
  Pool& pool = small ? small_ : large_;
  Block* b = find_free(pool, size, stream);
  if (!b) {
    const size_t seg = segment_size(size);
    auto fits_cap = [&] { return limit_ == 0 || static_cast<size_t>(stats_.reserved_bytes) + seg <= limit_; };
    if (fits_cap()) b = new_segment(seg, stream, small);
    if (!b) {  // device full or cap reached: give back what is cached and try once more
      ++stats_.num_cache_flushes;
      release_free_segments();
      if (fits_cap()) b = new_segment(seg, stream, small);
    }
    if (!b) out_of_memory(nbytes);
  }
  const size_t rest = b->size - size;
  if (small ? rest >= kRound : rest > kSmallSize) {
    auto* r = new Block;
    r->size = rest;
    r->ptr = static_cast<char*>(b->ptr) + size;
    r->stream = stream;
    r->small = small;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    pool.insert(r);
    ++stats_.num_splits;
  }
  b->allocated = true;
  b->requested = nbytes;
  active_[b->ptr] = b;
  stats_.allocated_bytes += static_cast<int64_t>(b->size);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.requested_bytes += static_cast<int64_t>(nbytes);
  ++stats_.num_allocs;
  return b->ptr;
}

void CachingAllocatorCore::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> g(mu_);
  auto it = active_.find(ptr);
  TR_CHECK(it != active_.end(), "caching allocator: free of an unknown pointer");
  Block* b = it->second;
  active_.erase(it);
  stats_.allocated_bytes -= static_cast<int64_t>(b->size);
  stats_.requested_bytes -= static_cast<int64_t>(b->requested);
  if (!b->used_on.empty()) {  // other streams may still read or write it: reuse after their events
    for (Stream s : b->used_on) {
      events_.emplace_back(backend_.record_event(s), b);
      ++b->pending_events;
    }
    b->used_on.clear();
    return;
  }
  free_block(b);
}

void CachingAllocatorCore::record_stream(void* ptr, Stream stream) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = active_.find(ptr);
  TR_CHECK(it != active_.end(), "caching allocator: record_stream of an unknown pointer");
  Block* b = it->second;
  if (stream == b->stream) return;
  if (std::find(b->used_on.begin(), b->used_on.end(), stream) == b->used_on.end())
    b->used_on.push_back(stream);
}

void CachingAllocatorCore::free_block(Block* b) {
  b->allocated = false;
  Pool& pool = b->small ? small_ : large_;
  auto mergeable = [](Block* n) { return n && !n->allocated && n->pending_events == 0; };
  if (mergeable(b->prev)) {  // b folds into its predecessor
    Block* p = b->prev;
    pool.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
    ++stats_.num_merges;
  }
  if (mergeable(b->next)) {  // the successor folds into b
    Block* n = b->next;
    pool.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
    ++stats_.num_merges;
  }
  pool.insert(b);
}

void CachingAllocatorCore::process_events() {
  if (events_.empty()) return;
  std::vector<std::pair<Event, Block*>> waiting;
  for (auto& [e, b] : events_) {
    if (!backend_.event_done(e)) {
      waiting.emplace_back(e, b);
      continue;
    }
    backend_.release_event(e);
    if (--b->pending_events == 0) free_block(b);
  }
  events_.swap(waiting);
}

void CachingAllocatorCore::empty_cache() {
  std::lock_guard<std::mutex> g(mu_);
  process_events();
  release_free_segments();
}

size_t CachingAllocatorCore::capacity() const { return limit_ ? limit_ : backend_.total_memory; }

void CachingAllocatorCore::set_memory_fraction(double fraction) {
  TR_CHECK(fraction > 0 && fraction <= 1, "memory fraction must be in (0, 1], got {}", fraction);
  std::lock_guard<std::mutex> g(mu_);
  limit_ = fraction >= 1 ? 0 : static_cast<size_t>(fraction * static_cast<double>(backend_.total_memory));
}

void CachingAllocatorCore::out_of_memory(size_t nbytes) {
  ++stats_.num_ooms;
  throw OutOfMemoryError(fmt::format(
      "out of memory: tried to allocate {:.2f} MiB; {:.2f} MiB allocated, {:.2f} MiB reserved by this "
      "process ({:.2f} MiB cached in free blocks){}; device: {}",
      mib(static_cast<int64_t>(nbytes)), mib(stats_.allocated_bytes), mib(stats_.reserved_bytes),
      mib(stats_.reserved_bytes - stats_.allocated_bytes),
      limit_ ? fmt::format(", cap {:.2f} MiB (memory fraction)", mib(static_cast<int64_t>(limit_))) : "",
      backend_.device_summary ? backend_.device_summary() : "unknown"));
}

CachingAllocatorStats CachingAllocatorCore::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

void CachingAllocatorCore::reset_peak() {
  std::lock_guard<std::mutex> g(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

size_t CachingAllocatorCore::block_size(void* ptr) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = active_.find(ptr);
  return it == active_.end() ? 0 : it->second->size;
}

std::string CachingAllocatorCore::summary() const {
  const auto s = stats();
  return fmt::format("allocated {:.1f} MiB (peak {:.1f}), reserved {:.1f} MiB (peak {:.1f}) in {} segments",
                     mib(s.allocated_bytes), mib(s.peak_allocated_bytes), mib(s.reserved_bytes),
                     mib(s.peak_reserved_bytes), s.num_segments);
}

CachingAllocatorModel::CachingAllocatorModel()
    : core_([this] {
        CachingAllocatorCore::Backend b;
        b.alloc_segment = [this](size_t n) -> void* {  // under core_'s lock: one caller at a time
          void* p = reinterpret_cast<void*>(next_segment_);
          next_segment_ += (n + CachingAllocatorCore::kSegmentRound - 1) /
                           CachingAllocatorCore::kSegmentRound * CachingAllocatorCore::kSegmentRound;
          return p;
        };
        b.free_segment = [](void*, size_t) {};
        b.record_event = [](uint64_t) { return uint64_t{0}; };
        b.event_done = [](uint64_t) { return true; };
        b.release_event = [](uint64_t) {};
        b.device_summary = [] { return std::string("the modelled device"); };
        return b;
      }()) {}

void CachingAllocatorModel::allocated(const void* block, size_t nbytes) {
  std::lock_guard<std::mutex> g(mu_);
  if (nbytes == 0 || block == nullptr) return;
  blocks_[block] = core_.allocate(nbytes, 0);
}

void CachingAllocatorModel::freed(const void* block) {
  std::lock_guard<std::mutex> g(mu_);
  const auto it = blocks_.find(block);
  if (it == blocks_.end()) return;
  core_.free(it->second);
  blocks_.erase(it);
}

void CachingAllocatorModel::cache_emptied() {
  std::lock_guard<std::mutex> g(mu_);
  core_.empty_cache();
}

}  // namespace tr
