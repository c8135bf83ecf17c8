// SIGINT / SIGTERM / SIGHUP for every subcommand: blocked in every thread from before the first library
// constructor runs, and taken by one thread of ours with sigwait (stop_signals.cpp says why).
#pragma once
#include <pthread.h>

#include <atomic>
#include <thread>

namespace tr::cli {

// What the first signal does. `request_stop`: `trainer train` finishes its step, saves a checkpoint and
// exits 0; a second signal exits at once (the last checkpoint is intact: saves are renamed into place).
// `exit_now`: the process ends by the signal, as it would by default (eval, generate, tokenize, info).
// `forward`: `trainer launch` - the request is handed to the ranks (each finishes its step and saves); a
// second signal ends the launcher and with it every rank.
enum class FirstSignal { request_stop, exit_now, forward };

class StopSignals {
 public:
  explicit StopSignals(FirstSignal first);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  bool stop_requested() const { return stop_.load(std::memory_order_relaxed); }
  void set_mode(FirstSignal first) { first_.store(first); }

 private:
  void wait_loop();

  std::atomic<FirstSignal> first_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> closing_{false};
  std::thread waiter_;
};

// True when SIGINT, SIGTERM and SIGHUP are blocked in the calling thread (the state every thread of the
// process inherits).
bool stop_signals_blocked();

}  // namespace tr::cli
