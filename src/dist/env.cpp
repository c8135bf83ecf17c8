// Reading the launcher's environment; see env.h.
#include "dist/env.h"

#include <cstdlib>

#include "core/error.h"

namespace tr::dist {

namespace {

int int_var(const EnvLookup& env, const std::string& name, int fallback, int lo, int hi) {
  const auto v = env(name);
  if (!v) return fallback;
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(*v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  // Slurm writes per-node task counts as "4(x2)": the leading number is the one meant.
  const bool slurm_repeat = used > 0 && used < v->size() && (*v)[used] == '(';
  TR_CHECK(used > 0 && (used == v->size() || slurm_repeat),
           "environment variable {}=\"{}\": expected an integer", name, *v);
  TR_CHECK(x >= lo && x <= hi, "environment variable {}={}: expected a value in [{}, {}]", name, x, lo, hi);
  return static_cast<int>(x);
}

void read_master(const EnvLookup& env, DistEnv& d) {
  if (auto a = env("MASTER_ADDR")) d.master_addr = *a;
  TR_CHECK(!d.master_addr.empty(), "environment variable MASTER_ADDR is empty: expected rank 0's host");
  d.master_port = int_var(env, "MASTER_PORT", 29500, 1, 65535);
}

}  // namespace

DistEnv read_dist_env(const EnvLookup& env) {
  DistEnv d;
  constexpr int kMax = 1 << 20;
  if (env("WORLD_SIZE")) {
    d.launcher = "torchrun";
    d.world_size = int_var(env, "WORLD_SIZE", 1, 1, kMax);
    d.rank = int_var(env, "RANK", 0, 0, kMax);
    d.local_rank = int_var(env, "LOCAL_RANK", d.rank, 0, kMax);
    d.local_world_size = int_var(env, "LOCAL_WORLD_SIZE", d.world_size, 1, kMax);
    d.group_rank = int_var(env, "GROUP_RANK", 0, 0, kMax);
    TR_CHECK(d.world_size == 1 || env("RANK"), "environment variable WORLD_SIZE={} is set but RANK is not",
             d.world_size);
    d.restart_count = int_var(env, "TORCHELASTIC_RESTART_COUNT", 0, 0, kMax);
    d.run_id = env("TORCHELASTIC_RUN_ID").value_or("none");
    if (env("TRAINER_AGENT_STORE").value_or("") == "1")
      d.store_host = StoreHost::trainer_launch;
    else if (env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True")  // Python's str(True)
      d.store_host = StoreHost::torch_agent;
    d.torch_store_protocol = parse_torch_store_protocol(env("TRAINER_TORCH_STORE_PROTOCOL").value_or(""));
  } else if (env("SLURM_STEP_NUM_TASKS") && env("SLURM_PROCID")) {
    // srun's job step (a batch script itself also sees SLURM_NTASKS and SLURM_PROCID=0, but no step: a
    // plain `trainer train` there is one process, not rank 0 of SLURM_NTASKS).
    d.launcher = "slurm";
    d.world_size = int_var(env, "SLURM_STEP_NUM_TASKS", 1, 1, kMax);
    d.rank = int_var(env, "SLURM_PROCID", 0, 0, kMax);
    d.local_rank = int_var(env, "SLURM_LOCALID", 0, 0, kMax);
    const char* per_node =
        env("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_NTASKS_PER_NODE";
    d.local_world_size = int_var(env, per_node, d.world_size, 1, kMax);  // "4(x2)": 4 per node
    d.group_rank = int_var(env, "SLURM_NODEID", 0, 0, kMax);
    TR_CHECK(d.world_size == 1 || env("MASTER_ADDR"),
             "srun started {} tasks but MASTER_ADDR is not set: export rank 0's host name, e.g. "
             "MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)",
             d.world_size);
  } else if (env("OMPI_COMM_WORLD_SIZE")) {
    d.launcher = "mpirun";
    d.world_size = int_var(env, "OMPI_COMM_WORLD_SIZE", 1, 1, kMax);
    d.rank = int_var(env, "OMPI_COMM_WORLD_RANK", 0, 0, kMax);
    d.local_rank = int_var(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, 0, kMax);
    d.local_world_size = int_var(env, "OMPI_COMM_WORLD_LOCAL_SIZE", d.world_size, 1, kMax);
    TR_CHECK(d.world_size == 1 || env("MASTER_ADDR"),
             "mpirun started {} processes but MASTER_ADDR is not set: pass -x MASTER_ADDR=<rank 0's host>",
             d.world_size);
    d.group_rank = d.rank / d.local_world_size;
  } else {
    return d;
  }
  read_master(env, d);
  TR_CHECK(d.rank < d.world_size, "rank {} (from the {} environment) is not below the world size {}", d.rank,
           d.launcher, d.world_size);
  TR_CHECK(d.local_rank < d.local_world_size && d.local_world_size <= d.world_size,
           "local rank {} of {} local processes does not fit a world of {} (the {} environment)",
           d.local_rank, d.local_world_size, d.world_size, d.launcher);
  return d;
}

DistEnv read_dist_env() {
  return read_dist_env([](const std::string& n) -> std::optional<std::string> {
    const char* v = std::getenv(n.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace tr::dist
