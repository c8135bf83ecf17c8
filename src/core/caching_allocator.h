// The block-caching logic of a device allocator in the style of PyTorch's CUDA caching allocator, written
// against an abstract backend (raw segment alloc/free, stream events) so it runs and is tested on the CPU:
// requests rounded to 512 bytes; a small pool (<= 1 MiB, 2 MiB segments) and a large pool (20 MiB segments
// for requests up to 10 MiB, else rounded to 2 MiB); best-fit reuse among free blocks of the same stream;
// splitting of larger blocks and merging of free neighbours; blocks used on other streams are reused only
// after their events complete; a memory-fraction cap; when the device is full, cached segments are released
// and the request retried before an out-of-memory error with the breakdown.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"

namespace tr {

struct CachingAllocatorStats {
  int64_t allocated_bytes = 0, reserved_bytes = 0;  // in blocks handed out / in segments held
  int64_t peak_allocated_bytes = 0, peak_reserved_bytes = 0;
  int64_t requested_bytes = 0;  // what callers asked for (before rounding)
  int64_t num_allocs = 0, num_segments = 0, num_segment_allocs = 0, num_segment_frees = 0;
  int64_t num_ooms = 0, num_cache_flushes = 0, num_splits = 0, num_merges = 0;
};

class CachingAllocatorCore {
 public:
  using Stream = uint64_t;
  using Event = uint64_t;
  struct Backend {
    std::function<void*(size_t)> alloc_segment;  // nullptr when the device has no room
    std::function<void(void*, size_t)> free_segment;
    std::function<Event(Stream)> record_event;  // marks the stream's current position
    std::function<bool(Event)> event_done;      // has the stream passed it?
    std::function<void(Event)> release_event;
    std::function<std::string()> device_summary;  // e.g. "cuda:0 (139.8 GiB total, 2.1 GiB free)"
    size_t total_memory = 0;                      // for the memory fraction
  };

  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallSize = size_t{1} << 20;  // requests up to this use the small pool
  static constexpr size_t kSmallSegment = size_t{2} << 20;
  static constexpr size_t kMidSize = size_t{10} << 20;  // up to this: one 20 MiB segment
  static constexpr size_t kLargeSegment = size_t{20} << 20;
  static constexpr size_t kSegmentRound = size_t{2} << 20;

  explicit CachingAllocatorCore(Backend backend);
  ~CachingAllocatorCore();
  CachingAllocatorCore(const CachingAllocatorCore&) = delete;
  CachingAllocatorCore& operator=(const CachingAllocatorCore&) = delete;

  // A block of at least nbytes for use on `stream`; throws OutOfMemoryError with the breakdown.
  void* allocate(size_t nbytes, Stream stream = 0);
  // Returns the block to its pool (after the events of other streams that used it complete).
  void free(void* ptr);
  // The block is also used on `stream`: its memory is not reused until that stream passes this point.
  void record_stream(void* ptr, Stream stream);
  // Releases every segment with no block in use (torch.cuda.empty_cache()).
  void empty_cache();
  // Caps reserved memory at fraction x total_memory (0 < fraction <= 1; 1: no cap beyond the device).
  void set_memory_fraction(double fraction);
  // What reserved memory may grow to: the memory-fraction cap, else the device's memory.
  size_t capacity() const;
  CachingAllocatorStats stats() const;
  void reset_peak();
  // Size of the block behind ptr (rounded), for accounting.
  size_t block_size(void* ptr) const;
  std::string summary() const;

 private:
  struct Block {
    size_t size = 0;
    void* ptr = nullptr;
    Stream stream = 0;
    bool allocated = false;
    bool small = false;
    size_t requested = 0;
    Block *prev = nullptr, *next = nullptr;  // neighbours within the segment
    std::vector<Stream> used_on;             // other streams (record_stream)
    int pending_events = 0;
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->ptr < b->ptr;
    }
  };
  using Pool = std::set<Block*, BlockLess>;

  static size_t round_size(size_t n);
  static size_t segment_size(size_t rounded);
  Block* find_free(Pool& pool, size_t size, Stream stream);
  Block* new_segment(size_t size, Stream stream, bool small);
  void release_free_segments();
  void free_block(Block* b);  // into its pool, merging neighbours
  void process_events();
  [[noreturn]] void out_of_memory(size_t nbytes);

  Backend backend_;
  mutable std::mutex mu_;
  Pool small_, large_;
  std::unordered_map<void*, Block*> active_;
  std::vector<std::pair<Event, Block*>> events_;
  std::set<Block*> segments_;  // first block of each segment
  size_t limit_ = 0;           // 0: no cap
  CachingAllocatorStats stats_;
};

// What the CUDA caching allocator would reserve for another allocator's allocations: a CachingAllocatorCore
// over a modelled device whose segments are address ranges only (nothing is allocated), fed by an
// AllocationObserver - the meta device of `trainer estimate --device cuda`, or a CPU run in the tests. One
// stream, as the CUDA backend's kernels use; empty_cache() releases the free segments as on the device.
class CachingAllocatorModel final : public AllocationObserver {
 public:
  CachingAllocatorModel();
  void allocated(const void* block, size_t nbytes) override;
  void freed(const void* block) override;  // blocks it never saw are ignored
  void cache_emptied() override;
  CachingAllocatorStats stats() const { return core_.stats(); }

 private:
  std::mutex mu_;
  uintptr_t next_segment_ = uintptr_t{1} << 44;  // the modelled address space
  std::unordered_map<const void*, void*> blocks_;
  CachingAllocatorCore core_;  // last: its backend uses next_segment_
};

}  // namespace tr
