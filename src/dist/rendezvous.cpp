// Rounds of `trainer launch` across nodes; see rendezvous.h.
#include "dist/rendezvous.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "core/error.h"

namespace tr::dist {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

LaunchRendezvous::LaunchRendezvous(int nnodes, int node_rank, const std::string& addr, int port,
                                   Millis join_timeout)
    : nnodes_(nnodes), node_rank_(node_rank) {
  if (node_rank == 0) server_ = std::make_unique<StoreServer>(port);
  client_ = std::make_unique<StoreClient>(addr, port, join_timeout, "launch/");
}

LaunchRendezvous::~LaunchRendezvous() = default;

LaunchRendezvous::News LaunchRendezvous::poll(int round) {
  News n;
  try {
    if (client_->add("failed", 0) > 0) {
      const auto why = client_->get("failed_why", Millis(1000));
      n.stop = why ? *why : std::string("another node gave up");
      client_->add("saw_failed", 1);  // node 0 lingers until the others have read it
      return n;
    }
    if (const int64_t r = client_->add("round", 0); r > round) n.restart_into = static_cast<int>(r);
  } catch (const Error& e) {
    n.stop = fmt::format("node 0's trainer launch (the rendezvous store) is gone: {}", e.what());
  }
  return n;
}

int LaunchRendezvous::next_round(int round) {
  // One node opens the next round however many fail in this one (their workers' peers vanish together).
  if (client_->add(fmt::format("opened/{}", round + 1), 1) == 1) client_->add("round", 1);
  return round + 1;
}

void LaunchRendezvous::join(int round, Millis timeout, const std::function<bool()>& stop_requested) {
  const std::string key = fmt::format("joined/{}", round);
  client_->add(key, 1);
  const auto start = Clock::now();
  for (;;) {
    const int64_t joined = client_->add(key, 0);
    if (joined >= nnodes_) return;
    if (client_->add("failed", 0) > 0) {
      client_->add("saw_failed", 1);
      fail("{}", client_->get("failed_why", Millis(1000)).value_or("another node gave up"));
    }
    const int64_t done = client_->add("done", 0);
    TR_CHECK(done == 0, "restart {}: {} node(s) already finished their ranks; a restart needs every node",
             round, done);
    TR_CHECK(!stop_requested || !stop_requested(), "stopped by a signal during restart {}", round);
    TR_CHECK(Clock::now() - start < timeout, "restart {}: {} of {} nodes joined within {} s", round, joined,
             nnodes_, timeout.count() / 1000.0);
    std::this_thread::sleep_for(Millis(50));
  }
}

void LaunchRendezvous::give_up(const std::string& why) {
  try {
    if (client_->add("gave_up", 1) == 1)  // the first reason stands: later ones are its consequences
      client_->set("failed_why", fmt::format("node {} gave up: {}", node_rank_, why));
    client_->add("failed", 1);
  } catch (const Error&) {  // node 0's store is gone already: the others learn it from that
  }
}

void LaunchRendezvous::finish(int round, Millis timeout) {
  client_->add("done", 1);
  if (node_rank_ != 0 || nnodes_ == 1) return;
  const auto start = Clock::now();
  bool told = false;
  for (;;) {
    const int64_t done = client_->add("done", 0);
    if (done >= nnodes_) return;
    TR_CHECK(client_->add("failed", 0) == 0, "trainer launch: {}",
             client_->get("failed_why", Millis(1000)).value_or("another node gave up"));
    TR_CHECK(client_->add("round", 0) <= round,
             "trainer launch: node 0's ranks finished, but another node restarts its ranks (round {}): a "
             "restart needs every node",
             client_->add("round", 0));
    const auto waited = Clock::now() - start;
    TR_CHECK(waited < timeout, "trainer launch: {} of {} nodes finished; the others did not within {} s",
             done, nnodes_, std::chrono::duration_cast<Millis>(timeout).count() / 1000.0);
    if (!told && waited > std::chrono::seconds(10)) {
      std::fprintf(stderr, "trainer launch: node 0 done; waiting for the other nodes (%lld of %d finished)\n",
                   static_cast<long long>(done), nnodes_);
      told = true;
    }
    std::this_thread::sleep_for(Millis(100));
  }
}

void LaunchRendezvous::linger() {
  if (node_rank_ != 0 || nnodes_ == 1) return;
  const auto until = Clock::now() + std::chrono::seconds(5);
  try {  // every node but the one that gave up reads the reason
    while (Clock::now() < until && client_->add("saw_failed", 0) < nnodes_ - 1)
      std::this_thread::sleep_for(Millis(50));
  } catch (const Error&) {
  }
}

}  // namespace tr::dist
