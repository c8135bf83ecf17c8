// A distributed run's set-up: which ZeRO stage --fsdp asks for, the process group of a launched run, and the
// check that every rank sees output_dir (a sharded run's ranks write one checkpoint together).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "dist/env.h"
#include "dist/process_group.h"
#include "train/args.h"

namespace tr::train {

// --fsdp shard_grad_op / hybrid_shard_zero2: ZeRO-2 (zero.h); full_shard / hybrid_shard: ZeRO-3 (zero3.h);
// otherwise 0 (DDP when distributed).
int zero_stage(const TrainingArguments& a);
// hybrid_shard / hybrid_shard_zero2 (HF's HYBRID_SHARD, _HYBRID_SHARD_ZERO2): sharded within each node,
// replicated across the nodes.
bool hybrid_sharding(const TrainingArguments& a);
// The --fsdp strategy given ("full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2") or "".
const char* fsdp_strategy(const TrainingArguments& a);
// Hybrid sharding's two groups of a world: `shard`, this node's ranks (LOCAL_WORLD_SIZE of them), which
// shard the model as ZeRO does; `replicas`, the ranks holding the same shard on every node, which sum its
// reduced gradients. A collective of every rank; throws unless the ranks are numbered node by node.
struct HybridGroups {
  std::unique_ptr<dist::ProcessGroup> shard, replicas;
};
HybridGroups hybrid_groups(dist::ProcessGroup& world, const dist::DistEnv& env);
// What --fsdp asks of `world_size` processes, checked: options not built yet, two strategies at once, an
// optimizer that does not shard element-wise, full_shard with torch_compile (throws naming the flags).
void check_fsdp_flags(const TrainingArguments& a, int world_size);
// The process group of a run started by a launcher (torchrun, trainer launch, srun, mpirun), or null alone.
// Throws before connecting for what a distributed run cannot do (--fsdp options not built, an optimizer that
// does not shard, full_shard with torch_compile, automatic batch sizes, GPUs without NCCL).
std::unique_ptr<dist::ProcessGroup> join_group(const TrainingArguments& a);

// A group its launcher restarted (torchrun's TORCHELASTIC_RESTART_COUNT > 0) continues from the newest
// checkpoint in output_dir, as HF's example scripts resume from get_last_checkpoint(output_dir): otherwise a
// restart would start over, or be refused by the output_dir check. Rank 0 picks it and every rank of `group`
// takes that one (a rank that does not see it - output_dir not one shared folder - fails naming it). An
// explicit --resume_from_checkpoint (false included) is kept.
TrainingArguments elastic_resume(const TrainingArguments& a, dist::ProcessGroup* group);
// Every rank can read what rank 0 writes into `dir` (a collective); throws naming --fsdp `strategy`.
void check_shared_output_dir(dist::ProcessGroup& g, const std::string& dir, const char* strategy);

// A hash of a tensor's bytes continuing `h` (splitmix64-mixed 8-byte words): what each rank loaded.
uint64_t content_hash(const Tensor& t, uint64_t h);
// Throws naming the ranks of `g` whose weights' hash differs from rank 0's (another copy or revision of the
// checkpoint `dir` on their node).
void check_same_weights(dist::ProcessGroup& g, uint64_t hash, const std::string& dir);

}  // namespace tr::train
