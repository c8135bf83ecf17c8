// The local process group of `trainer launch`; see launcher.h.
#include "dist/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "dist/rendezvous.h"

extern char** environ;

namespace tr::dist {

namespace {

using Clock = std::chrono::steady_clock;

int int_flag(const std::string& name, const std::string& v, int lo, int hi) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TR_CHECK(used == v.size() && !v.empty() && x >= lo && x <= hi,
           "trainer launch --{} {}: expected an integer in [{}, {}]", name, v, lo, hi);
  return static_cast<int>(x);
}

struct Worker {
  int local_rank = 0, rank = 0;
  pid_t pid = -1;
  int out_fd = -1;  // read end of its stdout+stderr (-1: it writes to ours directly)
  std::string pending;
  bool running = false;
  int status = 0;
};

// The environment of local process `local` (torchrun's variables over ours).
std::vector<std::string> worker_env(const LaunchOptions& o, int local, int restart) {
  const int world = o.nnodes * o.nproc_per_node;
  std::map<std::string, std::string> set{
      {"RANK", std::to_string(o.node_rank * o.nproc_per_node + local)},
      {"LOCAL_RANK", std::to_string(local)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"ROLE_RANK", std::to_string(o.node_rank * o.nproc_per_node + local)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"TORCHELASTIC_RUN_ID", o.rdzv_id},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TRAINER_AGENT_STORE", "1"}};  // node 0's launcher serves the store (rendezvous.h)
  // The cores are shared by the local processes (torchrun sets 1; a split keeps CPU training fast).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    set["OMP_NUM_THREADS"] = std::to_string(std::max(1u, hw / static_cast<unsigned>(o.nproc_per_node)));
  }
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (set.count(kv.substr(0, kv.find('='))) == 0) env.push_back(kv);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

void start(const LaunchOptions& o, Worker& w, int restart) {
  const bool direct = w.rank == 0;  // rank 0's progress bar reaches the terminal untouched
  int fds[2] = {-1, -1};
  if (!direct) TR_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "trainer launch: pipe: {}", std::strerror(errno));
  // Everything the child needs is built before fork: after it only async-signal-safe calls are made.
  std::vector<std::string> args{o.program};
  args.insert(args.end(), o.args.begin(), o.args.end());
  const std::vector<std::string> env = worker_env(o, w.local_rank, restart);
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  TR_CHECK(pid >= 0, "trainer launch: fork: {}", std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no process outlives the launcher
    if (::getppid() != parent) ::_exit(127);
    ::setpgid(0, 0);  // a terminal's Ctrl-C reaches the launcher alone, which forwards it once
    if (!direct) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
    }
    sigset_t none;  // the launcher's blocked stop signals are not the child's business
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    const char msg[] = "trainer launch: exec failed\n";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: a Ctrl-C before the child's own call must not reach it
  if (!direct) {
    ::close(fds[1]);
    w.out_fd = fds[0];
  }
  w.pid = pid;
  w.running = true;
  w.pending.clear();
}

// Copies what a worker wrote to our stderr, each line behind its rank; false at end of file.
bool pump(Worker& w) {
  char buf[4096];
  const ssize_t n = ::read(w.out_fd, buf, sizeof buf);
  if (n < 0 && errno == EINTR) return true;
  if (n <= 0) {
    if (!w.pending.empty()) std::fprintf(stderr, "[rank %d] %s\n", w.rank, w.pending.c_str());
    w.pending.clear();
    ::close(w.out_fd);
    w.out_fd = -1;
    return false;
  }
  w.pending.append(buf, static_cast<size_t>(n));
  for (size_t at; (at = w.pending.find_first_of("\n\r")) != std::string::npos;) {
    if (at > 0) std::fprintf(stderr, "[rank %d] %.*s\n", w.rank, static_cast<int>(at), w.pending.data());
    w.pending.erase(0, at + 1);
  }
  std::fflush(stderr);
  return true;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int s = WTERMSIG(status);
    return std::string("killed by ") + (sigabbrev_np(s) ? std::string("SIG") + sigabbrev_np(s) : "a signal") +
           " (" + std::to_string(s) + ")";
  }
  return "status " + std::to_string(status);
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

void signal_all(std::vector<Worker>& ws, int sig) {
  for (auto& w : ws)
    if (w.running) ::kill(w.pid, sig);
}

// How one attempt ended: this node's first failure, or news from the other nodes.
struct Attempt {
  std::string failure;              // "": none of this node's workers failed
  std::optional<int> restart_into;  // another node opened this round
  std::string stop;                 // another node gave up, or node 0's launcher is gone
};

// One attempt: runs the workers of `round` until all have ended, stopping them early on a local failure or
// on the other nodes' news.
Attempt run_group(const LaunchOptions& o, std::vector<Worker>& ws, int round, LaunchRendezvous& rdzv) {
  for (auto& w : ws) start(o, w, round);
  Attempt at;
  bool forwarded = false;
  Clock::time_point kill_at = Clock::time_point::max(), next_poll = Clock::now();
  const auto stop_all = [&] {
    signal_all(ws, SIGTERM);
    kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.kill_grace_seconds * 1e3));
  };
  for (;;) {
    std::vector<pollfd> pfds;
    std::vector<Worker*> owners;
    for (auto& w : ws)
      if (w.out_fd >= 0) {
        pfds.push_back({w.out_fd, POLLIN, 0});
        owners.push_back(&w);
      }
    if (!pfds.empty()) {
      ::poll(pfds.data(), pfds.size(), 100);
      for (size_t i = 0; i < pfds.size(); ++i)
        if (pfds[i].revents != 0) pump(*owners[i]);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    bool any_running = false;
    for (auto& w : ws) {
      if (!w.running) continue;
      int status = 0;
      const pid_t r = ::waitpid(w.pid, &status, WNOHANG);
      if (r < 0 && errno != EINTR) status = 0xff00;  // not ours to wait for any more (ECHILD): ended, unknown
      if (r == w.pid || (r < 0 && errno != EINTR)) {
        w.running = false;
        w.status = status;
        if (failed(status) && at.failure.empty() && !at.restart_into && at.stop.empty()) {
          at.failure = "rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) +
                       ", pid " + std::to_string(w.pid) + ") ended with " + describe(status);
          std::fprintf(stderr, "trainer launch: %s; stopping the other ranks\n", at.failure.c_str());
          stop_all();
        }
      } else {
        any_running = true;
      }
    }
    // The other nodes' news, a few times a second, while this node's workers run undisturbed.
    if (any_running && at.failure.empty() && !at.restart_into && at.stop.empty() &&
        Clock::now() >= next_poll) {
      next_poll = Clock::now() + std::chrono::milliseconds(200);
      const LaunchRendezvous::News n = rdzv.poll(round);
      if (n.restart_into || !n.stop.empty()) {
        at.restart_into = n.restart_into;
        at.stop = n.stop;
        std::fprintf(
            stderr, "trainer launch: %s; stopping the local ranks\n",
            !n.stop.empty()
                ? n.stop.c_str()
                : fmt::format("another node restarts its ranks (round {})", *n.restart_into).c_str());
        stop_all();
      }
    }
    if (!forwarded && o.stop_requested && o.stop_requested()) {  // each rank finishes its step and saves
      forwarded = true;
      signal_all(ws, SIGTERM);
    }
    if (any_running && Clock::now() >= kill_at) {
      signal_all(ws, SIGKILL);
      kill_at = Clock::time_point::max();
    }
    if (!any_running) {
      for (auto& w : ws)
        while (w.out_fd >= 0) pump(w);  // the last lines of the workers
      return at;
    }
  }
}

}  // namespace

LaunchOptions parse_launch_args(const std::vector<std::string>& argv) {
  LaunchOptions o;
  size_t i = 0;
  for (; i < argv.size() && argv[i].rfind("--", 0) == 0; ++i) {
    std::string name = argv[i].substr(2), value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      TR_CHECK(i + 1 < argv.size(), "trainer launch --{}: a value is expected", name);
      value = argv[++i];
    }
    for (char& c : name)
      if (c == '-') c = '_';  // torchrun accepts both spellings
    if (name == "nnodes")
      o.nnodes = int_flag(name, value, 1, 1 << 16);
    else if (name == "node_rank")
      o.node_rank = int_flag(name, value, 0, 1 << 16);
    else if (name == "nproc_per_node")
      o.nproc_per_node = int_flag(name, value, 1, 1024);
    else if (name == "master_addr")
      o.master_addr = value;
    else if (name == "master_port")
      o.master_port = int_flag(name, value, 1, 65535);
    else if (name == "max_restarts")
      o.max_restarts = int_flag(name, value, 0, 1000);
    else if (name == "rdzv_id" || name == "run_id")
      o.rdzv_id = value;
    else
      fail(
          "trainer launch: unknown flag --{} (expected --nnodes, --node_rank, --nproc_per_node, "
          "--master_addr, --master_port, --max_restarts, --rdzv_id, then the subcommand)",
          name);
  }
  TR_CHECK(i < argv.size(),
           "trainer launch: no subcommand given (e.g. trainer launch --nproc_per_node 2 "
           "train --config_name gpt2 ...)");
  TR_CHECK(argv[i] != "launch", "trainer launch: the subcommand cannot be launch itself");
  TR_CHECK(o.node_rank < o.nnodes, "trainer launch --node_rank {}: expected a value below --nnodes {}",
           o.node_rank, o.nnodes);
  TR_CHECK(!o.master_addr.empty(), "trainer launch --master_addr: expected rank 0's host");
  o.args.assign(argv.begin() + static_cast<long>(i), argv.end());
  if (o.rdzv_id.empty()) o.rdzv_id = std::to_string(std::random_device{}());
  return o;
}

int launch(const LaunchOptions& o) {
  TR_CHECK(!o.program.empty() && !o.args.empty(), "trainer launch: no program or subcommand");
  std::vector<Worker> ws(static_cast<size_t>(o.nproc_per_node));
  for (int l = 0; l < o.nproc_per_node; ++l) {
    ws[static_cast<size_t>(l)].local_rank = l;
    ws[static_cast<size_t>(l)].rank = o.node_rank * o.nproc_per_node + l;
  }
  // torchrun's join timeout: node 0 may start minutes after the others
  const auto wait_limit = std::chrono::minutes(15);
  LaunchRendezvous rdzv(o.nnodes, o.node_rank, o.master_addr, o.master_port, wait_limit);
  const auto stopped = [&] { return o.stop_requested && o.stop_requested(); };
  const auto fail_with = [&](const std::string& why) {
    std::fprintf(stderr, "trainer launch: failed: %s\n", why.c_str());
    rdzv.give_up(why);
    rdzv.linger();
    return 1;
  };
  for (int round = 0;;) {
    const Attempt at = run_group(o, ws, round, rdzv);
    if (!at.stop.empty()) {
      std::fprintf(stderr, "trainer launch: failed: %s\n", at.stop.c_str());
      rdzv.linger();
      return 1;
    }
    if (at.failure.empty() && !at.restart_into) {
      try {
        rdzv.finish(round, wait_limit);
      } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
      }
      return 0;
    }
    // A restart round is global: every node's workers start over in it, from a failure anywhere.
    const int next = at.restart_into.value_or(round + 1);
    if (stopped()) return fail_with("stopped by a signal after round " + std::to_string(round));
    if (next > o.max_restarts)
      return fail_with(!at.failure.empty()
                           ? at.failure
                           : fmt::format("another node restarts its ranks (round {}), past --max_restarts {}",
                                         next, o.max_restarts));
    try {
      round = at.restart_into ? next : rdzv.next_round(round);
      std::fprintf(stderr, "trainer launch: restarting the local group (restart %d of %d%s)\n", round,
                   o.max_restarts, o.nnodes > 1 ? ", every node together" : "");
      rdzv.join(round, wait_limit, stopped);  // every node's old workers gone before any new one starts
    } catch (const Error& e) {
      return fail_with(e.what());
    }
  }
}

}  // namespace tr::dist
