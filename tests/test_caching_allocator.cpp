// The caching allocator's pool logic on a fake device (host memory, scripted events, a byte budget): size
// classes, best-fit reuse, splitting and merging, stream-aware reuse, empty_cache, the memory-fraction cap
// and the out-of-memory retry and message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/allocation_trace.h"
#include "core/caching_allocator.h"
#include "core/error.h"

namespace tr {
namespace {

struct FakeDevice {
  size_t capacity = size_t{64} << 20, used = 0;
  std::map<void*, size_t> segments;
  std::map<uint64_t, bool> events;  // id -> done
  uint64_t next_event = 1;
  CachingAllocatorCore::Backend backend() {
    CachingAllocatorCore::Backend b;
    b.alloc_segment = [this](size_t n) -> void* {
      if (used + n > capacity) return nullptr;
      void* p = std::aligned_alloc(512, n);
      segments[p] = n;
      used += n;
      return p;
    };
    b.free_segment = [this](void* p, size_t n) {
      EXPECT_EQ(segments.at(p), n);
      segments.erase(p);
      used -= n;
      std::free(p);
    };
    b.record_event = [this](uint64_t) {
      events[next_event] = false;
      return next_event++;
    };
    b.event_done = [this](uint64_t e) { return events.at(e); };
    b.release_event = [this](uint64_t e) { events.erase(e); };
    b.device_summary = [this] { return "fake (" + std::to_string(capacity >> 20) + " MiB)"; };
    b.total_memory = capacity;
    return b;
  }
};

TEST(CachingAllocator, SizeClassesSplittingAndReuse) {
  FakeDevice dev;
  {
    CachingAllocatorCore a(dev.backend());
    void* p1 = a.allocate(1000);  // small pool: one 2 MiB segment, split
    EXPECT_EQ(a.block_size(p1), 1024u);
    void* p2 = a.allocate(3000);
    EXPECT_EQ(static_cast<char*>(p2), static_cast<char*>(p1) + 1024);  // carved from the same segment
    EXPECT_EQ(a.stats().num_segments, 1);
    EXPECT_EQ(a.stats().reserved_bytes, 2 << 20);
    void* big = a.allocate(size_t{3} << 20);  // large pool: a 20 MiB segment
    EXPECT_EQ(a.stats().reserved_bytes, (2 << 20) + (20 << 20));
    void* mid = a.allocate((size_t{11} << 20) + 1);  // best fit: the 17 MiB left of the large segment
    EXPECT_EQ(static_cast<char*>(mid), static_cast<char*>(big) + (3 << 20));
    void* huge = a.allocate(size_t{25} << 20);  // above 10 MiB, no room: a segment rounded to 2 MiB
    EXPECT_EQ(a.stats().reserved_bytes, (2 << 20) + (20 << 20) + (26 << 20));
    a.free(p1);
    void* p3 = a.allocate(900);  // best fit: p1's block again
    EXPECT_EQ(p3, p1);
    a.free(big);
    void* big2 = a.allocate(size_t{2} << 20);  // reuses the large segment without a new one
    EXPECT_EQ(big2, big);
    EXPECT_EQ(a.stats().num_segment_allocs, 3);
    for (void* p : {p2, p3, big2, mid, huge}) a.free(p);
    EXPECT_EQ(a.stats().allocated_bytes, 0);
    EXPECT_EQ(a.stats().reserved_bytes, (2 << 20) + (20 << 20) + (26 << 20));  // cached
    EXPECT_GT(a.stats().num_merges, 0);
    a.empty_cache();  // merged back into whole segments, all returned
    EXPECT_EQ(a.stats().reserved_bytes, 0);
    EXPECT_EQ(dev.used, 0u);
  }
  EXPECT_TRUE(dev.segments.empty());
}

TEST(CachingAllocator, BlocksUsedOnAnotherStreamWaitForItsEvent) {
  FakeDevice dev;
  CachingAllocatorCore a(dev.backend());
  void* p = a.allocate(4096, /*stream=*/0);
  a.record_stream(p, 7);  // e.g. written by the copy stream
  a.free(p);
  void* q = a.allocate(4096, 0);
  EXPECT_NE(q, p);  // the copy stream may still use p
  for (auto& [e, done] : dev.events) done = true;
  a.free(q);
  void* r = a.allocate(4096, 0);
  EXPECT_EQ(r, p);                // the event passed: reused (merged back with its neighbours first)
  void* s = a.allocate(4096, 3);  // another stream's pool: a segment of its own
  EXPECT_EQ(a.stats().num_segments, 2);
  a.free(r);
  a.free(s);
}

TEST(CachingAllocator, FullDeviceFlushesTheCacheThenReportsTheBreakdown) {
  FakeDevice dev;
  dev.capacity = size_t{48} << 20;
  CachingAllocatorCore a(dev.backend());
  void* x = a.allocate(size_t{30} << 20);
  a.free(x);                               // 30 MiB cached
  void* y = a.allocate(size_t{40} << 20);  // does not fit next to the cache: flushed, then served
  EXPECT_EQ(a.stats().num_cache_flushes, 1);
  EXPECT_EQ(a.stats().reserved_bytes, 40 << 20);
  try {
    a.allocate(size_t{16} << 20);
    ADD_FAILURE() << "no out-of-memory error";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tried to allocate 16.00 MiB; 40.00 MiB allocated, 40.00 MiB reserved"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("fake (48 MiB)"), std::string::npos) << m;
  }
  EXPECT_EQ(a.stats().num_ooms, 1);
  a.free(y);
  a.set_memory_fraction(0.5);  // cap: 24 MiB reserved
  a.empty_cache();
  void* z = a.allocate(size_t{20} << 20);
  EXPECT_THROW(a.allocate(size_t{5} << 20), OutOfMemoryError);  // another 20 MiB segment passes the cap
  a.free(z);
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// The model `trainer estimate --device cuda` uses: an allocator's blocks replayed, by address, into the same
// pool logic on a device that holds no memory - the meta device's blocks get distinct addresses while
// observed, frees of blocks it never saw are ignored, and empty_cache reaches it.
TEST(CachingAllocatorModel, ReplaysAnObservedAllocatorAsTheCoreWould) {
  FakeDevice dev;
  CachingAllocatorCore core(dev.backend());
  CachingAllocatorModel model;
  MetaAllocator& meta = meta_allocator();
  void* before = meta.allocate(4096);  // not observed: no address, unknown to the model
  EXPECT_EQ(before, nullptr);
  {
    const ObserveAllocations observe(meta, model);
    EXPECT_THROW(ObserveAllocations(meta, model), Error);  // one observer at a time
    const size_t sizes[] = {1000, 3000, size_t{3} << 20, (size_t{11} << 20) + 1, size_t{25} << 20};
    std::vector<void*> m, c;
    for (size_t n : sizes) {
      m.push_back(meta.allocate(n));
      c.push_back(core.allocate(n));
    }
    EXPECT_EQ(std::set<void*>(m.begin(), m.end()).size(), m.size());
    EXPECT_EQ(model.stats().reserved_bytes, core.stats().reserved_bytes);
    meta.deallocate(m[0], sizes[0]);
    core.free(c[0]);
    meta.deallocate(before, 4096);
    m[0] = meta.allocate(900);
    c[0] = core.allocate(900);
    for (size_t i = 0; i < m.size(); ++i) {
      meta.deallocate(m[i], i == 0 ? 900 : sizes[i]);
      core.free(c[i]);
    }
    EXPECT_EQ(model.stats().allocated_bytes, 0);
    EXPECT_EQ(model.stats().peak_reserved_bytes, core.stats().peak_reserved_bytes);
    EXPECT_EQ(model.stats().num_splits, core.stats().num_splits);
    meta.empty_cache();
    EXPECT_EQ(model.stats().reserved_bytes, 0);
  }
  EXPECT_EQ(meta.allocate(64), nullptr);  // the scope ended
  meta.deallocate(nullptr, 64);
}

// A trace read back: the requested peak and the reserved peak of the pools (a 1 MiB block fills half a 2 MiB
// small segment; a 3 MiB one opens a 20 MiB segment, and after 'e' the next opens another).
TEST(AllocationTraceReplay, ReplaysATextTraceThroughThePools) {
  std::istringstream in("a 0 1048576\na 1 3145728\nf 1\ne\na 2 3145728\n\nf 0\nf 2\n");
  const TraceReplay r = replay_allocation_trace(in, "t");
  EXPECT_EQ(r.events, 7);
  EXPECT_EQ(r.allocations, 3);
  EXPECT_EQ(r.peak_bytes, 4 << 20);
  EXPECT_EQ(r.peak_reserved_bytes, 22 << 20);
}

// Each malformed trace is refused with its line named - also a trace that stops while blocks are live, whose
// model must not leak them (fuzz/regressions/allocation_trace).
TEST(AllocationTraceReplay, RefusesMalformedTracesNamingTheLine) {
  const std::pair<std::string, std::string> bad[] = {
      {"a 0 64\na 1 40", "t: line 2 is cut off"},
      {"a 0 64\na 0 64\n", "t line 2: expected"},     // an id still live
      {"a 0 1099511627777\n", "t line 1: expected"},  // past 1 TiB
      {"a 0 64 7\n", "t line 1: expected"},           // trailing fields
      {"a 0 64\nf 0\nf 0\n", "t line 3: expected"},   // freed twice
      {"a 0 -64\n", "t line 1: expected"},
      {"e 1\n", "t line 1: expected"},
  };
  for (const auto& [text, message] : bad) {
    std::istringstream in(text);
    try {
      replay_allocation_trace(in, "t");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tr
