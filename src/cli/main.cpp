// The `trainer` command line: train (no arguments: the default run), eval, estimate, generate, tokenize,
// plot, info, flags, version, replay-allocations and launch, each subcommand a class of its options and its
// run. Only this layer exits; the library throws.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_api.h"
#include "core/allocation_trace.h"
#include "core/threads.h"
#include "cli/default_run.h"
#include "cli/flags.h"
#include "cli/stop_signals.h"
#include "data/tokenize.h"
#include "dist/env.h"
#include "dist/launcher.h"
#include "train/deepspeed_config.h"
#include "train/dist_setup.h"
#include "train/estimate.h"
#include "train/trainer.h"
#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/device_map.h"
#include "report/plot.h"
#include "report/summary.h"

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return fmt::format("{:.2f} {}", b, units[u]);
}

// `trainer info --device_map auto [--device_memory 24GB,24GB] DIR`: where from_pretrained would put each
// part, and each device's bytes (the checkpoint's dtype).
void print_placement(const std::string& dir, const std::string& device_map,
                     const std::string& device_memory) {
  using namespace tr;
  models::PretrainedOptions po;
  po.device_map = device_map;
  po.dtype = DType::f32;  // as trainer eval and generate load it (HF's default torch_dtype)
  if (!device_memory.empty()) {
    TR_CHECK(device_map == "auto", "--device_memory goes with --device_map auto");
    po.max_memory = models::parse_device_memory(device_memory, "device_memory");
  }
  const models::DevicePlacement p = models::pretrained_placement(dir, po);
  Generator g(0);
  auto meta = models::create_causal_lm(
      models::ModelConfig::from_file((std::filesystem::path(dir) / "config.json").string()), Device::meta(),
      DType::f32, g);
  const auto units = models::placement_units(*meta, DType::f32);
  std::printf("device_map        %s, float32 as eval and generate load it (%s)\n", device_map.c_str(),
              p.single()
                  ? fmt::format("all on {}", p.embeddings.str()).c_str()
                  : fmt::format("split by decoder layers over {} devices", p.devices().size()).c_str());
  for (const Device d : p.devices()) {
    std::vector<std::string> parts;
    int64_t bytes = 0;
    int first = -1, last = -1;
    const auto flush = [&] {
      if (first >= 0)
        parts.push_back(first == last ? fmt::format("layer {}", first)
                                      : fmt::format("layers {}-{}", first, last));
      first = -1;
    };
    if (p.embeddings == d) parts.push_back("embeddings"), bytes += units.front().bytes;
    for (size_t i = 0; i < p.layers.size(); ++i) {
      if (!(p.layers[i] == d)) {
        flush();
        continue;
      }
      if (first < 0) first = static_cast<int>(i);
      last = static_cast<int>(i);
      bytes += units[i + 1].bytes;
    }
    flush();
    if (p.head == d) parts.push_back("head"), bytes += units.back().bytes;
    std::printf("  %-8s %10s  %s\n", d.str().c_str(), human_bytes(static_cast<double>(bytes)).c_str(),
                fmt::format("{}", fmt::join(parts, ", ")).c_str());
  }
}

int info(const std::string& dir) {
  namespace fs = std::filesystem;
  using namespace tr;
  TR_CHECK(fs::is_directory(dir),
           "model_dir '{}': no such folder (a Hugging Face model folder: config.json + "
           "model.safetensors)",
           dir);
  auto config = models::ModelConfig::from_file((fs::path(dir) / "config.json").string());
  io::CheckpointReader ckpt(dir);
  std::map<std::string, int64_t> by_dtype;
  int64_t elems = 0;
  for (const auto& n : ckpt.names()) {
    const auto& t = ckpt.info(n);
    by_dtype[std::string(dtype_name(t.dtype))] += shape_numel(t.shape);
    elems += shape_numel(t.shape);
  }
  std::string dtypes;
  for (const auto& [d, n] : by_dtype) dtypes += (dtypes.empty() ? "" : ", ") + d;
  // Parameter count from a meta-device model: exactly what from_pretrained would build (tied weights once).
  Generator g(0);
  auto meta = models::create_causal_lm(config, Device::meta(), DType::f32, g);
  const int64_t params = meta->num_parameters();
  std::printf("model_type        %s\n", config.model_type.c_str());
  std::printf("parameters        %lld (%.1fM)\n", static_cast<long long>(params), params / 1e6);
  std::printf("dtype             %s\n", dtypes.c_str());
  std::printf("size on disk      %s (%lld tensors, %lld elements)\n",
              human_bytes(static_cast<double>(ckpt.total_bytes())).c_str(),
              static_cast<long long>(ckpt.names().size()), static_cast<long long>(elems));
  std::printf(
      "layers            %lld, hidden %lld, heads %lld (kv %lld), head_dim %lld, vocab %lld, context %lld\n",
      static_cast<long long>(config.num_layers), static_cast<long long>(config.hidden_size),
      static_cast<long long>(config.num_heads), static_cast<long long>(config.num_kv_heads),
      static_cast<long long>(config.head_dim), static_cast<long long>(config.vocab_size),
      static_cast<long long>(config.max_position_embeddings));
  std::printf("tied embeddings   %s\n", config.tie_word_embeddings ? "yes" : "no");
  return 0;
}

int tokenize(const std::string& tokenizer_path, tr::data::TokenizeOptions o) {
  auto tok = tr::tokenizers::Tokenizer::from_pretrained(tokenizer_path);
  const auto t0 = std::chrono::steady_clock::now();
  auto bar = [&](int64_t done, int64_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int width = 30, fill = total ? static_cast<int>(width * done / total) : width;
    const double rate = s > 0 ? done / s / 1e6 : 0;
    std::fprintf(stderr, "\rtokenize [%s%s] %3d%%  %.1f MB/s  ETA %.0f s", std::string(fill, '#').c_str(),
                 std::string(width - fill, '.').c_str(), total ? static_cast<int>(100 * done / total) : 100,
                 rate, rate > 0 ? (total - done) / 1e6 / rate : 0.0);
  };
  auto r = tr::data::tokenize_files(tok, o, bar);
  std::fprintf(stderr, "\n");
  std::printf(
      "documents %lld, %.2f MB -> train %lld tokens in %zu shard(s), validation %lld tokens in %zu shard(s) "
      "under %s\n",
      static_cast<long long>(r.documents), r.bytes / 1e6, static_cast<long long>(r.train_tokens),
      r.train_shards.size(), static_cast<long long>(r.val_tokens), r.val_shards.size(), o.output_dir.c_str());
  if (r.replaced_shards > 0)
    std::printf("removed %lld shard(s) of an earlier tokenization there that this one did not replace\n",
                static_cast<long long>(r.replaced_shards));
  return 0;
}

tr::report::RunSummary run_summary(const tr::train::TrainingArguments& a, const tr::train::TrainResult& r) {
  tr::report::RunSummary s;
  s.steps = r.steps;
  s.global_step = r.global_step;
  s.tokens = r.tokens;
  s.seconds = r.seconds;
  s.eval_seconds = r.eval_seconds;
  s.tokens_per_second = r.tokens_per_second;
  s.flops_per_token = r.flops_per_token;
  s.device = r.device_name;
  s.compute = a.bf16 ? tr::DType::bf16 : a.fp16 ? tr::DType::f16 : tr::DType::f32;
  s.tf32 = r.tf32;
  s.peak_bytes = r.peak_bytes;
  s.train_loss = r.train_loss;
  s.last_logged_loss = r.last_loss;
  s.has_eval = !r.evals.empty();
  if (s.has_eval) s.eval_loss = r.evals.back().loss;
  s.unigram_baseline = r.unigram_baseline;
  s.output_dir = a.output_dir;
  s.curves = r.curves;
  s.logging_dir = r.logging_dir;
  s.world_size = r.world_size;
  s.comm_backend = r.comm_backend;
  s.comm_wait_seconds = r.comm_wait_seconds;
  s.comm_bytes_per_step = static_cast<double>(r.comm_bytes) / std::max<int64_t>(1, r.steps);
  return s;
}

// `trainer estimate`: the peak memory of a training step, from a dry run on the meta device.
int estimate(tr::train::TrainingArguments a, const std::string& device_name, const std::string& memory,
             bool json, int world, int nproc_per_node) {
  const tr::train::MemoryTarget target{world, nproc_per_node, tr::train::parse_memory_device(device_name)};
  // A --deepspeed config's ZeRO stage and optimizer as flags (what `train` would run); the knob table then
  // varies those flags.
  a = tr::train::apply_deepspeed_config(a, std::max(1, world));
  a.deepspeed.clear();
  const bool cuda = target.device == tr::train::MemoryDevice::cuda;
  const int64_t budget = memory.empty() ? 0 : tr::train::parse_memory_size(memory, "device_memory");
  TR_CHECK(budget == 0 || a.device_map.empty(),
           "--device_memory {} with --device_map auto: a split's devices have --max_memory's budgets; the "
           "batch search and the knob table are one device's (drop --device_memory, or --device_map)",
           memory);
  if (a.per_device_train_batch_size == tr::train::kAutoBatch && budget > 0) {  // what `train` would pick
    const auto c = tr::train::auto_batch(a, budget, target);
    TR_CHECK(c.batch > 0, "--per_device_train_batch_size auto: not even batch 1 fits in --device_memory {}",
             memory);
    a.per_device_train_batch_size = c.batch;
    a.gradient_accumulation_steps = c.accumulation;
  } else if (a.total_batch_sequences() > 0 && a.per_device_train_batch_size > 0) {
    const int64_t total = a.total_batch_sequences();
    TR_CHECK(total % a.per_device_train_batch_size == 0,
             "--total_batch_size {} ({} sequences) is not a multiple of --per_device_train_batch_size {}",
             a.total_batch_size, total, a.per_device_train_batch_size);
    a.gradient_accumulation_steps = total / a.per_device_train_batch_size;
  }
  tr::train::MemoryTarget traced = target;
  traced.trace_allocations = true;  // (TRAINER_ALLOCATOR_TRACE: this dry run's allocations)
  const auto e = tr::train::estimate_memory(a, traced);
  const int64_t max_batch = budget > 0 ? tr::train::max_fitting_batch(a, budget, target) : 0;
  const auto knobs = budget > 0 ? tr::train::knob_table(a, target) : std::vector<tr::train::KnobRow>{};
  auto gib = [](int64_t b) {
    return fmt::format("{:>10.3f} GiB  {:>15} B", static_cast<double>(b) / (1 << 30), b);
  };
  if (json) {
    nlohmann::json b = nlohmann::json::object();
    for (const auto& [name, bytes] : e.breakdown) b[name] = bytes;
    nlohmann::json j{{"device", device_name},
                     {"world_size", world},
                     {"nproc_per_node", nproc_per_node > 0 ? nproc_per_node : world},
                     {"fsdp", a.fsdp},
                     {"parameters", e.parameters},
                     {"peak_bytes", e.peak_bytes},
                     {"peak_at", e.peak_at},
                     {"eval_peak_bytes", e.eval_peak_bytes},
                     {"setup_peak_bytes", e.setup_peak_bytes},
                     {"save_peak_bytes", e.save_peak_bytes},
                     {"held_bytes", e.held_bytes},
                     {"per_device_train_batch_size", e.per_device_train_batch_size},
                     {"gradient_accumulation_steps", e.gradient_accumulation_steps},
                     {"breakdown", b}};
    if (e.compiled_arena_bytes > 0) j["compiled_arena_bytes"] = e.compiled_arena_bytes;
    if (e.offloaded_bytes > 0) j["offloaded_bytes"] = e.offloaded_bytes;
    if (cuda) {
      j["reserved_bytes"] = e.reserved_bytes;
      j["workspace_bytes"] = e.workspace_bytes;
    }
    if (!e.devices.empty()) {  // device_map auto: each device's share, in the placement's order
      j["device_map"] = e.device_map;
      j["devices"] = nlohmann::json::array();
      for (const auto& d : e.devices) {
        nlohmann::json one{{"device", d.device},
                           {"weight_bytes", d.weight_bytes},
                           {"held_bytes", d.held_bytes},
                           {"peak_bytes", d.peak_bytes}};
        if (cuda) one["reserved_bytes"] = d.reserved_bytes;
        if (d.budget_bytes > 0) one["budget_bytes"] = d.budget_bytes;
        j["devices"].push_back(one);
      }
    }
    if (budget > 0) {
      j["device_memory"] = budget;
      j["max_per_device_train_batch_size"] = max_batch;
      for (const auto& k : knobs) j["knobs"][k.knob] = k.peak_bytes;
    }
    std::printf("%s\n", j.dump().c_str());
    if (max_batch == 0 && budget > 0) {  // the JSON is printed for scripts; the failure is said too
      std::fprintf(stderr,
                   "trainer: error: no per_device_train_batch_size fits in --device_memory %s (the JSON's "
                   "knobs give each knob's peak)\n",
                   memory.c_str());
      return 1;
    }
    return 0;
  }
  std::printf("parameters        %lld (%.1fM)\n", static_cast<long long>(e.parameters), e.parameters / 1e6);
  if (world > 1) {
    const int stage = tr::train::zero_stage(a);
    const std::string how = stage == 0 ? std::string("DDP replicas")
                                       : fmt::format("ZeRO-{} {}", stage, tr::train::fsdp_strategy(a));
    std::printf("per rank of       %d processes (%s%s)\n", world, how.c_str(),
                tr::train::hybrid_sharding(a) && nproc_per_node > 0
                    ? fmt::format(", sharded within nodes of {}", nproc_per_node).c_str()
                    : "");
  }
  for (const auto& [name, bytes] : e.breakdown) std::printf("  %-50s %s\n", name.c_str(), gib(bytes).c_str());
  if (!e.devices.empty()) {
    std::printf("device_map auto   %s\n", e.device_map.c_str());
    std::printf("  %-8s %12s %12s %12s %12s %12s\n", "device", "weights", "held", "peak",
                cuda ? "reserved" : "", "budget");
    const auto g = [](int64_t b) { return fmt::format("{:>8.3f} GiB", static_cast<double>(b) / (1 << 30)); };
    for (const auto& d : e.devices) {
      const bool gpu = d.device.starts_with("cuda");
      const int64_t need = gpu ? d.reserved_bytes + e.workspace_bytes : d.peak_bytes;
      std::printf("  %-8s %12s %12s %12s %12s %12s  %s\n", d.device.c_str(), g(d.weight_bytes).c_str(),
                  g(d.held_bytes).c_str(), g(d.peak_bytes).c_str(), gpu ? g(d.reserved_bytes).c_str() : "",
                  d.budget_bytes > 0 ? g(d.budget_bytes).c_str() : "",
                  d.budget_bytes == 0 ? ""
                  : need <= d.budget_bytes
                      ? "fits"
                      : "OVER its budget: the budgets place the weights; leave room for the step");
    }
    std::printf(
        "  (held: between steps - weights, fp32 masters, optimizer state, the step's inputs; peak: the run's "
        "train_peak_memory_gib_per_device)\n");
  }
  std::printf("peak              %s  (%s)\n", gib(e.peak_bytes).c_str(), e.peak_at.c_str());
  if (e.eval_peak_bytes > 0) std::printf("evaluation peak   %s\n", gib(e.eval_peak_bytes).c_str());
  tr::train::TrainingArguments compiled = a;
  compiled.apply_compile_defaults();  // a mode or backend alone turns compile on
  if (e.compiled_arena_bytes > 0)
    std::printf(
        "compiled arena    %s  (torch_compile: a step's buffers planned into one block%s)\n",
        gib(e.compiled_arena_bytes).c_str(),
        cuda && a.compile_device_graphs() ? "; kept between steps by the CUDA graphs, in reserved" : "");
  if (e.offloaded_bytes > 0) {
    const int local = nproc_per_node > 0 ? nproc_per_node : world;  // ranks sharing one host
    std::printf(
        "host (offload)    %s  (--fsdp offload: fp32 masters, gradient shard, optimizer state; %s for %d "
        "ranks "
        "on one host)\n",
        gib(e.offloaded_bytes).c_str(),
        fmt::format("{:.3f} GiB", static_cast<double>(e.offloaded_bytes) * local / (1 << 30)).c_str(), local);
  }
  if (e.save_peak_bytes > 0)
    std::printf("checkpoint save   %s  (the weights written one tensor at a time)\n",
                gib(e.save_peak_bytes).c_str());
  if (e.setup_peak_bytes > e.peak_bytes)
    std::printf("set-up peak       %s  (before the first step: loading the model, sharding)\n",
                gib(e.setup_peak_bytes).c_str());
  if (cuda)
    std::printf(
        "reserved          %s  (the CUDA caching allocator's segments at most; + %.0f MiB cuBLASLt "
        "workspace)\n",
        gib(e.reserved_bytes).c_str(), static_cast<double>(e.workspace_bytes) / (1 << 20));
  if (budget == 0) return 0;
  std::printf("\nwith %s of device memory (%.2f GiB)%s:\n", memory.c_str(),
              static_cast<double>(budget) / (1 << 30), cuda ? ", reserved + workspace" : "");
  for (const auto& k : knobs)
    std::printf("  %-34s %s  %5.2fx  %s\n", k.knob.c_str(), gib(k.peak_bytes).c_str(),
                static_cast<double>(k.peak_bytes) / static_cast<double>(knobs.front().peak_bytes),
                k.peak_bytes <= budget ? "fits" : "does not fit");
  TR_CHECK(
      max_batch > 0,
      "no per_device_train_batch_size fits in --device_memory {}: batch 1 needs {:.3f} GiB (table above)",
      memory,
      static_cast<double>(tr::train::estimate_memory(
                              [&] {
                                auto t = a;
                                t.per_device_train_batch_size = 1;
                                return t;
                              }(),
                              target)
                              .fit_bytes()) /
          (1 << 30));
  std::printf("largest per_device_train_batch_size that fits: %lld\n", static_cast<long long>(max_batch));
  return 0;
}

// `trainer plot`: the runs' metrics.jsonl curves in one picture.
int plot(const std::vector<std::string>& run_dirs, const std::string& output, const std::string& metrics,
         bool log_scale) {
  std::vector<tr::report::RunMetrics> runs;
  for (const auto& d : run_dirs) runs.push_back(tr::report::read_run_metrics(d));
  tr::report::PlotOptions o;
  o.log_scale_loss = log_scale;
  std::stringstream in(metrics);
  for (std::string m; std::getline(in, m, ',');)
    if (!m.empty()) o.metrics.push_back(m);
  tr::report::plot_runs(runs, o, output);
  std::printf("wrote %s (%zu run%s)\n", output.c_str(), runs.size(), runs.size() == 1 ? "" : "s");
  return 0;
}

int run_train(tr::train::TrainingArguments a, bool default_run, tr::cli::StopSignals& signals) {
  tr::train::TrainHooks hooks;
  hooks.should_stop = [&signals] { return signals.stop_requested(); };
  auto r = tr::train::train(a, hooks);
  signals.set_mode(tr::cli::FirstSignal::exit_now);   // the model is saved; a signal now just ends the sample
  if (r.interrupted) return 0;                        // the message saying how to resume was printed
  if (tr::dist::read_dist_env().rank != 0) return 0;  // rank 0 reports for the run
  std::printf("trained %lld steps in %.1f s (%.0f tokens/s): loss %.4f -> %.4f; model saved to %s\n",
              static_cast<long long>(r.steps), r.seconds, r.tokens_per_second, r.first_loss, r.last_loss,
              a.output_dir.c_str());
  if (!r.evals.empty())
    std::printf("eval_loss %.4f (perplexity %.1f) vs the unigram baseline %.4f (perplexity %.1f)\n",
                r.evals.back().loss, r.evals.back().perplexity, r.unigram_baseline,
                std::exp(r.unigram_baseline));
  std::printf("%s", tr::report::summary_table(run_summary(a, r)).c_str());
  if (default_run) {
    const std::string prompt = "Call me Ishmael.";
    std::printf("sample: %s\n",
                tr::cli::sample_text(a.output_dir, prompt, 40, true, 0.8, 40, 1.0, 1).c_str());
  }
  return 0;
}

constexpr const char* kLaunchUsage =
    "usage: trainer launch [--nnodes N] [--node_rank R] [--nproc_per_node P] [--master_addr A]\n"
    "                      [--master_port 29500] [--max_restarts 0] [--rdzv_id ID] SUBCOMMAND ARGS...\n"
    "Starts P processes of `trainer SUBCOMMAND ARGS...` on this node with torchrun's environment (RANK,\n"
    "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID;\n"
    "OMP_NUM_THREADS split across them unless set). Rank 0's output is shown as is, the others' behind\n"
    "[rank N]. SIGINT/SIGTERM: every rank finishes its step and saves a checkpoint. When a process fails,\n"
    "the others are stopped and the launcher exits 1 naming the rank - or, with --max_restarts, every\n"
    "node's group restarts together (node 0's launcher serves the rendezvous store at MASTER_ADDR:\n"
    "MASTER_PORT for all rounds) and `train` resumes from the newest checkpoint in its output_dir.\n";

// `trainer launch`: torchrun's flags, then a subcommand of ours run by every local process.
int launch_command(int argc, char** argv, tr::cli::StopSignals& signals) {
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::printf("%s", kLaunchUsage);
    return args.empty() ? 2 : 0;
  }
  auto o = tr::dist::parse_launch_args(args);
  std::error_code ec;
  o.program = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  TR_CHECK(!ec, "trainer launch: cannot find this program's path (/proc/self/exe): {}", ec.message());
  o.stop_requested = [&signals] { return signals.stop_requested(); };
  return tr::dist::launch(o);
}

// A subcommand of `trainer` (launch aside, parsed by hand): its options, bound to the fields CLI11 fills,
// and what it runs when chosen.
class Subcommand {
 public:
  virtual ~Subcommand() = default;
  bool chosen() const { return static_cast<bool>(*cmd_); }
  virtual int run(tr::cli::StopSignals& signals) = 0;

 protected:
  CLI::App* cmd_ = nullptr;
};

class InfoCommand final : public Subcommand {
 public:
  explicit InfoCommand(CLI::App& app) {
    cmd_ = app.add_subcommand("info", "print a model folder's type, parameter count, dtype and size");
    cmd_->add_option("model_dir", dir_, "a Hugging Face model folder (config.json + model.safetensors)")
        ->required();
    cmd_->add_option(
        "--device_map", device_map_,
        "print where from_pretrained puts each part: auto (HF's; split by decoder layers when the "
        "model does not fit the first device), cpu, cuda:N");
    cmd_->add_option("--device_memory", device_memory_,
                     "with --device_map auto: each GPU's budget in order, and the host's (HF's max_memory): "
                     "24GB,24GB or 0:24GB,1:24GB,cpu:64GB");
  }
  int run(tr::cli::StopSignals&) override {
    const int rc = info(dir_);
    TR_CHECK(device_memory_.empty() || !device_map_.empty(), "--device_memory goes with --device_map auto");
    if (rc == 0 && !device_map_.empty()) print_placement(dir_, device_map_, device_memory_);
    return rc;
  }

 private:
  std::string dir_, device_map_, device_memory_;
};

class VersionCommand final : public Subcommand {
 public:
  explicit VersionCommand(CLI::App& app) {
    cmd_ = app.add_subcommand("version", "print the build configuration");
  }
  int run(tr::cli::StopSignals&) override {
    std::printf("trainer.cpp; %s\n", tr::backend::cuda_summary().c_str());
    if (const std::string gpu = tr::backend::gpu_library_versions(); !gpu.empty())
      std::printf("gpu libraries: %s\n", gpu.c_str());
    std::printf("cpu libraries: %s\n", tr::backend::cpu_library_versions().c_str());
    for (tr::DType dt : {tr::DType::bf16, tr::DType::f16}) {
      const std::string note = tr::ops::gemm_precision_note(tr::Device::cpu(), dt);
      if (!note.empty()) std::printf("cpu: %s\n", note.c_str());
    }
    return 0;
  }
};

class FlagsCommand final : public Subcommand {
 public:
  explicit FlagsCommand(CLI::App& app) {
    cmd_ = app.add_subcommand("flags", "print the flag reference of train and eval (markdown)");
  }
  int run(tr::cli::StopSignals&) override {
    std::printf("%s", tr::train::flags_markdown().c_str());
    return 0;
  }
};

class TrainCommand final : public Subcommand {
 public:
  explicit TrainCommand(CLI::App& app) {
    cmd_ = app.add_subcommand(
        "train",
        "train or fine-tune a causal LM (HF TrainingArguments names; no arguments: the default run)");
    tr::cli::add_training_flags(cmd_, flags_);
  }
  int run(tr::cli::StopSignals& signals) override {
    // No model, data or args file: the default run (its settings can still be changed by flags).
    const bool default_run = flags_.args_file.empty() && !flags_.given("model_name_or_path") &&
                             !flags_.given("config_name") && !flags_.given("model_type") &&
                             !flags_.given("train_file");
    if (default_run) tr::cli::ensure_default_data();
    auto a = flags_.resolve(default_run ? tr::cli::default_run_arguments() : tr::train::TrainingArguments{});
    // The default run may replace its own out/default, never a folder the user named.
    if (default_run && flags_.given("output_dir") && !flags_.given("overwrite_output_dir"))
      a.overwrite_output_dir = false;
    if (default_run)
      if (const std::string note = tr::cli::choose_default_precision(
              a, flags_.given("bf16") || flags_.given("fp16"), flags_.given("max_steps"));
          !note.empty())
        std::fprintf(stderr, "trainer: %s\n", note.c_str());
    return run_train(a, default_run, signals);
  }

 private:
  tr::cli::TrainingFlags flags_;
};

class EvalCommand final : public Subcommand {
 public:
  explicit EvalCommand(CLI::App& app) {
    cmd_ = app.add_subcommand("eval", "evaluate a model folder: eval_loss and perplexity");
    tr::cli::add_training_flags(cmd_, flags_);
  }
  int run(tr::cli::StopSignals&) override {
    auto a = flags_.resolve();
    auto r = tr::train::evaluate_command(a);
    if (tr::dist::read_dist_env().rank != 0) return 0;  // rank 0 reports for the group
    std::printf(
        "eval_loss %.4f  perplexity %.2f  (%lld sequences, %lld tokens, %.1f s); wrote "
        "%s/eval_results.json\n",
        r.loss, r.perplexity, static_cast<long long>(r.samples), static_cast<long long>(r.tokens), r.seconds,
        a.output_dir.c_str());
    return 0;
  }

 private:
  tr::cli::TrainingFlags flags_;
};

class EstimateCommand final : public Subcommand {
 public:
  explicit EstimateCommand(CLI::App& app) {
    cmd_ = app.add_subcommand(
        "estimate",
        "the peak memory of a training step before running it (train's flags; no data, no weights)");
    tr::cli::add_training_flags(cmd_, flags_);
    cmd_->add_option(
        "--device", device_,
        "whose memory: cpu, or cuda (the CUDA caching allocator's reserved segments and cuBLASLt's "
        "workspace)");
    cmd_->add_flag("--json", json_, "one JSON object instead of the table");
    cmd_->add_option(
            "--world_size", world_,
            "processes training together: one rank's memory (with --fsdp shard_grad_op or full_shard "
            "its shard)")
        ->check(CLI::Range(1, 1 << 20));
    cmd_->add_option("--nproc_per_node", nproc_,
                     "processes per node of --world_size (torchrun's name; default: all on one node): "
                     "hybrid_shard and hybrid_shard_zero2 shard within a node")
        ->check(CLI::Range(1, 1 << 20));
    cmd_->add_option("--device_memory", memory_,
                     "memory to fit in (80GB, 24GiB): the largest batch that fits and what each knob buys");
  }
  // The flags estimate adds to train's, for the unknown-flag suggestions.
  static std::vector<std::string> own_flags() {
    return {"device", "json", "device_memory", "world_size", "nproc_per_node"};
  }
  int run(tr::cli::StopSignals&) override {
    return estimate(flags_.resolve(), device_, memory_, json_, world_, nproc_);
  }

 private:
  tr::cli::TrainingFlags flags_;
  std::string device_ = "cpu", memory_;
  bool json_ = false;
  int world_ = 1, nproc_ = 0;
};

class GenerateCommand final : public Subcommand {
 public:
  explicit GenerateCommand(CLI::App& app) {
    cmd_ = app.add_subcommand("generate", "continue a prompt with a model folder");
    cmd_->add_option("--model_name_or_path", model_, "HF model folder (with tokenizer.json)")->required();
    cmd_->add_option("--prompt", prompt_, "text to continue")->required();
    cmd_->add_option("--max_new_tokens", max_new_tokens_);
    cmd_->add_option("--do_sample", do_sample_, "sample instead of greedy")
        ->expected(0, 1)
        ->default_str("true");
    cmd_->add_option("--temperature", temperature_);
    cmd_->add_option("--top_k", top_k_);
    cmd_->add_option("--top_p", top_p_);
    cmd_->add_option("--seed", seed_);
    cmd_->add_option(
        "--device_map", device_map_,
        "from_pretrained's: auto (split by decoder layers across the GPUs, then the host, when the "
        "model does not fit the first), or a device");
    cmd_->add_option(
        "--device_memory", device_memory_,
        "with --device_map auto: each GPU's budget, then the host's (24GB,24GB or 0:24GB,cpu:64GB)");
  }
  int run(tr::cli::StopSignals&) override {
    std::printf("%s\n", tr::cli::sample_text(model_, prompt_, max_new_tokens_, do_sample_, temperature_,
                                             top_k_, top_p_, seed_, device_map_, device_memory_)
                            .c_str());
    return 0;
  }

 private:
  std::string model_, prompt_, device_map_, device_memory_;
  int64_t max_new_tokens_ = 50, top_k_ = 0;
  double temperature_ = 1.0, top_p_ = 1.0;
  bool do_sample_ = false;
  uint64_t seed_ = 42;
};

class PlotCommand final : public Subcommand {
 public:
  explicit PlotCommand(CLI::App& app) {
    cmd_ = app.add_subcommand("plot", "draw runs' training curves (metrics.jsonl) into a PNG or SVG");
    cmd_->add_option("run_dirs", runs_, "trainer output_dirs (or metrics.jsonl files), overlaid")->required();
    cmd_->add_option("--output", output_, "the picture: FILE.png or FILE.svg (default training_curves.png)");
    cmd_->add_option("--metrics", metrics_,
                     "comma-separated panels (default: loss,eval_loss,learning_rate,grad_norm,"
                     "tokens_per_second, those logged)");
    cmd_->add_flag("--log_scale", log_, "loss panels on a log axis");
  }
  int run(tr::cli::StopSignals&) override { return plot(runs_, output_, metrics_, log_); }

 private:
  std::vector<std::string> runs_;
  std::string output_ = "training_curves.png", metrics_;
  bool log_ = false;
};

class TokenizeCommand final : public Subcommand {
 public:
  explicit TokenizeCommand(CLI::App& app) {
    cmd_ = app.add_subcommand("tokenize", "text files -> llm.c token shards (train_*.bin, val_*.bin)");
    cmd_->add_option("--tokenizer_name_or_path", tokenizer_, "tokenizer.json, or a folder with one")
        ->required();
    cmd_->add_option(
            "--input", o_.inputs,
            "data files or glob patterns: .txt (a document each), .jsonl/.json/.csv/.tsv (a document "
            "per row), also .gz/.zst")
        ->required();
    cmd_->add_option("--output_dir", o_.output_dir, "where the shards go")->required();
    cmd_->add_option("--validation_split_percentage", o_.validation_split_percentage,
                     "percent of the token stream (from its start) for validation shards");
    cmd_->add_option("--shard_size", o_.shard_tokens, "tokens per shard (default 100M)");
    cmd_->add_option("--num_proc", o_.threads, "threads (default: all)");
    cmd_->add_option("--text_column_name", o_.documents.text_column,
                     "the column of .jsonl/.json/.csv/.tsv inputs holding the text (default: text, else the "
                     "first)");
  }
  int run(tr::cli::StopSignals&) override { return tokenize(tokenizer_, o_); }

 private:
  std::string tokenizer_;
  tr::data::TokenizeOptions o_;
};

class ReplayCommand final : public Subcommand {
 public:
  explicit ReplayCommand(CLI::App& app) {
    cmd_ = app.add_subcommand(
        "replay-allocations",
        "replay an allocation trace (TRAINER_ALLOCATOR_TRACE=FILE on train or estimate) through the CUDA "
        "caching allocator's model: peak bytes and reserved bytes, as JSON");
    cmd_->add_option("trace", trace_, "the trace file")->required();
  }
  int run(tr::cli::StopSignals&) override {
    const tr::TraceReplay r = tr::replay_allocation_trace(trace_);
    std::printf("%s\n", nlohmann::json{{"events", r.events},
                                       {"allocations", r.allocations},
                                       {"peak_bytes", r.peak_bytes},
                                       {"peak_reserved_bytes", r.peak_reserved_bytes}}
                            .dump()
                            .c_str());
    return 0;
  }

 private:
  std::string trace_;
};

// Unknown train/eval/estimate flags get a suggestion (CLI11 only says "not expected"): empty when none.
std::string unknown_flags(int argc, char** argv) {
  const std::string sub = argc >= 2 ? argv[1] : "";
  if (sub != "train" && sub != "eval" && sub != "estimate") return "";
  auto names = tr::train::argument_names();
  if (sub == "estimate") {
    const auto own = EstimateCommand::own_flags();
    names.insert(names.end(), own.begin(), own.end());
  }
  return tr::cli::unknown_flag_message(std::vector<std::string>(argv + 2, argv + argc), names);
}

// The chosen subcommand, run; the library's errors become one message and exit status 1.
int run_chosen(const std::vector<std::unique_ptr<Subcommand>>& commands, tr::cli::StopSignals& signals) {
  try {
    for (const auto& c : commands)
      if (c->chosen()) return c->run(signals);
  } catch (const nlohmann::json::exception& e) {
    // Defense in depth: every file is validated where it is read, so this is a bug; the JSON library's own
    // wording names no file or field and is not shown.
    std::fprintf(stderr,
                 "trainer: error: internal error: a JSON value was read unchecked (%d); please report it\n",
                 e.id);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread of ours exists, only this object's thread takes SIGINT/SIGTERM/SIGHUP (see
  // stop_signals.cpp for the heap corruption a handler caused). `train`: the step in flight finishes, a
  // checkpoint is saved and the exit status is 0; other subcommands end by the signal.
  // `launch`: the first signal is forwarded to the ranks, which finish their step and save.
  const std::string first_arg = argc >= 2 ? argv[1] : "";
  tr::cli::StopSignals signals(first_arg == "train"    ? tr::cli::FirstSignal::request_stop
                               : first_arg == "launch" ? tr::cli::FirstSignal::forward
                                                       : tr::cli::FirstSignal::exit_now);
  try {
    tr::check_omp_num_threads_env();  // before any parallel region: libgomp fails to start threads by
                                      // crashing
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer: error: %s\n", e.what());
    return 1;
  }
  if (first_arg == "launch") {
    try {
      return launch_command(argc, argv, signals);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "trainer: error: %s\n", e.what());
      return 1;
    }
  }
  CLI::App app{"trainer: train GPT-2 and Llama models in Hugging Face format, without Python"};
  app.require_subcommand(1);
  app.add_subcommand("launch", "run a subcommand in N processes (torchrun's flags; trainer launch --help)");
  std::vector<std::unique_ptr<Subcommand>> commands;  // in the order --help lists them
  commands.push_back(std::make_unique<InfoCommand>(app));
  commands.push_back(std::make_unique<VersionCommand>(app));
  commands.push_back(std::make_unique<FlagsCommand>(app));
  commands.push_back(std::make_unique<TrainCommand>(app));
  commands.push_back(std::make_unique<EvalCommand>(app));
  commands.push_back(std::make_unique<EstimateCommand>(app));
  commands.push_back(std::make_unique<GenerateCommand>(app));
  commands.push_back(std::make_unique<PlotCommand>(app));
  commands.push_back(std::make_unique<TokenizeCommand>(app));
  commands.push_back(std::make_unique<ReplayCommand>(app));
  if (const std::string msg = unknown_flags(argc, argv); !msg.empty()) {
    std::fprintf(stderr, "trainer %s: %s\n", argv[1], msg.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return run_chosen(commands, signals);
}
