// torch_compile's pieces: the static memory plan.
#include <gtest/gtest.h>

#include <random>

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

}  // namespace
}  // namespace tr::compile
