// The distributed environment a process was started into, read in one place: torchrun's contract (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; `trainer launch` sets the
// same), Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID + MASTER_ADDR) and Open MPI's
// mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE + MASTER_ADDR; node = rank / local size,
// as with --map-by node's default slot filling). Slurm's world is the srun step's SLURM_STEP_NUM_TASKS.
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "dist/torch_store.h"

namespace tr::dist {

enum class StoreHost { rank0, trainer_launch, torch_agent };

struct DistEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1, group_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher = "none";  // torchrun (trainer launch, torchrun), slurm, mpirun, or none
  // torchrun's attempt (TORCHELASTIC_RESTART_COUNT: 0, then one more per restart of the group) and run
  // (TORCHELASTIC_RUN_ID).
  int restart_count = 0;
  std::string run_id = "none";
  // Who serves the rendezvous store. Rank 0 (ours, at MASTER_PORT) unless a launcher does: `trainer launch`
  // (TRAINER_AGENT_STORE=1, ours: node 0's launcher outlives the attempts, so every node restarts into the
  // same store) or real torchrun's agent (TORCHELASTIC_USE_AGENT_STORE=True: PyTorch's TCPStore, whose
  // protocol TRAINER_TORCH_STORE_PROTOCOL may name). Under a launcher rank 0 connects like the others and
  // each attempt's keys are its own.
  StoreHost store_host = StoreHost::rank0;
  TorchStoreProtocol torch_store_protocol = TorchStoreProtocol::detect;
  bool distributed() const { return world_size > 1; }
  bool is_main() const { return rank == 0; }
};

// A variable's value, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Throws naming the variable when a value is not a number, out of range, or contradicts another.
DistEnv read_dist_env(const EnvLookup& env);
// The process's own environment.
DistEnv read_dist_env();

}  // namespace tr::dist
