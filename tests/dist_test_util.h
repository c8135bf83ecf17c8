// Helpers of the distributed tests: free ports per test process, and a Gloo group of threads on 127.0.0.1.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

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

// Runs fn(rank, group) on `world` threads, each a rank of one Gloo group on 127.0.0.1; `setup` may change
// each rank's environment (who serves the store).
template <typename F>
void with_group(int world, int port, F fn, const std::function<void(dist::DistEnv&)>& setup = {}) {
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
        auto g = dist::init_process_group(e, dist::CommBackend::gloo, std::chrono::milliseconds(20000));
        fn(r, *g);
      } catch (const std::exception& x) {
        errors[static_cast<size_t>(r)] = x.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

}  // namespace tr::test
