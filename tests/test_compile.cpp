// torch_compile's pieces: the static memory plan; when a replay's device graph is captured, launched,
// captured again and given up.
#include <gtest/gtest.h>

#include <random>

#include "compile/device_graph.h"
#include "compile/memory_plan.h"
#include "core/error.h"

namespace tr::compile {
namespace {

bool live_together(const PlanBuffer& a, const PlanBuffer& b) {
  return a.first <= b.last && b.first <= a.last;
}

// Buffers alive at the same time never share a byte; offsets are aligned; the arena holds every buffer.
void expect_valid(const std::vector<PlanBuffer>& bufs, const MemoryPlan& p, int64_t align) {
  ASSERT_EQ(p.offsets.size(), bufs.size());
  for (size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_EQ(p.offsets[i] % align, 0) << i;
    EXPECT_LE(p.offsets[i] + bufs[i].bytes, p.arena_bytes) << i;
    for (size_t j = i + 1; j < bufs.size(); ++j) {
      if (!live_together(bufs[i], bufs[j]) || bufs[i].bytes == 0 || bufs[j].bytes == 0) continue;
      const bool apart =
          p.offsets[i] + bufs[i].bytes <= p.offsets[j] || p.offsets[j] + bufs[j].bytes <= p.offsets[i];
      EXPECT_TRUE(apart) << "buffers " << i << " and " << j << " overlap";
    }
  }
  EXPECT_GE(p.arena_bytes, p.live_peak);
}

TEST(MemoryPlan, BuffersAliveAtDifferentTimesShareMemory) {
  const std::vector<PlanBuffer> bufs{{1000, 0, 1}, {640, 2, 3}, {1000, 4, 9}, {64, 10, 10}};
  const MemoryPlan p = plan_memory(bufs, 64);
  expect_valid(bufs, p, 64);
  EXPECT_EQ(p.arena_bytes, 1024);  // the largest, rounded to the alignment
  EXPECT_EQ(p.live_peak, 1024);
  for (int64_t o : p.offsets) EXPECT_EQ(o, 0);
}

TEST(MemoryPlan, BuffersAliveTogetherAreLaidSideBySide) {
  const std::vector<PlanBuffer> bufs{{100, 0, 5}, {200, 1, 5}, {300, 2, 5}};
  const MemoryPlan p = plan_memory(bufs, 1);
  expect_valid(bufs, p, 1);
  EXPECT_EQ(p.arena_bytes, 600);
  EXPECT_EQ(p.live_peak, 600);
}

TEST(MemoryPlan, AFreedGapIsReusedByTheBufferThatFitsIt) {
  // A (big) and B (small) alive together, B freed, then C (small) while A still lives: C takes B's place.
  const std::vector<PlanBuffer> bufs{{4096, 0, 10}, {512, 0, 3}, {512, 5, 10}};
  const MemoryPlan p = plan_memory(bufs, 64);
  expect_valid(bufs, p, 64);
  EXPECT_EQ(p.arena_bytes, 4096 + 512);
  EXPECT_EQ(p.offsets[1], p.offsets[2]);
}

TEST(MemoryPlan, RandomLifetimesGiveValidDeterministicPlans) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<PlanBuffer> bufs(1 + rng() % 60);
    int64_t sum = 0;
    for (auto& b : bufs) {
      b.bytes = static_cast<int64_t>(rng() % 5000);
      b.first = static_cast<int64_t>(rng() % 100);
      b.last = b.first + static_cast<int64_t>(rng() % 30);
      sum += (b.bytes + 63) / 64 * 64;
    }
    const MemoryPlan p = plan_memory(bufs, 64);
    expect_valid(bufs, p, 64);
    EXPECT_LE(p.arena_bytes, sum);
    const MemoryPlan again = plan_memory(bufs, 64);
    EXPECT_EQ(again.offsets, p.offsets);
    if (HasFailure()) return;
  }
}

TEST(MemoryPlan, BadBuffersAreRefused) {
  EXPECT_THROW(plan_memory({{-1, 0, 0}}), Error);
  EXPECT_THROW(plan_memory({{8, 3, 2}}), Error);
  EXPECT_THROW(plan_memory({{8, 0, 1}}, 48), Error);
  EXPECT_EQ(plan_memory({}).arena_bytes, 0);
}

// A stand-in for a CUDA graph: capture keeps the work (as a graph keeps its kernels) without running it;
// each launch runs it. Counts what happened.
struct GraphLog {
  int captures = 0, launches = 0, destroyed = 0;
};
class FakeGraph final : public backend::Backend::DeviceGraph {
 public:
  FakeGraph(std::function<void()> work, GraphLog& log) : work_(std::move(work)), log_(log) {}
  ~FakeGraph() override { ++log_.destroyed; }
  void launch() override {
    ++log_.launches;
    work_();
  }

 private:
  std::function<void()> work_;
  GraphLog& log_;
};

DeviceGraphCache::Capture fake_capture(GraphLog& log) {
  return [&log](const std::function<void()>& work) -> std::unique_ptr<backend::Backend::DeviceGraph> {
    ++log.captures;
    return std::make_unique<FakeGraph>(work, log);
  };
}

TEST(DeviceGraph, CapturedOnceLaunchedEveryReplayCapturedAgainWhenItsKeyChanges) {
  GraphLog log;
  DeviceGraphCache cache;
  int ran = 0;
  const std::function<void()> work = [&] { ++ran; };
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(cache.run({7, 100, 200}, fake_capture(log), work));
  EXPECT_EQ(log.captures, 1);  // the capture itself ran nothing: three launches, three runs
  EXPECT_EQ(log.launches, 3);
  EXPECT_EQ(ran, 3);
  // An input's bytes moved (or the Philox shift changed): the old graph would write to the old address.
  EXPECT_TRUE(cache.run({7, 100, 300}, fake_capture(log), work));
  EXPECT_EQ(log.captures, 2);
  EXPECT_EQ(log.destroyed, 1);
  EXPECT_TRUE(cache.run({7, 100, 300}, fake_capture(log), work));
  EXPECT_EQ(log.captures, 2);
  EXPECT_EQ(cache.captures(), 2);
  cache.reset();  // the arena released (an evaluation): the next replay captures again
  EXPECT_EQ(log.destroyed, 2);
  EXPECT_FALSE(cache.holds_graph());
  EXPECT_TRUE(cache.run({7, 100, 300}, fake_capture(log), work));
  EXPECT_EQ(log.captures, 3);
  EXPECT_EQ(ran, 6);
  EXPECT_TRUE(cache.broken().empty());
}

TEST(DeviceGraph, AFailedCaptureIsGivenUpWithItsReasonAndTheCallerRunsTheWork) {
  DeviceGraphCache cache;
  int tries = 0;
  const DeviceGraphCache::Capture failing =
      [&](const std::function<void()>&) -> std::unique_ptr<backend::Backend::DeviceGraph> {
    ++tries;
    throw Error(
        "the step could not be captured as a CUDA graph: operation not permitted when stream is capturing");
  };
  EXPECT_FALSE(cache.run({1}, failing, [] {}));
  EXPECT_NE(cache.broken().find("operation not permitted"), std::string::npos) << cache.broken();
  EXPECT_FALSE(cache.run({2}, failing, [] {}));  // not tried again every step
  EXPECT_EQ(tries, 1);
  DeviceGraphCache none;  // a backend without graphs (the CPU) returns none
  const DeviceGraphCache::Capture declines = [](const std::function<void()>&) {
    return std::unique_ptr<backend::Backend::DeviceGraph>();
  };
  EXPECT_FALSE(none.run({1}, declines, [] {}));
  EXPECT_EQ(none.broken(), "this backend replays without device graphs");
}

}  // namespace
}  // namespace tr::compile
