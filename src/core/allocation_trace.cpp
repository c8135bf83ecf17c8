// Allocation traces and their replay (allocation_trace.h).
#include "core/allocation_trace.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
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

TraceReplay replay_allocation_trace(const std::string& path) {
  std::error_code ec;
  TR_CHECK(!std::filesystem::is_directory(path, ec),
           "allocation trace: {} is a folder; give the trace file TRAINER_ALLOCATOR_TRACE named", path);
  std::ifstream in(path);
  TR_CHECK(in.good(), "allocation trace: cannot read {}", path);
  return replay_allocation_trace(in, path);
}

TraceReplay replay_allocation_trace(std::istream& in, const std::string& name) {
  // One allocation above 1 TiB is no device's; the sum bounds the model's address space (each allocation
  // may open a segment up to 20 MiB larger than itself), so no count can overflow.
  constexpr int64_t kMaxBytes = int64_t{1} << 40, kMaxTotal = int64_t{1} << 62;
  CachingAllocatorModel model;
  TraceReplay r;
  std::unordered_map<int64_t, int64_t> live;  // id -> bytes
  int64_t current = 0, total = 0, line_no = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++line_no;
    // getline stops at the end of the text without a newline only on a last line the writer never finished
    // (it died before closing the file); that line could read as an event with the wrong size.
    TR_CHECK(!in.eof(),
             "allocation trace {}: line {} is cut off (the traced process stopped before closing it)", name,
             line_no);
    if (line.empty()) continue;
    std::istringstream ls(line);
    char kind = 0;
    int64_t id = -1, bytes = -1;
    std::string rest;
    ls >> kind;
    const auto key = [](int64_t i) { return reinterpret_cast<const void*>(static_cast<uintptr_t>(i) + 1); };
    if (kind == 'a' && (ls >> id >> bytes) && !(ls >> rest) && id >= 0 && bytes > 0 && bytes <= kMaxBytes &&
        !live.count(id)) {
      total += bytes + static_cast<int64_t>(CachingAllocatorCore::kLargeSegment);
      TR_CHECK(total <= kMaxTotal, "allocation trace {} line {}: more than 2^62 bytes allocated in all", name,
               line_no);
      model.allocated(key(id), static_cast<size_t>(bytes));
      live[id] = bytes;
      current += bytes;
      r.peak_bytes = std::max(r.peak_bytes, current);
      ++r.allocations;
    } else if (kind == 'f' && (ls >> id) && !(ls >> rest) && live.count(id)) {
      model.freed(key(id));
      current -= live[id];
      live.erase(id);
    } else if (kind == 'e' && !(ls >> rest)) {
      model.cache_emptied();
    } else {
      fail(
          "allocation trace {} line {}: expected 'a <id> <bytes>' (a new id, 1 byte to 1 TiB), 'f <id>' (a "
          "live "
          "one) or 'e', got '{}'",
          name, line_no, line.substr(0, 80));
    }
    ++r.events;
  }
  r.peak_reserved_bytes = model.stats().peak_reserved_bytes;
  return r;
}

}  // namespace tr
