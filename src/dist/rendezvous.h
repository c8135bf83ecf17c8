// The launchers' side of torchrun's elastic restarts across nodes: node 0's `trainer launch` serves the
// rendezvous store for the whole launch, and every node's launcher agrees through it on the attempt
// ("round") its workers run. A node whose workers fail opens the next round; the others see it and restart
// theirs into it; a node out of restarts (or stopped by the user) says why and every node stops. Workers
// meet under the round's prefix (TORCHELASTIC_RESTART_COUNT), so a stale worker of an older round cannot
// disturb a newer one.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "dist/store.h"

namespace tr::dist {

class LaunchRendezvous {
 public:
  // Node `node_rank` of `nnodes`; node 0 serves the store at `port` (throws naming it when busy), every node
  // connects to addr:port, waiting up to `join_timeout` for node 0 to come up.
  LaunchRendezvous(int nnodes, int node_rank, const std::string& addr, int port, Millis join_timeout);
  ~LaunchRendezvous();

  // What the others decided while this node's workers run `round` (polled by the monitor loop): a newer
  // round to restart into, or a reason to stop (a node gave up, or node 0's launcher is gone).
  struct News {
    std::optional<int> restart_into;
    std::string stop;  // non-empty: stop the workers and fail with this
  };
  News poll(int round);
  // This node's workers failed in `round`: the round to restart into (the first node to fail opens
  // round + 1; the others join it). Throws when node 0's store is gone.
  int next_round(int round);
  // Waits (up to `timeout`) until every node's workers of the previous round have ended and the node has
  // joined `round`: the new workers then all see the same newest checkpoint. Throws naming who is missing,
  // a node that already finished (a restart needs every node), why another node gave up, or the user's
  // stop (`stop_requested`).
  void join(int round, Millis timeout, const std::function<bool()>& stop_requested);
  // This node will not restart (out of restarts, or stopped by the user): the others stop too, with the
  // first reason given.
  void give_up(const std::string& why);
  // This node's workers all exited 0 in `round`; node 0 then waits (up to `timeout`) until every node has, so
  // that the store outlives their last use of it. Throws naming the nodes that did not finish, or a node
  // that restarts meanwhile (its new round would wait for this one).
  void finish(int round, Millis timeout);
  // Before node 0 ends on a failure: a few seconds for the other nodes to read why, so that they report the
  // reason rather than the store's going away.
  void linger();

 private:
  int nnodes_, node_rank_;
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<StoreClient> client_;
};

}  // namespace tr::dist
