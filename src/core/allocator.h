// Allocator interface with byte accounting, the 64-byte-aligned CPU allocator and the meta allocator
// (which hands out no memory but counts as if it did, so a dry run reports the real run's peak).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "core/device.h"

namespace tr {

struct AllocatorStats {
  int64_t current_bytes = 0;      // bytes held by live allocations
  int64_t peak_bytes = 0;         // max of current_bytes since the last reset_peak()
  int64_t window_peak_bytes = 0;  // max of current_bytes since the last begin_window()
  int64_t num_allocs = 0;         // allocations served since creation
};

// Sees every allocation and free of an allocator by block address (unique while the block lives; the meta
// allocator hands out distinct addresses while it is observed), and each empty_cache(): the CUDA caching
// allocator's model (caching_allocator.h) replays them.
class AllocationObserver {
 public:
  virtual ~AllocationObserver() = default;
  virtual void allocated(const void* block, size_t nbytes) = 0;
  virtual void freed(const void* block) = 0;
  virtual void cache_emptied() = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;
  // Returns cached memory to the system (caching allocators); a no-op for the others.
  virtual void empty_cache() {}

  // Fills new allocations with 0xFF bytes (NaN in every float format) so a kernel that leaves part of its
  // output unwritten is caught by tests. Off by default.
  void set_poison(bool on) { poison_ = on; }
  bool poison() const { return poison_; }

  AllocatorStats stats() const;
  // Restarts peak tracking from the current usage.
  void reset_peak();
  // A second peak over a stretch of the caller's choosing (a checkpoint save), leaving peak_bytes alone:
  // window_peak_bytes restarts from the current usage.
  void begin_window();
  // Caps the bytes in use (0: no cap, the default), like torch's per-process memory fraction: an allocation
  // beyond it throws OutOfMemoryError with the breakdown. auto_find_batch_size and its tests use it.
  void set_limit(int64_t bytes);
  int64_t limit() const;
  // Bytes this device can hold at most, where known (a GPU's memory, under its memory fraction); 0 for the
  // host and meta devices. auto_find_batch_size sizes its first batch from limit() or this.
  virtual int64_t capacity() const { return 0; }
  // Peak bytes reserved from the device (caching allocators: their segments) since the start or the last
  // reset_peak_reserved(); 0 otherwise.
  virtual int64_t peak_reserved_bytes() const { return 0; }
  virtual void reset_peak_reserved() {}
  // One observer at a time (nullptr: none); see ObserveAllocations.
  void set_observer(AllocationObserver* observer);
  bool observed() const;

 protected:
  // Throws OutOfMemoryError when `nbytes` more would pass the cap.
  void check_limit(size_t nbytes) const;
  void record_alloc(size_t nbytes);
  void record_free(size_t nbytes);
  // Tell the observer, if any.
  void notify_alloc(const void* block, size_t nbytes);
  void notify_free(const void* block);
  void notify_empty_cache();

 private:
  mutable std::mutex mu_;
  AllocatorStats stats_;
  AllocationObserver* observer_ = nullptr;
  std::atomic<bool> observed_{false};  // observer_ != nullptr, read without the lock
  int64_t limit_ = 0;
  std::atomic<bool> poison_{false};
};

// Host memory, 64-byte aligned. Blocks of 1 MiB and more are 2 MiB-aligned, backed by transparent huge pages
// where the kernel offers them, and kept in a cache when freed (up to a byte limit) so a training step reuses
// the previous step's buffers instead of faulting in fresh pages. Statistics count requested bytes only, so
// they equal the meta device's numbers for the same program.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kLargeBlock = size_t{1} << 20;
  // Host partitions: cpu:1 .. cpu:7 are the host's memory under accounts of their own, devices as distinct
  // as two GPUs to every same-device check, so a model split across devices (device_map) runs and is
  // measured on a machine without GPUs.
  static constexpr int kHostPartitions = 8;
  explicit CpuAllocator(int index = 0) : index_(index) {}
  ~CpuAllocator() override;
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return {DeviceType::cpu, index_}; }
  void empty_cache() override;
  // Most bytes kept in the cache of freed large blocks (default 4 GiB); 0 disables caching.
  void set_cache_limit(size_t bytes);
  size_t cached_bytes() const;

 private:
  mutable std::mutex cache_mu_;
  std::multimap<size_t, void*> cache_;  // block size -> block
  size_t cached_ = 0;
  size_t cache_limit_ = size_t{4} << 30;
  int index_ = 0;
};

class MetaAllocator final : public Allocator {
 public:
  // meta:1 .. meta:63 stand for the devices of a split in a dry run (`trainer estimate --device_map auto`),
  // each counted apart as the devices they stand for are.
  static constexpr int kDevices = 64;
  explicit MetaAllocator(int index = 0) : index_(index) {}
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::meta(index_); }
  void empty_cache() override { notify_empty_cache(); }

 private:
  std::atomic<uintptr_t> next_key_{0};  // distinct block addresses while observed (never dereferenced)
  int index_ = 0;
};

// `observer` sees `alloc`'s allocations for the scope's lifetime; throws when another observer is attached.
class ObserveAllocations {
 public:
  ObserveAllocations(Allocator& alloc, AllocationObserver& observer);
  ~ObserveAllocations();
  ObserveAllocations(const ObserveAllocations&) = delete;
  ObserveAllocations& operator=(const ObserveAllocations&) = delete;

 private:
  Allocator& alloc_;
};

// Process-wide allocators of the host and meta devices (like PyTorch's, they are the memory of the process,
// not hidden state: their numbers are exactly what stats() reports).
// The host's allocator; index > 0: host partition cpu:index (see CpuAllocator).
CpuAllocator& cpu_allocator(int index = 0);
// The meta device's allocator; index > 0: meta:index's (see MetaAllocator).
MetaAllocator& meta_allocator(int index = 0);

}  // namespace tr
