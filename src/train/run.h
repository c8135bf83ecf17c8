// The run behind train() (trainer.h): its set-up in run_setup.cpp, its loop and files in trainer.cpp.
// Internal to the train layer.
#pragma once
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "dist/process_group.h"
#include "models/causal_lm.h"
#include "optim/optimizer.h"
#include "report/tensorboard.h"
#include "tokenizers/tokenizer.h"
#include "train/checkpoint.h"
#include "train/deepspeed_config.h"
#include "train/dist_setup.h"
#include "train/lr_schedule.h"
#include "train/metrics_log.h"
#include "train/mixed_precision.h"
#include "train/schedule.h"
#include "train/setup.h"
#include "train/train_step.h"
#include "train/trainer.h"
#include "train/zero3.h"

namespace tr::train::detail {

using clock = std::chrono::steady_clock;

// Checked: a full disk is an error naming the file and the reason, never a silently truncated result.
void write_json(const std::filesystem::path& p, const nlohmann::json& j);
// The checkpoint --resume_from_checkpoint names ("true": the newest in output_dir), or "" for a fresh run.
std::string resume_dir(const TrainingArguments& a);

// One call of train(): what is set up before the first step (model, data, optimizer, resumed state:
// run_setup.cpp) and the loop around the step - logging, evaluation, saving, stopping - and the files of a
// finished run (trainer.cpp).
class Run {
 public:
  // `group`: the ranks of a distributed run (null: one process). Rank 0 alone writes files and prints.
  Run(const TrainingArguments& a, const TrainHooks& hooks, dist::ProcessGroup* group);
  TrainResult train();

 private:
  // The set-up, in order (run_setup.cpp).
  void start();
  std::optional<models::DeferredModel> build_model(int stage);
  void build_optimizer(int stage, std::optional<models::DeferredModel>& deferred);
  void open_logs();
  void use_deepspeed_config();
  std::unique_ptr<data::DataLoader> make_loader();
  void resume();
  void announce() const;
  std::vector<data::Batch> next_micro_batches();
  void after_step(int64_t step, const StepResult& s, double lr, int64_t start_step);
  // `scheduled`: an evaluation of the loop (eval_strategy), which tracks the best metric and steps
  // reduce_lr_on_plateau; returns whether it found a new best. (eval_on_start and the final do_eval do
  // neither, as HF's.)
  bool evaluate_at(int64_t step, bool scheduled);
  bool track_best(const nlohmann::json& metrics, int64_t step);
  bool final_model_is_best();
  void finish_with_best();
  void log(const nlohmann::json& entry);
  void save();
  void save_files();
  ShardedOptimizer* gathered_masters() const;
  void remove_stale_checkpoints() const;
  StepOptions step_options() const;
  void announce_compile(const StepOptions& so) const;
  void collect_results(const TrainStep& step_fn);
  nlohmann::json results_json() const;
  void finish();
  void draw_curves();
  bool stop_requested();

  const TrainingArguments& a_;
  const TrainHooks& hooks_;
  dist::ProcessGroup* group_;
  bool main_;                                 // rank 0 (or the only process)
  std::optional<tokenizers::Tokenizer> tok_;  // none: token shards without a tokenizer
  std::string resume_;
  Device dev_;
  Generator init_gen_;
  std::unique_ptr<models::CausalLM> model_;
  int64_t vocab_ = 0;
  Streams streams_;
  std::unique_ptr<data::DataLoader> loader_;
  Schedule sched_;
  DType compute_ = DType::f32;
  bool half_weights_ = false;  // --torch_dtype bfloat16: no fp32 masters
  std::unique_ptr<MixedPrecision> mp_;
  HybridGroups hybrid_;  // hybrid sharding: the node's shard group and the replicas across nodes
  std::unique_ptr<optim::Optimizer> opt_;
  std::unique_ptr<FullShard> full_;  // ZeRO-3: the model's layer hooks (destroyed before the model is used)
  TrainerState st_;
  std::unique_ptr<LrSchedule> lr_;     // --lr_scheduler_type with its kwargs
  std::optional<DeepSpeedConfig> ds_;  // --deepspeed's config, read once (its schedule, scaler, optimizer)
  double ds_grad_norm_ =
      0;  // under --deepspeed: the last applied step's norm (DeepSpeed's _global_grad_norm)
  Generator dropout_gen_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<report::TensorBoardLog> tb_;  // with --report_to tensorboard
  std::unique_ptr<StepWindow> window_;
  TrainResult r_;
  double eval_seconds_ = 0;  // kept out of the training throughput
  bool nan_noted_ = false;   // a non-finite step loss was filtered and said so
  int64_t tokens_ = 0;
  clock::time_point train_start_;
};

}  // namespace tr::train::detail
