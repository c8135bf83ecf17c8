// A distributed run's set-up before the Trainer starts: the process group joined (with the flag checks that
// must come before any rank connects) and the sharded strategies' shared-output_dir check; see dist_setup.h.
#include "train/dist_setup.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "backend/cuda_api.h"
#include "core/error.h"
#include "dist/env.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "train/checkpoint.h"
#include "train/setup.h"
#include "train/zero.h"

namespace tr::train {

namespace fs = std::filesystem;

int zero_stage(const TrainingArguments& a) {
  return a.fsdp_has("full_shard") || a.fsdp_has("hybrid_shard")            ? 3
         : a.fsdp_has("shard_grad_op") || a.fsdp_has("hybrid_shard_zero2") ? 2
                                                                           : 0;
}

bool hybrid_sharding(const TrainingArguments& a) {
  return a.fsdp_has("hybrid_shard") || a.fsdp_has("hybrid_shard_zero2");
}

const char* fsdp_strategy(const TrainingArguments& a) {
  for (const char* s : {"full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2"})
    if (a.fsdp_has(s)) return s;
  return "";
}

HybridGroups hybrid_groups(dist::ProcessGroup& world, const dist::DistEnv& env) {
  // Every rank's place, gathered first: a layout one rank finds wrong fails on every rank, not only on it
  // (the others would wait in the split's collectives until --ddp_timeout).
  const int mine[3] = {env.group_rank, env.local_rank, env.local_world_size};
  std::vector<int> all(3 * static_cast<size_t>(world.size()));
  world.all_gather(mine, all.data(), sizeof mine);
  const int local = all[2];
  for (int r = 0; r < world.size(); ++r) {
    const int node = all[3 * r], local_rank = all[3 * r + 1], local_world = all[3 * r + 2];
    TR_CHECK(
        local >= 1 && local_world == local && world.size() % local == 0 && local_rank >= 0 &&
            local_rank < local && r == node * local + local_rank,
        "--fsdp hybrid_shard: rank {} of {} is local rank {} of {} on node {}; hybrid sharding needs the "
        "same LOCAL_WORLD_SIZE on every node and ranks numbered node by node (torchrun's, trainer "
        "launch's)",
        r, world.size(), local_rank, local_world, node);
  }
  HybridGroups g;
  g.shard = world.split(env.group_rank);     // this node's ranks: they shard the model
  g.replicas = world.split(env.local_rank);  // the same shard on every node: they sum its gradients
  return g;
}

// A sharded run's ranks write their optimizer files into one checkpoint folder and read each other's on
// resume: every rank must see output_dir (one host, or a shared filesystem). Checked before training starts,
// not at the first save.
void check_shared_output_dir(dist::ProcessGroup& g, const std::string& dir, const char* strategy) {
  const fs::path marker = fs::path(dir) / ".trainer-shared-check";
  uint64_t token = 0;
  if (g.rank() == 0) {
    token = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
            (static_cast<uint64_t>(::getpid()) << 40);
    std::ofstream(marker) << token;
  }
  g.broadcast(&token, sizeof token, 0);
  uint64_t seen = 0;
  if (g.rank() != 0) std::ifstream(marker) >> seen;
  double blind = g.rank() != 0 && seen != token ? 1 : 0;
  g.all_reduce_sum(&blind, 1);
  g.barrier();  // everyone has looked
  if (g.rank() == 0) fs::remove(marker);
  TR_CHECK(
      blind == 0,
      "--fsdp {}: {} of the {} ranks cannot see {} written by rank 0; every rank writes its "
      "optimizer file into the same checkpoint folder, so --output_dir must be on a filesystem all ranks "
      "share",
      strategy, blind, g.size(), marker.string());
}

void check_fsdp_flags(const TrainingArguments& a, int world_size) {
  // HF refuses the layer-wise ones under DDP; LOMO's update before any reduction would let ranks drift apart.
  TR_CHECK(!optim::updates_in_backward(a.optim),
           "--optim {} in a run of {} processes: it updates each parameter during backward, before the "
           "ranks' gradients could be summed, so the ranks' weights would drift apart; train it in one "
           "process",
           a.optim, world_size);
  int strategies = 0;  // at most one: validate()
  for (const char* s : {"full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2"})
    strategies += a.fsdp_has(s) ? 1 : 0;
  // Offload moves a sharded optimizer's shard to the host, so it needs a sharding strategy. HF refuses
  // "offload" alone (so does TrainingArguments::validate); with other options but no strategy (e.g.
  // "offload auto_wrap") we refuse too rather than train with DDP and ignore it.
  TR_CHECK(
      !a.fsdp_has("offload") || strategies == 1,
      "--fsdp {}: offload moves a sharded optimizer's shard to host memory, so it needs a sharding "
      "strategy: add full_shard or shard_grad_op, e.g. --fsdp \"full_shard offload\" (without --fsdp the "
      "{} processes train with DDP)",
      a.fsdp, world_size);
  const char* strategy = fsdp_strategy(a);
  TR_CHECK(zero_stage(a) == 0 || a.optim.rfind("schedule_free_", 0) != 0,
           "--fsdp {} with --optim {}: the schedule-free optimizers move whole parameters between their "
           "training and evaluation points, which a shard does not hold; train with DDP (no --fsdp)",
           strategy, a.optim);
  TR_CHECK(zero_stage(a) == 0 || shards_elementwise(a.optim),
           "--fsdp {} with --optim {}: sharding splits tensors into flat slices, which only "
           "element-wise optimizers update exactly ({})",
           strategy, a.optim, elementwise_optimizers());
  // The captured step records parameter addresses, which ZeRO-3 gives back between uses.
  TR_CHECK(zero_stage(a) != 3 ||
               !(a.torch_compile || !a.torch_compile_backend.empty() || !a.torch_compile_mode.empty()),
           "--fsdp {} with --torch_compile: the captured step replays fixed parameter addresses, and {} "
           "releases each layer's parameters between uses; drop one of them ({} compiles)",
           strategy, strategy, hybrid_sharding(a) ? "hybrid_shard_zero2" : "shard_grad_op");
}

// The process group of a run started by a launcher (torchrun, trainer launch, srun, mpirun), or null.
std::unique_ptr<dist::ProcessGroup> join_group(const TrainingArguments& a) {
  const dist::DistEnv env = dist::read_dist_env();
  if (!env.distributed()) return nullptr;
  check_fsdp_flags(a, env.world_size);
  TR_CHECK(!a.auto_find_batch_size && a.per_device_train_batch_size != kAutoBatch,
           "--auto_find_batch_size / --per_device_train_batch_size auto with WORLD_SIZE {}: the ranks would "
           "retry on their own; give the batch size",
           env.world_size);
  // GPU ranks train on cuda:LOCAL_RANK (training_device); DDP's buckets stay on the GPU under NCCL and go
  // through host memory under Gloo (the default until NCCL's path has run on GPUs), as ZeRO's collectives do.
  const std::string comm = a.ddp_backend.empty() ? "gloo" : a.ddp_backend;
  const Device dev = training_device(a);
  // This thread's CUDA context on the rank's own GPU from the start (torch.cuda.set_device(local_rank)): else
  // the first CUDA call of the rendezvous makes one on cuda:0 in every rank.
  if (dev.is_cuda()) backend::cuda_use_device(dev.index);
  if (dev.is_cuda() && env.is_main()) {
    const int gpus = backend::cuda_device_count();
    std::fprintf(stderr,
                 "train: note: %d processes per node on %d GPU(s)%s; DDP/ZeRO buckets over %s through host "
                 "memory\n",
                 env.local_world_size, gpus,
                 env.local_world_size > gpus ? ", so GPUs are shared by several ranks (slower, same numbers)"
                                             : ", one each",
                 comm.c_str());
  }
  return dist::init_process_group(env, dist::parse_comm_backend(comm),
                                  std::chrono::milliseconds(a.ddp_timeout * 1000));
}

namespace {

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

// A hash of a tensor's bytes (8-byte words, each mixed in with a splitmix64 finalizer so that no bit's
// change can cancel another's), continuing `h`: the ranks of a sharded run compare what each loaded.
uint64_t content_hash(const Tensor& t, uint64_t h) {
  const Tensor c = ops::contiguous(ops::to_device(t, Device::cpu()));
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  const size_t n = c.nbytes();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix64(h ^ w);
  }
  for (; i < n; ++i) h = mix64(h ^ p[i]);
  return h;
}

// Every rank of `g` made the same weights (each read the checkpoint itself, without rank 0's broadcast): a
// node with another revision of the files would train apart from the others without a word.
void check_same_weights(dist::ProcessGroup& g, uint64_t hash, const std::string& dir) {
  std::vector<uint64_t> all(static_cast<size_t>(g.size()));
  g.all_gather(&hash, all.data(), sizeof hash);
  std::vector<int> differ;
  for (int r = 1; r < g.size(); ++r)
    if (all[static_cast<size_t>(r)] != all[0]) differ.push_back(r);
  TR_CHECK(differ.empty(),
           "{}: rank{} {} read other weights than rank 0 (another copy or revision of the checkpoint on its "
           "node?); every rank of a sharded run loads the same files",
           dir, differ.size() > 1 ? "s" : "", fmt::join(differ, ", "));
}

TrainingArguments elastic_resume(const TrainingArguments& a, dist::ProcessGroup* group) {
  const dist::DistEnv env = dist::read_dist_env();
  if (!a.resume_from_checkpoint.empty() || env.restart_count == 0) return a;
  std::string last;
  if ((group == nullptr || group->rank() == 0) && fs::is_directory(a.output_dir))
    last = latest_checkpoint(a.output_dir);
  if (group != nullptr) {  // rank 0's choice for every rank
    int64_t n = static_cast<int64_t>(last.size());
    group->broadcast(&n, sizeof n, 0);
    last.resize(static_cast<size_t>(n));
    if (n > 0) group->broadcast(last.data(), last.size(), 0);
  }
  if (last.empty()) return a;  // nothing saved before the failure: the run starts over
  TR_CHECK(fs::is_directory(last),
           "restart {} of the group: rank 0 resumes from {}, which rank {} does not see: give every node one "
           "shared --output_dir",
           env.restart_count, last, group ? group->rank() : 0);
  TrainingArguments r = a;
  r.resume_from_checkpoint = last;
  if (env.rank == 0)
    std::fprintf(stderr, "train: restart %d of the group: resuming from %s\n", env.restart_count,
                 last.c_str());
  return r;
}

}  // namespace tr::train
