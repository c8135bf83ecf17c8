// An allocator's allocations as a text trace (one line per event: "a <id> <bytes>", "f <id>", "e" for an
// empty_cache), and its replay through the CUDA caching allocator's model. A GPU run writes one
// (TRAINER_ALLOCATOR_TRACE=<file> on `trainer train`), and so does `trainer estimate`'s dry run for the same
// flags (the same variable): replaying both, and comparing them event by event, shows where a GPU's reserved
// memory departs from the estimate's model, from one device run.
#pragma once
#include <cstdint>
#include <cstdio>
#include <istream>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/allocator.h"

namespace tr {

class AllocationTrace final : public AllocationObserver {
 public:
  // Writes to `path` (truncated); `next`, when given, sees every event too (the estimate's model). Stops
  // writing after `max_events` (a few steps of a model fit; the rest would only repeat them). Throws when the
  // file cannot be opened.
  explicit AllocationTrace(const std::string& path, AllocationObserver* next = nullptr,
                           int64_t max_events = 2'000'000);
  ~AllocationTrace() override;
  AllocationTrace(const AllocationTrace&) = delete;
  AllocationTrace& operator=(const AllocationTrace&) = delete;
  void allocated(const void* block, size_t nbytes) override;
  void freed(const void* block) override;
  void cache_emptied() override;
  int64_t events() const;
  // The trace TRAINER_ALLOCATOR_TRACE names, with `suffix` appended (".rank1": each process of a group writes
  // its own), forwarding to `next`; nullptr when the variable is unset or empty. The caller observes an
  // allocator with it.
  static std::unique_ptr<AllocationTrace> from_environment(AllocationObserver* next = nullptr,
                                                           const std::string& suffix = "");

 private:
  mutable std::mutex mu_;
  std::FILE* f_ = nullptr;
  std::string path_;
  AllocationObserver* next_;
  int64_t max_events_, events_ = 0, next_id_ = 0;
  std::unordered_map<const void*, int64_t> ids_;
};

// A trace replayed through CachingAllocatorModel: the bytes requested at the peak (what the allocator's
// statistics measure) and the caching allocator's reserved peak. Throws naming the file and line of a
// malformed event.
struct TraceReplay {
  int64_t events = 0, allocations = 0;
  int64_t peak_bytes = 0, peak_reserved_bytes = 0;
};
TraceReplay replay_allocation_trace(const std::string& path);
// The same for a trace read from `in`, named `name` in messages.
TraceReplay replay_allocation_trace(std::istream& in, const std::string& name);

}  // namespace tr
