// Allocation traces and their replay (allocation_trace.h).
#include "core/allocation_trace.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/caching_allocator.h"
#include "core/error.h"

namespace tr {

AllocationTrace::AllocationTrace(const std::string& path, AllocationObserver* next, int64_t max_events)
    : path_(path), next_(next), max_events_(max_events) {
  f_ = std::fopen(path.c_str(), "w");
  TR_CHECK(f_ != nullptr, "allocation trace: cannot write {} (TRAINER_ALLOCATOR_TRACE)", path);
}

AllocationTrace::~AllocationTrace() {
  if (f_) std::fclose(f_);
}

void AllocationTrace::allocated(const void* block, size_t nbytes) {
  if (next_) next_->allocated(block, nbytes);
  std::lock_guard<std::mutex> g(mu_);
  if (block == nullptr || nbytes == 0 || events_ >= max_events_) return;
  const int64_t id = next_id_++;
  ids_[block] = id;
  ++events_;
  std::fprintf(f_, "a %lld %zu\n", static_cast<long long>(id), nbytes);
}

void AllocationTrace::freed(const void* block) {
  if (next_) next_->freed(block);
  std::lock_guard<std::mutex> g(mu_);
  const auto it = ids_.find(block);
  if (it == ids_.end()) return;  // allocated before the trace, or past its cap
  std::fprintf(f_, "f %lld\n", static_cast<long long>(it->second));
  ids_.erase(it);
  ++events_;
}

void AllocationTrace::cache_emptied() {
  if (next_) next_->cache_emptied();
  std::lock_guard<std::mutex> g(mu_);
  if (events_ >= max_events_) return;
  std::fputs("e\n", f_);
  ++events_;
}

int64_t AllocationTrace::events() const {
  std::lock_guard<std::mutex> g(mu_);
  return events_;
}

std::unique_ptr<AllocationTrace> AllocationTrace::from_environment(AllocationObserver* next,
                                                                   const std::string& suffix) {
  const char* path = std::getenv("TRAINER_ALLOCATOR_TRACE");
  if (path == nullptr || *path == '\0') return nullptr;
  return std::make_unique<AllocationTrace>(path + suffix, next);
}

namespace {

// Whether the file ends with a newline: a trace whose writer died before closing it stops mid-line, and that
// last line could read as an event with the wrong size.
bool ends_with_newline(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in || in.tellg() <= 0) return true;  // empty: nothing cut
  in.seekg(-1, std::ios::end);
  return in.get() == '\n';
}

}  // namespace

TraceReplay replay_allocation_trace(const std::string& path) {
  std::ifstream in(path);
  TR_CHECK(in.good(), "allocation trace: cannot read {}", path);
  TR_CHECK(ends_with_newline(path),
           "allocation trace {}: the last line is cut off (the traced process stopped before closing it)",
           path);
  CachingAllocatorModel model;
  TraceReplay r;
  std::unordered_map<int64_t, int64_t> live;  // id -> bytes
  int64_t current = 0, line_no = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    std::istringstream ls(line);
    char kind = 0;
    int64_t id = -1, bytes = -1;
    ls >> kind;
    const auto key = [](int64_t i) { return reinterpret_cast<const void*>(static_cast<uintptr_t>(i) + 1); };
    if (kind == 'a' && (ls >> id >> bytes) && id >= 0 && bytes > 0 && !live.count(id)) {
      model.allocated(key(id), static_cast<size_t>(bytes));
      live[id] = bytes;
      current += bytes;
      r.peak_bytes = std::max(r.peak_bytes, current);
      ++r.allocations;
    } else if (kind == 'f' && (ls >> id) && live.count(id)) {
      model.freed(key(id));
      current -= live[id];
      live.erase(id);
    } else if (kind == 'e') {
      model.cache_emptied();
    } else {
      fail(
          "allocation trace {} line {}: expected 'a <id> <bytes>' (a new id), 'f <id>' (a live one) or 'e', "
          "got '{}'",
          path, line_no, line);
    }
    ++r.events;
  }
  r.peak_reserved_bytes = model.stats().peak_reserved_bytes;
  return r;
}

}  // namespace tr
