// Helpers of the distributed tests: free ports per test process, and a Gloo group of threads on 127.0.0.1.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dist/process_group.h"

namespace tr::test {

// A port no other test of this run uses: the pid spreads parallel ctest processes apart; k numbers the
// tests of one process.
inline int test_port(int k) { return 20000 + (static_cast<int>(::getpid()) * 7 + k * 131) % 12000; }

// Runs fn(rank, group) on `world` threads, each a rank of one Gloo group on 127.0.0.1 (or NCCL's, whose ranks
// need a GPU each); `setup` may change each rank's environment (who serves the store).
template <typename F>
void with_group(int world, int port, F fn, const std::function<void(dist::DistEnv&)>& setup = {},
                dist::CommBackend backend = dist::CommBackend::gloo) {
  std::vector<std::thread> ts;
  std::vector<std::string> errors(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        dist::DistEnv e;
        e.rank = r;
        e.world_size = world;
        e.master_port = port;
        if (setup) setup(e);
        auto g = dist::init_process_group(e, backend, std::chrono::milliseconds(20000));
        fn(r, *g);
      } catch (const std::exception& x) {
        errors[static_cast<size_t>(r)] = x.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

// A group that forwards to `inner` and counts the collectives that went over a device's memory (the *_on
// calls) and those over host buffers; with `staged`, it reads no device's memory but the host's own, so
// callers take their staged path (a GPU's under Gloo) on a host partition too. `before_reduce`, when set,
// runs at the start of each reduction to owners (all_to_all_v, reduce_blocks_on: ZeRO-3's), on its caller's
// thread.
class CountingGroup final : public dist::ProcessGroup {
 public:
  CountingGroup(dist::ProcessGroup& inner, bool staged) : inner_(inner), staged_(staged) {}
  std::atomic<int> on_device{0}, on_host{0};  // ZeRO-3 gathers on its communication thread
  std::function<void()> before_reduce;
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* backend_name() const override { return inner_.backend_name(); }
  void all_reduce_sum(float* d, size_t n) override { ++on_host, inner_.all_reduce_sum(d, n); }
  void all_reduce_sum(double* d, size_t n) override { ++on_host, inner_.all_reduce_sum(d, n); }
  void broadcast(void* d, size_t b, int root) override { ++on_host, inner_.broadcast(d, b, root); }
  void all_gather(const void* in, void* out, size_t b) override { ++on_host, inner_.all_gather(in, out, b); }
  void all_gather_v(const void* in, size_t b, void* out, const std::vector<size_t>& c) override {
    ++on_host, inner_.all_gather_v(in, b, out, c);
  }
  void gather_v(const void* in, size_t b, void* out, const std::vector<size_t>& c, int root,
                uint32_t tag) override {
    ++on_host, inner_.gather_v(in, b, out, c, root, tag);
  }
  void all_to_all(const void* in, void* out, size_t b) override { ++on_host, inner_.all_to_all(in, out, b); }
  void all_to_all_v(const float* in, const std::vector<int64_t>& s, float* out,
                    const std::vector<int64_t>& r) override {
    if (before_reduce) before_reduce();
    ++on_host, inner_.all_to_all_v(in, s, out, r);
  }
  void barrier() override { inner_.barrier(); }
  std::unique_ptr<dist::ProcessGroup> split(int color) override { return inner_.split(color); }
  bool reads(Device d) const override { return staged_ ? d == Device::cpu() : inner_.reads(d); }
  void all_reduce_sum_on(Device d, float* p, size_t n,
                         const backend::ComputeFence* after = nullptr) override {
    ++on_device, inner_.all_reduce_sum_on(d, p, n, after);
  }
  void reduce_scatter_sum_on(Device d, const float* in, float* out, size_t n) override {
    ++on_device, inner_.reduce_scatter_sum_on(d, in, out, n);
  }
  void reduce_blocks_on(Device d, const float* in, const std::vector<int64_t>& c, float* out,
                        const backend::ComputeFence* after = nullptr) override {
    if (before_reduce) before_reduce();
    ++on_device, inner_.reduce_blocks_on(d, in, c, out, after);
  }
  void all_gather_on(Device d, const void* in, void* out, size_t b) override {
    ++on_device, inner_.all_gather_on(d, in, out, b);
  }
  void all_gather_v_on(Device d, const void* in, size_t b, void* out, const std::vector<size_t>& c) override {
    ++on_device, inner_.all_gather_v_on(d, in, b, out, c);
  }

 private:
  dist::ProcessGroup& inner_;
  bool staged_;
};

}  // namespace tr::test
