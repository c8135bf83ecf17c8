// Greedy-by-size arena planning; see memory_plan.h.
#include "compile/memory_plan.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace tr::compile {

namespace {

int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

bool overlaps(const PlanBuffer& a, const PlanBuffer& b) { return a.first <= b.last && b.first <= a.last; }

// The most bytes alive at one position: a sweep over lifetime starts and ends.
int64_t live_peak(const std::vector<PlanBuffer>& bufs, const std::vector<int64_t>& sizes) {
  std::vector<std::pair<int64_t, int64_t>> events;  // (position, +size at first / -size after last)
  events.reserve(bufs.size() * 2);
  for (size_t i = 0; i < bufs.size(); ++i) {
    events.emplace_back(bufs[i].first, sizes[i]);
    events.emplace_back(bufs[i].last + 1, -sizes[i]);
  }
  std::sort(events.begin(), events.end());  // at one position the ends (negative) come first
  int64_t live = 0, peak = 0;
  for (const auto& [pos, delta] : events) {
    live += delta;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace

MemoryPlan plan_memory(const std::vector<PlanBuffer>& buffers, int64_t alignment) {
  TR_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0,
           "plan_memory: alignment {} is not a power of 2", alignment);
  std::vector<int64_t> sizes(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    const PlanBuffer& b = buffers[i];
    TR_CHECK(b.bytes >= 0 && b.bytes <= (int64_t{1} << 50), "plan_memory: buffer {} has {} bytes", i,
             b.bytes);
    TR_CHECK(b.first >= 0 && b.first <= b.last, "plan_memory: buffer {} lives from {} to {}", i, b.first,
             b.last);
    sizes[i] = round_up(b.bytes, alignment);
  }
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (sizes[a] != sizes[b]) return sizes[a] > sizes[b];
    return buffers[a].first < buffers[b].first;
  });
  MemoryPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<size_t> placed;  // kept sorted by offset
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (size_t i : order) {
    // The intervals [offset, offset + size) of placed buffers alive together with this one, by offset.
    busy.clear();
    for (size_t j : placed)
      if (overlaps(buffers[i], buffers[j])) busy.emplace_back(plan.offsets[j], plan.offsets[j] + sizes[j]);
    // The smallest gap that holds it (best fit), else past the last busy interval.
    int64_t best = -1, best_gap = 0, cursor = 0;
    for (const auto& [lo, hi] : busy) {
      const int64_t gap = lo - cursor;
      if (gap >= sizes[i] && (best < 0 || gap < best_gap)) {
        best = cursor;
        best_gap = gap;
      }
      cursor = std::max(cursor, hi);
    }
    plan.offsets[i] = best >= 0 ? best : cursor;
    plan.arena_bytes = std::max(plan.arena_bytes, plan.offsets[i] + sizes[i]);
    placed.insert(std::upper_bound(placed.begin(), placed.end(), i,
                                   [&](size_t a, size_t b) { return plan.offsets[a] < plan.offsets[b]; }),
                  i);
  }
  plan.live_peak = live_peak(buffers, sizes);
  return plan;
}

}  // namespace tr::compile
