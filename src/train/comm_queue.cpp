// ZeRO's communication thread; see comm_queue.h.
#include "train/comm_queue.h"

#include <chrono>

#include "backend/cuda_api.h"

namespace tr::train {

CommQueue::CommQueue(Device device, const dist::ProcessGroup& group) : device_(device), group_(group) {
  thread_ = std::thread([this] { run(); });
}

CommQueue::~CommQueue() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t CommQueue::push(std::function<void()> job) {
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    ticket = ++issued_;
    queue_.emplace_back(ticket, std::move(job));
  }
  cv_.notify_all();
  return ticket;
}

void CommQueue::wait(uint64_t ticket) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket; });
  blocked_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (error_) std::rethrow_exception(error_);
}

uint64_t CommQueue::last() {
  std::lock_guard<std::mutex> g(mu_);
  return issued_;
}

double CommQueue::busy_seconds() {
  std::lock_guard<std::mutex> g(mu_);
  return busy_;
}

double CommQueue::collective_seconds() {
  std::lock_guard<std::mutex> g(mu_);
  return collective_;
}

void CommQueue::run() {
  std::unique_lock<std::mutex> lock(mu_);
  bool on_device = false;
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping with nothing left
    auto [ticket, job] = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = error_ != nullptr || stop_;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = group_.stats().seconds;
    std::exception_ptr err;
    try {
      if (!skip && device_.is_cuda() && !on_device) {  // the device's copies and collectives run here too
        backend::cuda_use_device(device_.index);
        on_device = true;
      }
      if (!skip) job();
    } catch (...) {
      err = std::current_exception();
    }
    job = nullptr;  // what the job held goes before its ticket finishes
    lock.lock();
    const double c1 = group_.stats().seconds;
    busy_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    collective_ += c1 - c0;
    if (err && !error_) error_ = err;
    done_ = ticket;
    cv_.notify_all();
  }
}

}  // namespace tr::train
