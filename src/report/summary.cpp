// The end-of-training table (see summary.h).
#include "report/summary.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

namespace tr::report {

double peak_flops(const std::string& device, DType compute, bool tf32) {
  // Dense tensor-core FLOP/s from NVIDIA's data sheets: {bf16/fp16, tf32, plain fp32}.
  struct Peak {
    const char* name;
    double half, tf32, f32;
  };
  static const Peak table[] = {
      {"H200", 989.4e12, 494.7e12, 66.9e12}, {"H100 PCIe", 756.0e12, 378.0e12, 51.2e12},
      {"H100", 989.4e12, 494.7e12, 66.9e12}, {"A100", 312.0e12, 156.0e12, 19.5e12},
      {"L40S", 362.1e12, 183.0e12, 91.6e12}, {"L4", 121.0e12, 60.0e12, 30.3e12},
  };
  // Whole words of the name ("NVIDIA L4" is not "NVIDIA L40S"; "H100 NVL" is not listed: unknown).
  const std::string padded = " " + device + " ";
  for (const auto& p : table) {
    const std::string n = p.name;
    for (const std::string sep : {" ", "-"})
      if (padded.find(" " + n + sep) != std::string::npos && padded.find(" H100 NVL") == std::string::npos)
        return compute == DType::f32 ? (tf32 ? p.tf32 : p.f32) : p.half;
  }
  return 0;
}

double peak_memory_bandwidth(const std::string& device) {
  struct Peak {
    const char* name;
    double bytes_per_second;
  };
  // Longest names first: "H100 PCIe" before "H100", the 80 GB A100s before the rest.
  static const Peak table[] = {
      {"H200", 4.8e12},   {"H100 PCIe", 2.0e12},        {"H100 NVL", 3.9e12},
      {"H100", 3.35e12},  {"A100-SXM4-80GB", 2.039e12}, {"A100 80GB PCIe", 1.935e12},
      {"A100", 1.555e12}, {"L40S", 0.864e12},           {"L4", 0.3e12},
  };
  const std::string padded = " " + device + " ";
  for (const auto& p : table) {
    const std::string n = p.name;
    for (const std::string sep : {" ", "-"})
      if (padded.find(" " + n + sep) != std::string::npos) return p.bytes_per_second;
  }
  return 0;
}

namespace {

std::string duration(double s) {
  if (s >= 3600) {
    const auto minutes = static_cast<int64_t>(std::llround(s / 60));  // rounded first: never "1 h 60 min"
    return fmt::format("{} h {:02} min", minutes / 60, minutes % 60);
  }
  if (s >= 120) return fmt::format("{:.1f} min", s / 60);
  return fmt::format("{:.1f} s", s);
}

}  // namespace

std::string summary_table(const RunSummary& s) {
  std::string t = "\nrun summary\n";
  auto row = [&](const char* name, const std::string& value) {
    t += fmt::format("  {:<13}{}\n", name, value);
  };
  row("steps", fmt::format("{} (global step {})", s.steps, s.global_step));
  row("tokens", fmt::format("{}", s.tokens));
  row("wall time", duration(s.seconds) +
                       (s.eval_seconds > 0 ? fmt::format(" training, {} evaluation", duration(s.eval_seconds))
                                           : std::string(" training")));
  row("tokens/s", fmt::format("{:.0f}", s.tokens_per_second) +
                      (s.world_size > 1 ? fmt::format(" ({} processes)", s.world_size) : std::string()));
  if (s.world_size > 1)
    row("DDP",
        fmt::format("{}: {:.1f} MB all-reduced per step; {:.1f}% of training time waiting on collectives",
                    s.comm_backend, s.comm_bytes_per_step / 1e6,
                    s.seconds > 0 ? 100 * s.comm_wait_seconds / s.seconds : 0.0));
  const double per_process = s.tokens_per_second / std::max(1, s.world_size);
  const double peak = peak_flops(s.device, s.compute, s.tf32);
  const std::string precision = s.compute == DType::f32    ? (s.tf32 ? "tf32" : "fp32")
                                : s.compute == DType::bf16 ? "bf16"
                                                           : "fp16";
  if (peak > 0 && s.flops_per_token > 0)
    row("MFU", fmt::format("{:.1f}% of {}'s {:.0f} TFLOP/s ({})",
                           100 * per_process * s.flops_per_token / peak, s.device, peak / 1e12, precision));
  else
    row("MFU", fmt::format("n/a: the peak FLOP/s of {} is not known ({:.3g} GFLOP/s of model math done)",
                           s.device, per_process * s.flops_per_token / 1e9));
  row("peak memory", fmt::format("{:.3f} GiB on {}{}", static_cast<double>(s.peak_bytes) / (1 << 30),
                                 s.device, s.world_size > 1 ? " (rank 0)" : ""));
  row("train loss",
      fmt::format("{:.4f} (mean of the run; last logged {:.4f})", s.train_loss, s.last_logged_loss));
  if (s.has_eval)
    row("eval loss",
        fmt::format("{:.4f} vs the unigram baseline {:.4f} (perplexity {:.1f} vs {:.1f})", s.eval_loss,
                    s.unigram_baseline, std::exp(s.eval_loss), std::exp(s.unigram_baseline)));
  row("model", s.output_dir);
  row("metrics", s.output_dir + "/metrics.jsonl");
  if (!s.curves.empty()) row("curves", s.curves);
  if (!s.logging_dir.empty())  // --logdir on the runs/ folder shows this run beside the others, as HF's docs
    row("tensorboard", fmt::format("{}  (tensorboard --logdir {})", s.logging_dir,
                                   std::filesystem::path(s.logging_dir).parent_path().string()));
  return t;
}

}  // namespace tr::report
