// `trainer estimate`: the memory of a training step before it runs. The model is built on the meta device
// (every op allocates exactly what it would on the CPU, no data, no weights) and two full optimizer steps
// run there - forward and backward of every micro-batch, gradient statistics, the optimizer (its state made
// on the first step), the half weight copies - plus an evaluation forward when the run evaluates. The meta
// allocator's peak is the CPU run's train_peak_memory_gib x 2^30.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/args.h"

namespace tr::train {

// Whose memory `trainer estimate --device` models: the host's allocator, or a GPU's under the CUDA caching
// allocator (its reserved segments, plus cuBLASLt's workspace; the loader's batches stay in host memory).
enum class MemoryDevice { cpu, cuda };
// "cpu" or "cuda"; throws naming --device otherwise.
MemoryDevice parse_memory_device(const std::string& name);
const char* memory_device_name(MemoryDevice d);

// Where the step runs: one rank among `world_size` processes, `nproc_per_node` of them per node (0: all on
// one node; hybrid sharding shards within a node), on `device`'s memory.
struct MemoryTarget {
  int world_size = 1;
  int nproc_per_node = 0;
  MemoryDevice device = MemoryDevice::cpu;
  // With TRAINER_ALLOCATOR_TRACE set, this dry run writes its allocations there (core/allocation_trace.h):
  // `trainer estimate`'s own, not the batch searches' or the knob table's, which would overwrite it.
  bool trace_allocations = false;
};

struct MemoryEstimate {
  MemoryDevice device = MemoryDevice::cpu;
  int64_t parameters = 0;
  int64_t peak_bytes = 0;  // what train_results.json's train_peak_memory_gib measures (x 2^30)
  std::string peak_at;     // the phase holding the peak ("forward/backward of micro-batch 2 of step 1", ...)
  int64_t eval_peak_bytes =
      0;  // during an evaluation (0 without one); in peak_bytes with eval_strategy only,
          // as the final --do_eval evaluation runs after train_peak_memory_gib is taken
  // Set-up's peak (model, masters, optimizer made, as train_results.json's setup_peak_memory_gib), which
  // train_peak_memory_gib does not count.
  int64_t setup_peak_bytes = 0;
  // A checkpoint save inside training (0 with --save_strategy no), as train_results.json's
  // save_peak_memory_gib; in peak_bytes too. Weights are written one tensor at a time (a sharded run
  // gathers each fp32 master as it goes), so this is the persistent state plus the largest tensor and its
  // copy, or the optimizer's state_dict.
  int64_t save_peak_bytes = 0;
  // The same allocations under the CUDA caching allocator's rules (CachingAllocatorModel: 512-byte blocks,
  // 2 MiB small and 20 MiB large segments, best-fit reuse, splitting): the most it reserves over set-up, the
  // steps and the evaluation - torch.cuda.max_memory_reserved, our peak_reserved_memory_gib. Computed
  // for either device (the tests check it against a CPU run replayed through the same model).
  int64_t reserved_bytes = 0;
  int64_t workspace_bytes = 0;  // cuda: cuBLASLt's workspace
  // What stays allocated between steps: weights, fp32 masters, optimizer state, the step's inputs.
  int64_t held_bytes = 0;
  // --torch_compile: the arena the compiled step plans for a step's buffers (the live peak above held_bytes;
  // the run's compiled_planned_peak_memory_gib is about held_bytes + this). Under CUDA graphs it stays
  // allocated between steps: in reserved_bytes, beside the eager memory the capturing step left cached.
  int64_t compiled_arena_bytes = 0;
  // --fsdp offload on cuda: this rank's fp32 masters, gradient shard and optimizer state, in host memory
  // (none of it in peak_bytes / reserved_bytes).
  int64_t offloaded_bytes = 0;
  // What must fit in the device's memory: cuda reserved_bytes + workspace_bytes, cpu peak_bytes.
  int64_t fit_bytes() const {
    return device == MemoryDevice::cuda ? reserved_bytes + workspace_bytes : peak_bytes;
  }
  // name -> bytes, in the order printed: weights, fp32 masters, gradients, optimizer state, data batches,
  // activations and workspace at the peak (the rest of the peak).
  std::vector<std::pair<std::string, int64_t>> breakdown;
  // device_map auto (--max_memory's budgets): the run's placement ("embeddings and layer 0 on cuda:0; ...")
  // and each device's share, in the placement's order. peak_bytes, reserved_bytes and the phases above are
  // the embeddings' device's, as train_results.json's train_peak_memory_gib is; the run's
  // train_peak_memory_gib_per_device is each device's peak_bytes.
  struct DeviceShare {
    std::string device;        // the device the run uses ("cuda:1", "cpu:2", "cpu")
    int64_t weight_bytes = 0;  // the parameters placed there
    int64_t held_bytes = 0;    // between steps: weights, fp32 masters, optimizer state (and the inputs)
    int64_t peak_bytes = 0;
    int64_t reserved_bytes = 0;  // under the CUDA caching allocator's rules (a GPU's)
    // --max_memory's budget for it (0: the host's, unbounded). HF's budgets place the weights; what the step
    // needs there is peak_bytes (a GPU: reserved_bytes and cuBLASLt's workspace).
    int64_t budget_bytes = 0;
  };
  std::string device_map;
  std::vector<DeviceShare> devices;
  int64_t per_device_train_batch_size = 0, gradient_accumulation_steps = 0;
};

// The estimate for `a` (validated as `trainer train` would, less the data and tokenizer files, which it does
// not need). Throws naming the flag for a config that cannot be built. `world_size` > 1: one rank's memory
// among that many - with --fsdp shard_grad_op its slices (hybrid_shard_zero2: among its node's
// nproc_per_node ranks) of the masters, optimizer state and reduced
// gradients (the sharded optimizer dry-runs against a group that moves nothing), with full_shard also the
// parameters gathered one unit at a time and released (zero3.h); without, DDP's replicas,
// whose per-rank memory is one process's (the gradient buckets travel through host buffers outside the
// allocator). --device_map auto with --max_memory: the model placed as the run places it, each device of the
// split dry-run on a meta device of its own (meta:1 the host, where a fresh model is made; then meta:2, ...),
// in the form that device runs attention (MemoryEstimate::devices).
MemoryEstimate estimate_memory(const TrainingArguments& a, const MemoryTarget& target = {});

// "80GB" (10^9), "24GiB" (2^30), "512MB", "1.5TB", or plain bytes; throws naming `flag` otherwise.
int64_t parse_memory_size(const std::string& text, const std::string& flag);

// The largest per_device_train_batch_size (other flags as given) whose estimate fits in `budget` bytes
// (fit_bytes), searched over predictions (doubling, then bisection); 0 when not even batch 1 fits.
int64_t max_fitting_batch(const TrainingArguments& a, int64_t budget, const MemoryTarget& target = {});

// --per_device_train_batch_size auto: the largest power of two whose estimate fits in `budget` bytes, with
// gradient_accumulation_steps from --total_batch_size when given (the batch must divide it), else as given.
// batch 0 when not even 1 fits.
struct BatchChoice {
  int64_t batch = 0, accumulation = 1, peak_bytes = 0;  // peak_bytes: its fit_bytes
};
BatchChoice auto_batch(const TrainingArguments& a, int64_t budget, const MemoryTarget& target = {});

// The guide's knobs, one at a time on top of `a` (and adalomo, Adafactor updated during backward), the
// predicted peak of each (first row: `a` itself), as fit_bytes (on cuda the reserved memory and workspace).
struct KnobRow {
  std::string knob;
  int64_t peak_bytes = 0;
};
std::vector<KnobRow> knob_table(const TrainingArguments& a, const MemoryTarget& target = {});

}  // namespace tr::train
