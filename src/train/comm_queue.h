// A communication thread for ZeRO's collectives (ZeRO-2's gradient buckets, ZeRO-3's gathers and
// reductions): jobs run one at a time in the order they were queued - every rank queues the same
// collectives in the same order, so they pair up across ranks - while the training thread goes on.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "core/device.h"
#include "dist/process_group.h"

namespace tr::train {

class CommQueue {
 public:
  // Jobs that touch `device` (a GPU: its copies and collectives) run with it current on the thread. The
  // collectives of `group` that the jobs run are timed apart (collective_seconds).
  CommQueue(Device device, const dist::ProcessGroup& group);
  // Skips the jobs not started (an error is unwinding the step) and joins the thread.
  ~CommQueue();
  CommQueue(const CommQueue&) = delete;
  CommQueue& operator=(const CommQueue&) = delete;

  // Queues `job` and returns its ticket (increasing from 1). After a job fails the later ones are skipped;
  // the failure is rethrown by the next wait.
  uint64_t push(std::function<void()> job);
  // Until the job of `ticket` (0: none) and every job before it has finished; rethrows a failure. The time
  // spent waiting counts in blocked_seconds().
  void wait(uint64_t ticket);
  void drain() { wait(last()); }
  uint64_t last();  // the last ticket queued
  // Seconds the callers of wait() spent blocked; seconds the thread spent running jobs, and of them in
  // `group`'s collectives (its stats' seconds: no other thread runs the group's collectives meanwhile).
  double blocked_seconds() const { return blocked_; }
  double busy_seconds();
  double collective_seconds();

 private:
  void run();

  Device device_;
  const dist::ProcessGroup& group_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, std::function<void()>>> queue_;
  uint64_t issued_ = 0, done_ = 0;
  double busy_ = 0, collective_ = 0;  // under mu_
  double blocked_ = 0;                // the waiting thread's
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tr::train
