// Signal handling of the `trainer` binary. No signal handler exists in this process, on purpose: oneDNN's
// JIT sgemm runs with its stack pointer inside a heap block it allocated, and a handler interrupting that
// thread writes its signal frame (with the AVX-512/AMX state, several KiB) into and past that block - glibc
// then aborts with "corrupted size vs. prev_size" (1 run in 4 under SIGTERM, issue 16). So the signals are
// blocked before any thread exists and one waiting thread takes them with sigwait: a compute thread never
// receives them, and no frame is ever pushed on a foreign stack.
#include "cli/stop_signals.h"

#include <signal.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

namespace tr::cli {

namespace {

sigset_t stop_set() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGHUP);
  return s;
}

// Runs from .preinit_array: before the dynamic loader runs any shared library's constructor. Blocking in
// main() would be too late: OpenBLAS (pthread build) starts its thread pool in its constructor, and a thread
// that does not block the signals would take them (and end the process, there being no handler).
void block_stop_signals(int, char**, char**) {
  const sigset_t s = stop_set();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

[[gnu::section(".preinit_array"),
  gnu::used]] void (*const preinit_block_stop_signals)(int, char**, char**) = &block_stop_signals;

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "signal";
  }
}

// Ends the process by `sig` with its default action (the parent sees "killed by SIGTERM", exit 143 in a
// shell), from this thread: no handler runs anywhere.
[[noreturn]] void die_by(int sig) {
  std::signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);
  std::_Exit(128 + sig);  // not reached: the default action of these signals ends the process
}

}  // namespace

bool stop_signals_blocked() {
  sigset_t cur;
  pthread_sigmask(SIG_BLOCK, nullptr, &cur);
  return sigismember(&cur, SIGINT) == 1 && sigismember(&cur, SIGTERM) == 1 && sigismember(&cur, SIGHUP) == 1;
}

StopSignals::StopSignals(FirstSignal first) : first_(first) {
  // The mask is normally in place since preinit; blocking again covers a binary linked without it. Threads
  // created from here on (OpenMP, oneDNN, DataLoader workers, CUDA) inherit it.
  const sigset_t s = stop_set();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
  waiter_ = std::thread([this] { wait_loop(); });
}

StopSignals::~StopSignals() {
  closing_ = true;
  pthread_kill(waiter_.native_handle(), SIGTERM);  // wakes sigwait; the loop sees closing_ and returns
  waiter_.join();
}

void StopSignals::wait_loop() {
  pthread_setname_np(pthread_self(), "tr-signals");  // tests/signal_stress.sh tells it from compute threads
  const sigset_t s = stop_set();
  for (int received = 0;;) {
    int sig = 0;
    if (sigwait(&s, &sig) != 0) continue;
    if (closing_) return;
    if (++received == 1 && first_.load() == FirstSignal::forward) {
      std::fprintf(
          stderr,
          "\ntrainer launch: %s received: every rank finishes its step and saves a checkpoint (send it "
          "again to end them at once)\n",
          signal_name(sig));
      stop_ = true;
      continue;
    }
    if (received == 1 && first_.load() == FirstSignal::request_stop) {
      std::fprintf(stderr,
                   "\ntrainer: %s received: finishing this step, then saving a checkpoint (send it again to "
                   "exit at once; the last saved checkpoint stays intact)\n",
                   signal_name(sig));
      stop_ = true;
      continue;
    }
    if (received > 1) std::fprintf(stderr, "\ntrainer: %s again: exiting now\n", signal_name(sig));
    die_by(sig);
  }
}

}  // namespace tr::cli
