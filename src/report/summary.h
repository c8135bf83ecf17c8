// The table a person reads at the end of `trainer train`: what ran, how fast (MFU where the device's peak
// is known), how much memory, how far the loss got against the unigram baseline, and where the files are.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace tr::report {

struct RunSummary {
  int64_t steps = 0, global_step = 0, tokens = 0;
  double seconds = 0, eval_seconds = 0, tokens_per_second = 0;
  double flops_per_token = 0;  // model FLOPs of one trained token (6N + 12 L H T, forward and backward)
  std::string device;          // "cpu", or the GPU's name ("NVIDIA H200")
  DType compute = DType::f32;
  bool tf32 = false;
  int64_t peak_bytes = 0;
  double train_loss = 0, last_logged_loss = 0;
  bool has_eval = false;
  double eval_loss = 0, unigram_baseline = 0;
  std::string output_dir, curves, logging_dir;  // empty curves/logging_dir: not written
  // Distributed runs: processes (tokens/s counts all of them; MFU and peak memory are per process), the
  // training thread's wait on collectives and rank 0's bytes handed to them per step.
  int world_size = 1;
  std::string comm_backend;
  double comm_wait_seconds = 0, comm_bytes_per_step = 0;
};

// Dense peak FLOP/s of a GPU (by its CUDA name) for matmuls in `compute` (tf32 for f32 when `tf32`); 0 when
// not known (every CPU, unlisted GPUs).
double peak_flops(const std::string& device, DType compute, bool tf32);
// A GPU's HBM bandwidth in bytes/s from its data sheet (by its CUDA name); 0 when not known.
double peak_memory_bandwidth(const std::string& device);

// The table, one "name  value" row per line.
std::string summary_table(const RunSummary& s);

}  // namespace tr::report
