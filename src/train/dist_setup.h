// A distributed run's set-up: which ZeRO stage --fsdp asks for, the process group of a launched run, and the
// check that every rank sees output_dir (a sharded run's ranks write one checkpoint together).
#pragma once
#include <memory>
#include <string>

#include "dist/process_group.h"
#include "train/args.h"

namespace tr::train {

// --fsdp shard_grad_op: ZeRO-2 (zero.h); full_shard: ZeRO-3 (zero3.h); otherwise 0 (DDP when distributed).
int zero_stage(const TrainingArguments& a);
// "full_shard", "shard_grad_op" or "" (for messages).
const char* fsdp_strategy(const TrainingArguments& a);
// What --fsdp asks of `world_size` processes, checked: options not built yet, two strategies at once, an
// optimizer that does not shard element-wise, full_shard with torch_compile (throws naming the flags).
void check_fsdp_flags(const TrainingArguments& a, int world_size);
// The process group of a run started by a launcher (torchrun, trainer launch, srun, mpirun), or null alone.
// Throws before connecting for what a distributed run cannot do (--fsdp options not built, an optimizer that
// does not shard, full_shard with torch_compile, automatic batch sizes, GPUs without NCCL).
std::unique_ptr<dist::ProcessGroup> join_group(const TrainingArguments& a);
// Every rank can read what rank 0 writes into `dir` (a collective); throws naming --fsdp `strategy`.
void check_shared_output_dir(dist::ProcessGroup& g, const std::string& dir, const char* strategy);

}  // namespace tr::train
