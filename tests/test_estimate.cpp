// `trainer estimate` (issue 13): the meta-device dry run predicts the peak a real CPU run measures
// (train_peak_memory_gib x 2^30), exactly, across models, precisions, optimizers, checkpointing,
// accumulation, loader workers and evaluation - per device for a device_map split; the batch search and the
// knob table agree with real runs.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>

#include "core/allocator.h"
#include "core/caching_allocator.h"
#include "core/error.h"
#include "train/estimate.h"
#include "train/trainer.h"
#include "train_scratch.h"

using namespace tr;

namespace {

struct EstimateCase {
  const char* name;
  bool llama;
  void (*setup)(train::TrainingArguments&);
};

const char* kLlama =
    R"({"model_type": "llama", "vocab_size": 50257, "hidden_size": 32, "intermediate_size": 64,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
  "tie_word_embeddings": false})";

class EstimateMatchesRun : public ::testing::TestWithParam<EstimateCase> {};

TEST_P(EstimateMatchesRun, PeakBytesExactly) {
  const auto& c = GetParam();
  Scratch s(std::string("estimate_") + c.name);
  if (c.llama) std::ofstream(s.dir / "config.json") << kLlama;
  auto a = s.args("run");
  a.max_steps = 3;
  c.setup(a);
  const auto e = train::estimate_memory(a);
  // The same run's allocations replayed through the CUDA caching allocator's rules (a modelled device):
  // what the estimate's reserved_bytes predicts for a GPU run of this step.
  CachingAllocatorModel device;
  train::TrainResult r;
  {
    const ObserveAllocations observe(cpu_allocator(), device);
    r = train::train(a);
  }
  EXPECT_EQ(e.peak_bytes, r.peak_bytes) << c.name << ": predicted at " << e.peak_at;
  // Loader workers start prefetching during set-up, and their allocations interleave with the run's by
  // timing.
  if (a.dataloader_num_workers == 0) {
    EXPECT_EQ(e.setup_peak_bytes, r.setup_peak_bytes) << c.name;
    // The final step saves a checkpoint: one tensor at a time, then the optimizer's state_dict.
    EXPECT_GT(r.save_peak_bytes, 0) << c.name;
    EXPECT_EQ(e.save_peak_bytes, r.save_peak_bytes) << c.name;
    EXPECT_EQ(e.reserved_bytes, device.stats().peak_reserved_bytes) << c.name;
    EXPECT_GE(e.reserved_bytes, e.peak_bytes) << c.name;
  }
  EXPECT_GT(e.parameters, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, EstimateMatchesRun,
    ::testing::Values(EstimateCase{"gpt2_fp32_adamw", false, [](train::TrainingArguments&) {}},
                      EstimateCase{"gpt2_bf16_checkpointing", false,
                                   [](train::TrainingArguments& a) {
                                     a.bf16 = true;
                                     a.gradient_checkpointing = true;
                                   }},
                      EstimateCase{"gpt2_fp16_accumulation", false,
                                   [](train::TrainingArguments& a) {
                                     a.fp16 = true;
                                     a.gradient_accumulation_steps = 3;
                                   }},
                      EstimateCase{"gpt2_adafactor_checkpointing", false,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "adafactor";
                                     a.gradient_checkpointing = true;
                                   }},
                      EstimateCase{"gpt2_sgd_bf16", false,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "sgd";
                                     a.bf16 = true;
                                   }},
                      // Adagrad's sums exist from set-up (torch's constructor makes them); Lion's state
                      // and RMSprop's buffers from the first step.
                      EstimateCase{"gpt2_adagrad_fp16", false,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "adagrad";
                                     a.fp16 = true;
                                   }},
                      EstimateCase{"gpt2_lion_bf16", false,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "lion_32bit";
                                     a.bf16 = true;
                                   }},
                      // AdEMAMix's three states, 8-bit codes + absmax where 8-bit (embeddings in 32-bit)
                      EstimateCase{"gpt2_ademamix_8bit_bf16", false,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "ademamix_8bit";
                                     a.optim_args = "min_8bit_size=256";
                                     a.bf16 = true;
                                   }},
                      // schedulefree's z and exp_avg_sq from the first step (the switch allocates none)
                      EstimateCase{"gpt2_schedule_free_adamw_bf16", false,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "schedule_free_adamw";
                                     a.bf16 = true;
                                   }},
                      // GaLore: the low-rank moments, bases, stand-ins and scratch; the bases' SVD in host
                      // scratch
                      EstimateCase{"gpt2_galore_adamw_bf16", false,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "galore_adamw";
                                     a.optim_target_modules = "all-linear";
                                     a.optim_args = "rank=8";
                                     a.bf16 = true;
                                   }},
                      EstimateCase{"gpt2_galore_adamw_8bit", false,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "galore_adamw_8bit";
                                     a.optim_target_modules = ".*mlp.*";
                                     a.optim_args = "rank=4,proj_type=full";
                                   }},
                      // updates during backward: each gradient dropped once its parameter is updated
                      EstimateCase{"gpt2_galore_adamw_layerwise_bf16", false,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "galore_adamw_layerwise";
                                     a.optim_target_modules = "all-linear";
                                     a.optim_args = "rank=8";
                                     a.bf16 = true;
                                   }},
                      // APOLLO: its full-size scaled gradient during each target's update
                      EstimateCase{"llama_apollo_adamw", true,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "apollo_adamw";
                                     a.optim_target_modules = "all-linear";
                                     a.optim_args = "rank=4";
                                   }},
                      // --torch_dtype bfloat16: the model's own bf16 weights, AdamW's bf16 moments,
                      // gradients accumulated in bf16; Adafactor's f32 widening a group at a time; LOMO's
                      // one parameter during backward
                      EstimateCase{"gpt2_half_weights_adamw_accumulation", false,
                                   [](train::TrainingArguments& a) {
                                     a.torch_dtype = "bfloat16";
                                     a.gradient_accumulation_steps = 2;
                                   }},
                      EstimateCase{"llama_half_weights_adafactor", true,
                                   [](train::TrainingArguments& a) {
                                     a.torch_dtype = "bfloat16";
                                     a.optim = "adafactor";
                                   }},
                      EstimateCase{"gpt2_half_weights_lomo_checkpointing", false,
                                   [](train::TrainingArguments& a) {
                                     a.dtype = "bfloat16";
                                     a.optim = "lomo";
                                     a.gradient_checkpointing = true;
                                   }},
                      EstimateCase{"gpt2_adalomo_accumulation", false,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "adalomo";
                                     a.gradient_accumulation_steps = 2;
                                   }},
                      // GrokAdamW's three states, made at the first gradient; its clip allocates nothing
                      EstimateCase{"gpt2_grokadamw", false,
                                   [](train::TrainingArguments& a) { a.optim = "grokadamw"; }},
                      // StableAdamW's two moments, and its RMS term's slices during the step
                      EstimateCase{"gpt2_stable_adamw", false,
                                   [](train::TrainingArguments& a) { a.optim = "stable_adamw"; }},
                      EstimateCase{"gpt2_rmsprop_momentum", false,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "rmsprop";
                                     a.optim_args = "momentum=0.9";
                                   }},
                      EstimateCase{"gpt2_8bit_eager_attention", false,
                                   [](train::TrainingArguments& a) {
                                     a.optim = "adamw_bnb_8bit";
                                     a.attn_implementation = "eager";
                                   }},
                      EstimateCase{"gpt2_eval_steps_workers", false,
                                   [](train::TrainingArguments& a) {
                                     a.eval_strategy = "steps";
                                     a.eval_steps = 2;
                                     a.per_device_eval_batch_size =
                                         4;  // full batches: the split holds 7 blocks
                                     a.dataloader_num_workers = 2;
                                   }},
                      EstimateCase{"gpt2_save_only_model_eval_on_start", false,
                                   [](train::TrainingArguments& a) {
                                     a.save_only_model = true;  // the save writes no optimizer state
                                     a.eval_on_start = true;    // an evaluation inside the measured loop
                                     a.per_device_eval_batch_size = 4;
                                   }},
                      EstimateCase{"gpt2_prefetch_factor_workers", false,
                                   [](train::TrainingArguments& a) {
                                     a.dataloader_num_workers = 2;
                                     a.dataloader_prefetch_factor = 4;
                                   }},
                      EstimateCase{"gpt2_bf16_neftune_label_smoothing", false,
                                   [](train::TrainingArguments& a) {
                                     a.bf16 = true;
                                     a.neftune_noise_alpha = 5;  // a noise tensor beside the embeddings
                                     a.label_smoothing_factor = 0.1;
                                   }},
                      EstimateCase{"llama_fp32_adamw", true, [](train::TrainingArguments&) {}},
                      EstimateCase{"llama_neftune_checkpointing", true,
                                   [](train::TrainingArguments& a) {
                                     a.neftune_noise_alpha = 10;
                                     a.gradient_checkpointing = true;
                                   }},
                      EstimateCase{"llama_bf16_8bit_checkpointing", true,
                                   [](train::TrainingArguments& a) {
                                     a.bf16 = true;
                                     a.optim = "adamw_bnb_8bit";
                                     a.gradient_checkpointing = true;
                                   }},
                      EstimateCase{"llama_fp16_adafactor_accumulation", true,
                                   [](train::TrainingArguments& a) {
                                     a.fp16 = true;
                                     a.optim = "adafactor";
                                     a.gradient_accumulation_steps = 2;
                                   }}),
    [](const auto& info) { return std::string(info.param.name); });

// device_map auto over host partitions (cpu:N, to every op as distinct as two GPUs): the estimate places the
// model as the run does and dry-runs each device on a meta device of its own. Each device's predicted peak is
// what the split run measures there (train_peak_memory_gib_per_device), and each partition's allocations
// replayed through the CUDA caching allocator's rules reserve what the estimate predicts for that device.
struct SplitCase {
  const char* name;
  bool llama;
  const char* max_memory;  // Llama's 6.4 MB tables: one per partition; GPT-2's tied table: both on cpu:1
  void (*setup)(train::TrainingArguments&);
};

class EstimateMatchesSplitRun : public ::testing::TestWithParam<SplitCase> {};

TEST_P(EstimateMatchesSplitRun, EachDevicesPeakExactly) {
  const auto& c = GetParam();
  Scratch s(std::string("estimate_split_") + c.name);
  if (c.llama) std::ofstream(s.dir / "config.json") << kLlama;
  auto a = s.args("run");
  a.max_steps = 3;
  a.gradient_accumulation_steps = 2;
  a.device_map = "auto";
  a.max_memory = c.max_memory;
  c.setup(a);
  const auto e = train::estimate_memory(a);
  ASSERT_GE(e.devices.size(), 2u) << c.name << ": not split";
  std::vector<std::unique_ptr<CachingAllocatorModel>> models;
  std::vector<std::unique_ptr<ObserveAllocations>> observers;
  for (const auto& d : e.devices) {  // the partitions (the host's allocator also serves the data pipeline)
    models.emplace_back(d.device == "cpu" ? nullptr : std::make_unique<CachingAllocatorModel>());
    if (models.back())
      observers.push_back(
          std::make_unique<ObserveAllocations>(cpu_allocator(d.device.back() - '0'), *models.back()));
  }
  train::TrainResult r;
  r = train::train(a);
  observers.clear();
  ASSERT_EQ(r.device_peak_bytes.size(), e.devices.size()) << c.name;
  int64_t weights = 0;
  for (size_t i = 0; i < e.devices.size(); ++i) {
    const auto& d = e.devices[i];
    EXPECT_EQ(d.device, r.device_peak_bytes[i].first) << c.name << ": the placement differs";
    EXPECT_EQ(d.peak_bytes, r.device_peak_bytes[i].second) << c.name << " on " << d.device;
    if (models[i]) {
      EXPECT_EQ(d.reserved_bytes, models[i]->stats().peak_reserved_bytes) << c.name << " on " << d.device;
    }
    EXPECT_GT(d.weight_bytes, 0) << d.device;
    EXPECT_GT(d.held_bytes, d.weight_bytes) << d.device;  // and the optimizer state, at least
    EXPECT_LE(d.held_bytes, d.peak_bytes) << d.device;
    weights += d.weight_bytes;
  }
  EXPECT_EQ(weights, e.parameters * (a.bf16 || a.fp16 ? 2 : 4)) << "every parameter on one device";
  EXPECT_EQ(e.peak_bytes, r.peak_bytes) << c.name << ": the embeddings' device";
  EXPECT_EQ(e.setup_peak_bytes, r.setup_peak_bytes) << c.name;
  EXPECT_EQ(e.save_peak_bytes, r.save_peak_bytes) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    HostPartitions, EstimateMatchesSplitRun,
    ::testing::Values(
        SplitCase{"llama_adamw_eval", true, "cpu:1:7MB,cpu:2:7MB",
                  [](train::TrainingArguments& a) {
                    a.eval_strategy = "steps";
                    a.eval_steps = 2;
                    a.per_device_eval_batch_size = 4;
                  }},
        SplitCase{"gpt2_tied_bf16_checkpointing", false, "cpu:1:6500KB,cpu:2:6500KB",
                  [](train::TrainingArguments& a) {
                    a.bf16 = true;
                    a.gradient_checkpointing = true;
                  }},
        // SGD updates in place (ops::sgd): the dry run once counted the GPU's old temporaries on the CPU
        SplitCase{"llama_sgd_momentum", true, "cpu:1:7MB,cpu:2:7MB",
                  [](train::TrainingArguments& a) {
                    a.optim = "sgd";
                    a.optim_args = "momentum=0.9,nesterov=true";
                  }},
        // the host takes the rest: its part counts the loader workers' batches too
        SplitCase{"llama_host_part_8bit_workers", true, "cpu:1:7MB",
                  [](train::TrainingArguments& a) {
                    a.optim = "adamw_bnb_8bit";
                    a.fp16 = true;
                    a.dataloader_num_workers = 2;
                  }}),
    [](const auto& info) { return std::string(info.param.name); });

// torch_compile: the arena the estimate expects (the step's live peak above what stays between steps) is the
// one the compiled step plans from its trace, to within the buffers fusion elides; under CUDA graphs it stays
// allocated between steps and the reserved bytes grow by it.
TEST(Estimate, TheCompiledArenaIsTheLivePeakAboveWhatStays) {
  Scratch s("estimate_compiled");
  std::ofstream(s.dir / "config.json") << kLlama;
  auto a = s.args("run");
  a.max_steps = 2;
  a.torch_compile = true;
  a.save_strategy = "no";
  const auto e = train::estimate_memory(a);
  const auto r = train::train(a);
  ASSERT_GT(r.planned_peak_bytes, 0) << "no step was compiled";
  EXPECT_GT(e.compiled_arena_bytes, 0);
  EXPECT_EQ(e.peak_bytes, r.peak_bytes);  // the capturing step runs eagerly
  const double planned = static_cast<double>(e.held_bytes + e.compiled_arena_bytes);
  EXPECT_NEAR(planned, static_cast<double>(r.planned_peak_bytes), 1e-3 * planned);
  const train::MemoryTarget gpu{1, 0, train::MemoryDevice::cuda};
  const auto graphs = train::estimate_memory(a, gpu);
  a.torch_compile_mode = "max-autotune-no-cudagraphs";
  const auto no_graphs = train::estimate_memory(a, gpu);
  EXPECT_EQ(graphs.peak_bytes, no_graphs.peak_bytes);
  EXPECT_GE(graphs.reserved_bytes, no_graphs.reserved_bytes + graphs.compiled_arena_bytes)
      << "the graphs' arena is a segment of its own";
}

// --fsdp offload on a GPU: this rank's shard (fp32 masters, gradient shard, AdamW's two moments: 16 bytes an
// element) leaves the device's peak for host memory; on the CPU it stays where it is.
TEST(Estimate, OffloadMovesTheShardToTheHost) {
  Scratch s("estimate_offload");
  std::ofstream(s.dir / "config.json") << kLlama;
  auto a = s.args("run");
  a.bf16 = true;
  for (const char* strategy : {"shard_grad_op", "full_shard"}) {
    SCOPED_TRACE(strategy);
    a.fsdp = strategy;
    const train::MemoryTarget gpu{3, 0, train::MemoryDevice::cuda}, cpu{3, 0, train::MemoryDevice::cpu};
    const auto kept = train::estimate_memory(a, gpu);
    a.fsdp = std::string(strategy) + " offload";
    const auto moved = train::estimate_memory(a, gpu);
    const int64_t shard = (kept.parameters + 2) / 3;
    EXPECT_EQ(kept.offloaded_bytes, 0);
    EXPECT_EQ(moved.offloaded_bytes, 16 * shard + 8);  // and AdamW's step count
    EXPECT_LE(moved.peak_bytes, kept.peak_bytes - moved.offloaded_bytes + 64);
    EXPECT_GE(moved.peak_bytes, kept.peak_bytes - moved.offloaded_bytes);
    EXPECT_LT(moved.reserved_bytes, kept.reserved_bytes);
    const auto host = train::estimate_memory(a, cpu);  // a CPU run: nothing to move
    EXPECT_EQ(host.offloaded_bytes, 0);
    a.fsdp = strategy;
    EXPECT_EQ(host.peak_bytes, train::estimate_memory(a, cpu).peak_bytes);
  }
  // The knob table on a GPU ends with it: the least memory sharding gives; the CPU's has no such row.
  a.fsdp.clear();
  const auto gpu_rows = train::knob_table(a, {3, 0, train::MemoryDevice::cuda});
  ASSERT_EQ(gpu_rows.back().knob, "fsdp full_shard offload");
  for (const auto& r : gpu_rows)
    EXPECT_LT(gpu_rows.back().peak_bytes, r.peak_bytes + (&r == &gpu_rows.back()));
  for (const auto& r : train::knob_table(a, {3, 0, train::MemoryDevice::cpu}))
    EXPECT_EQ(r.knob.find("offload"), std::string::npos);
}

TEST(Estimate, ASplitIsRefusedWithoutItsBudgetsOrWithTheWrongDevices) {
  Scratch s("estimate_split_refused");
  auto a = s.args("run");
  a.device_map = "auto";
  auto message = [&](const train::MemoryTarget& t) {
    try {
      train::estimate_memory(a, t);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message({}).find("places the model over --max_memory's budgets"), std::string::npos)
      << message({});
  a.max_memory = "cpu:1:7MB,cpu:2:7MB";
  const train::MemoryTarget gpu{1, 0, train::MemoryDevice::cuda};
  EXPECT_NE(message(gpu).find("cpu:1 is a host partition, but --device cuda estimates GPUs"),
            std::string::npos)
      << message(gpu);
  a.max_memory = "24GB,24GB";
  EXPECT_NE(message({}).find("cuda:0 is a GPU: give --device cuda"), std::string::npos) << message({});
  const train::MemoryTarget ranks{2, 0, train::MemoryDevice::cuda};
  EXPECT_NE(message(ranks).find("each process would split its own replica"), std::string::npos)
      << message(ranks);
}

// Two GPUs' split of a model that fits on neither: each GPU's share under the caching allocator's rules, in
// the form a GPU runs attention (bf16 sdpa with this head dim: the flash kernels, on both).
TEST(Estimate, AGpuSplitCountsEachGpuApart) {
  Scratch s("estimate_split_gpus");
  auto a = s.args("run");
  a.bf16 = true;
  a.device_map = "auto";
  a.max_memory = "6500KB,6500KB";  // the tied table with layer 0 on cuda:0, layer 1 on cuda:1
  const train::MemoryTarget gpu{1, 0, train::MemoryDevice::cuda};
  const auto e = train::estimate_memory(a, gpu);
  ASSERT_EQ(e.devices.size(), 2u);
  EXPECT_EQ(e.devices[0].device, "cuda:0");
  EXPECT_EQ(e.devices[1].device, "cuda:1");
  EXPECT_EQ(e.device_map, "embeddings, layer 0 and the head on cuda:0; layer 1 on cuda:1");
  for (const auto& d : e.devices) EXPECT_GE(d.reserved_bytes, d.peak_bytes) << d.device;
  EXPECT_EQ(e.peak_bytes, e.devices[0].peak_bytes);
  EXPECT_EQ(e.reserved_bytes, e.devices[0].reserved_bytes);
  // cuda:1 holds one layer: its peak is the layer's own state and activations, far below cuda:0's
  EXPECT_LT(e.devices[1].peak_bytes, e.devices[0].peak_bytes / 4);
  // The same layer on a CPU device takes the fused form too: no score blocks on either, the same peak (the
  // blocked form a GPU took before its flash kernels held more).
  a.max_memory = "cpu:1:6500KB,cpu:2:6500KB";
  const auto host = train::estimate_memory(a);
  ASSERT_EQ(host.devices.size(), 2u);
  EXPECT_EQ(host.devices[1].peak_bytes, e.devices[1].peak_bytes);
}

// The CPU allocator capped at `budget` bytes beyond what this process already holds, for the scope.
struct CpuCap {
  explicit CpuCap(int64_t budget) {
    cpu_allocator().set_limit(budget + cpu_allocator().stats().current_bytes);
  }
  ~CpuCap() { cpu_allocator().set_limit(0); }
  CpuCap(const CpuCap&) = delete;
  CpuCap& operator=(const CpuCap&) = delete;
};

// The predicted peak of `a` split into batch `bs` x accumulation `effective / bs`.
int64_t split_peak(train::TrainingArguments a, int64_t bs, int64_t effective) {
  a.per_device_train_batch_size = bs;
  a.gradient_accumulation_steps = effective / bs;
  return train::estimate_memory(a).peak_bytes;
}

// The largest batch the search predicts trains under an allocator cap of that budget; one more runs out.
TEST(Estimate, TheLargestFittingBatchFitsAndTheNextDoesNot) {
  Scratch s("estimate_fit");
  auto a = s.args("run");
  a.max_steps = 2;
  a.save_strategy = "no";
  const int64_t budget = train::estimate_memory(a).peak_bytes * 3;  // room for a few times the batch
  const int64_t best = train::max_fitting_batch(a, budget);
  ASSERT_GT(best, a.per_device_train_batch_size);
  auto at = a;
  at.per_device_train_batch_size = best;
  auto over = a;
  over.per_device_train_batch_size = best + 1;
  over.output_dir += "_over";
  EXPECT_LE(train::estimate_memory(at).peak_bytes, budget);
  EXPECT_GT(train::estimate_memory(over).peak_bytes, budget);
  {
    const CpuCap cap(budget);
    EXPECT_NO_THROW(train::train(at));
    EXPECT_THROW(train::train(over), OutOfMemoryError);
  }
  EXPECT_EQ(train::max_fitting_batch(a, 1000), 0) << "nothing fits in 1000 bytes";
}

// auto_find_batch_size under a cap starts from the largest split the estimate fits: no out-of-memory first.
TEST(Estimate, AutoFindBatchSizeStartsFromThePrediction) {
  Scratch s("estimate_auto");
  auto a = s.args("run");
  a.max_steps = 2;
  a.save_strategy = "no";
  a.per_device_train_batch_size = 16;
  a.auto_find_batch_size = true;
  auto split = [&](int64_t bs) { return split_peak(a, bs, 16); };
  const int64_t budget = (split(4) + split(8)) / 2;
  ASSERT_LT(split(4), budget);
  train::TrainResult r;
  {
    const CpuCap cap(budget);
    r = train::train(a);
  }
  EXPECT_EQ(r.per_device_train_batch_size, 4);
  EXPECT_EQ(r.gradient_accumulation_steps, 4);
  EXPECT_EQ(r.batch_retries, 0);
  EXPECT_EQ(r.peak_bytes, split(4));
}

// --per_device_train_batch_size auto with --total_batch_size: the largest power of two that fits the cap, the
// accumulation making up the total.
TEST(Estimate, AutoBatchIsTheLargestFittingPowerOfTwo) {
  Scratch s("estimate_auto_pow2");
  auto a = s.args("run");
  a.max_steps = 2;
  a.save_strategy = "no";
  a.per_device_train_batch_size = train::kAutoBatch;
  a.total_batch_size = "512tokens";  // 16 sequences of 32
  EXPECT_EQ(a.total_batch_sequences(), 16);
  auto split = [&](int64_t bs) { return split_peak(a, bs, 16); };
  const int64_t budget = (split(4) + split(8)) / 2;
  const auto c = train::auto_batch(a, budget);
  EXPECT_EQ(c.batch, 4);
  EXPECT_EQ(c.accumulation, 4);
  train::TrainResult r;
  {
    const CpuCap cap(budget);
    r = train::train(a);
  }
  EXPECT_EQ(r.per_device_train_batch_size, 4);
  EXPECT_EQ(r.gradient_accumulation_steps, 4);
  EXPECT_EQ(r.peak_bytes, split(4));
  // The flag's forms, and what is refused.
  a.update_from_json({{"per_device_train_batch_size", "auto"}, {"total_batch_size", "64"}}, "args.json");
  EXPECT_EQ(a.per_device_train_batch_size, train::kAutoBatch);
  EXPECT_EQ(a.total_batch_sequences(), 64);
  EXPECT_THROW(a.update_from_json({{"per_device_train_batch_size", "many"}}, "args.json"), Error);
  auto minus_one = a;
  minus_one.per_device_train_batch_size = -1;  // an error as in HF, not another spelling of auto
  minus_one.total_batch_size.clear();
  EXPECT_THROW(minus_one.validate(), Error);
  a.block_size = 0;  // checked before it divides
  a.total_batch_size = "64tokens";
  EXPECT_THROW(a.total_batch_sequences(), Error);
  a.block_size = 32;
  for (const char* bad : {"abc", "0", "-8", "100tokens", "16 sequences"}) {
    a.total_batch_size = bad;
    EXPECT_THROW(a.total_batch_sequences(), Error) << bad;
  }
}

TEST(Estimate, KnobTableAndSizes) {
  Scratch s("estimate_knobs");
  auto a = s.args("run");
  a.per_device_train_batch_size = 8;
  const auto rows = train::knob_table(a);
  ASSERT_EQ(rows.size(), 8u);
  EXPECT_EQ(rows[0].knob, "as given");
  EXPECT_EQ(rows[0].peak_bytes, train::estimate_memory(a).peak_bytes);
  for (const auto& r : rows) EXPECT_GT(r.peak_bytes, 0) << r.knob;
  // bf16 weights without masters: less than bf16 over fp32 masters (this small step is activations: not
  // less than fp32's)
  ASSERT_EQ(rows[3].knob, "torch_dtype bfloat16");
  EXPECT_LT(rows[3].peak_bytes, rows[2].peak_bytes) << rows[2].knob;
  // adalomo: adafactor's state without the gradients held together
  ASSERT_EQ(rows[6].knob, "optim adalomo");
  EXPECT_LE(rows[6].peak_bytes, rows[5].peak_bytes) << rows[5].knob;
  EXPECT_LT(rows[7].peak_bytes, rows[0].peak_bytes) << rows[7].knob << ": half the batch holds less";
  a.fp16 = true;  // no in-backward or half-weight row where it would be refused
  for (const auto& r : train::knob_table(a)) {
    EXPECT_NE(r.knob, "optim adalomo");
    EXPECT_NE(r.knob, "torch_dtype bfloat16");
  }
  EXPECT_EQ(train::parse_memory_size("80GB", "device_memory"), 80'000'000'000);
  EXPECT_EQ(train::parse_memory_size("24GiB", "device_memory"), int64_t{24} << 30);
  EXPECT_EQ(train::parse_memory_size("1.5gb", "device_memory"), 1'500'000'000);
  EXPECT_EQ(train::parse_memory_size("4096", "device_memory"), 4096);
  for (const char* bad : {"", "lots", "80XB", "-1GB", "GB", "1e30TB", "0.5", "1e-4KB"})
    EXPECT_THROW(train::parse_memory_size(bad, "device_memory"), Error) << bad;
}

}  // namespace

// A GPU in half precision runs sdpa in the flash kernels where they cover the head dim (multiples of 8 up
// to 128) and otherwise in the blocked form (score blocks between the two GEMMs); the CPU runs the fused
// kernel. An estimate for --device cuda counts the blocked form's blocks where the GPU takes it, and none
// where it runs the flash kernels, as the CPU; in fp32 both devices run the fused kernel. (The meta walk of
// the blocked form allocates as the CPU run: test AttentionBlockedMemory.TheMetaDryRunPeaksAsTheCpuRun.) A
// small vocabulary and long blocks so that attention, not the head, sets the peak.
TEST(Estimate, AGpuEstimateCountsTheBlockedAttentionItRuns) {
  Scratch s("estimate_attention_form");
  auto a = s.args("run");
  a.block_size = 256;
  a.attn_implementation = "sdpa";
  for (int hidden : {40, 32}) {  // head dims 10 (blocked on a GPU) and 8 (flash)
    SCOPED_TRACE(hidden);
    std::ofstream(s.dir / "config.json") << R"({"model_type": "llama", "vocab_size": 64, "hidden_size": )"
                                         << hidden << R"(, "intermediate_size": 64,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256})";
    auto peak = [&](bool bf16, train::MemoryDevice d) {
      a.bf16 = bf16;
      train::MemoryTarget t;
      t.device = d;
      return train::estimate_memory(a, t).peak_bytes;
    };
    if (hidden == 40)
      EXPECT_GT(peak(true, train::MemoryDevice::cuda), 2 * peak(true, train::MemoryDevice::cpu));
    else
      EXPECT_EQ(peak(true, train::MemoryDevice::cuda), peak(true, train::MemoryDevice::cpu));
    EXPECT_EQ(peak(false, train::MemoryDevice::cuda), peak(false, train::MemoryDevice::cpu));
  }
}
