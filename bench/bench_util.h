// Benchmark helpers: median wall time of a callable, and running the PyTorch peer (torch_peer.py) in the
// same process tree so both are measured in one run on the same machine state.
#pragma once
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tr::bench {

template <typename F>
double median_seconds(F&& f, int iters, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> ts;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

// Runs a shell command that prints one JSON value; null when it fails.
inline nlohmann::json run_json_command(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return nullptr;
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) out += buf;
  if (pclose(p) != 0 || out.empty()) return nullptr;
  return nlohmann::json::parse(out, nullptr, false);
}

// Runs `torch_peer.py ARGS` with the interpreter in $TRAINER_TORCH_PYTHON (default /usr/bin/python3) and
// parses its JSON line; returns null when torch is unavailable.
inline nlohmann::json run_torch_peer(const std::string& args) {
  const char* py = std::getenv("TRAINER_TORCH_PYTHON");
  const char* dir_env = std::getenv("TRAINER_BENCH_DIR");  // where torch_peer.py is, when run from elsewhere
  const std::string dir = dir_env ? dir_env : TRAINER_BENCH_DIR;
  // torch_peer.py takes the mode, then the thread count (ours, so both sides use the same cores), then the
  // rest.
  const auto sp = args.find(' ');
  const std::string mode = args.substr(0, sp), rest = sp == std::string::npos ? "" : args.substr(sp + 1);
  const std::string cmd = std::string(py ? py : "/usr/bin/python3") + " " + dir + "/torch_peer.py " + mode +
                          " " + std::to_string(omp_get_max_threads()) + " " + rest + " 2>/dev/null";
  return run_json_command(cmd);
}

}  // namespace tr::bench
