// `trainer launch`: torchrun's role for our binary. Starts nproc_per_node local processes of `trainer
// SUBCOMMAND ARGS...` with torchrun's environment, forwards a stop request (SIGINT/SIGTERM) to them, shows
// global rank 0's output as it is (its progress bar) and every other rank's lines behind "[rank N] ", and
// when one process fails stops the others and reports which rank ended how.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace tr::dist {

struct LaunchOptions {
  int nnodes = 1, node_rank = 0, nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int max_restarts = 0;            // restarts of the local group after a failure (torchrun's)
  std::string rdzv_id;             // TORCHELASTIC_RUN_ID (default: a fresh one)
  std::string program;             // the binary to start (our own executable)
  std::vector<std::string> args;   // SUBCOMMAND ARGS...
  double kill_grace_seconds = 10;  // after a failure: SIGTERM, then SIGKILL this much later
  // Polled by the monitor loop: true once the user asked the run to stop (the CLI's signal thread).
  std::function<bool()> stop_requested;
};

// Parses torchrun's flags (`--name value` or `--name=value`) up to the subcommand; the rest is passed on.
// Throws naming the flag for an unknown one or a bad value.
LaunchOptions parse_launch_args(const std::vector<std::string>& argv);

// Runs the local group to completion; returns the exit status for the CLI: 0 when every process exited 0,
// else 1 (the failing rank and its status printed).
int launch(const LaunchOptions& o);

}  // namespace tr::dist
