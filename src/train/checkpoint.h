// checkpoint-N folders as HF lays them out (SEMANTICS.md), with safetensors/JSON instead of pickles: model
// (fp32 weights), optimizer.safetensors, scheduler.json, scaler.json (fp16), rng_state.json,
// trainer_state.json (global step, epoch, data position, log history), training_args.json, tokenizer.json.
// Written into a temporary folder and renamed, so a crash at any moment leaves the last complete one intact.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "data/loader.h"
#include "models/causal_lm.h"
#include "optim/optimizer.h"
#include "tokenizers/tokenizer.h"
#include "train/args.h"
#include "train/mixed_precision.h"

namespace tr::train {

// Everything a checkpoint restores besides the weights.
struct TrainerState {
  int64_t global_step = 0;
  int64_t scheduler_step = 0;  // optimizer steps that ran (fp16 skips do not step the scheduler)
  int64_t skipped_steps = 0;
  data::LoaderPosition position;
  Generator::State dropout_rng;
  nlohmann::json log_history = nlohmann::json::array();
  double best_metric = 0;
  std::string best_model_checkpoint;
  bool has_best = false;
  int64_t best_global_step = 0;       // the step whose evaluation gave best_metric (0: none)
  int64_t num_input_tokens_seen = 0;  // every rank's input tokens trained on (HF's TrainerState field)
  nlohmann::json plateau;             // reduce_lr_on_plateau's state (null for the other schedules)
  int64_t train_batch_size = 0, gradient_accumulation_steps = 0;
  int64_t world_size = 1;    // processes that trained (each with train_batch_size sequences per micro-batch)
  int64_t train_tokens = 0;  // size of the training stream (0: unknown); resume checks it is the same data
};

// `stage` is called between the files of a save ("model", "optimizer", "state", "rename"): tests use it to
// simulate a crash mid-save.
using SaveProbe = std::function<void(const std::string& stage)>;

class ShardedOptimizer;

// The fp32 weights a save writes (HF saves fp32 under autocast): mixed precision's masters, or, with
// `gathered` (a ZeRO run whose fp32 masters are whole nowhere: ZeRO-2/3 under mixed precision, ZeRO-3 in
// fp32), each parameter gathered onto the group's rank 0 as it is written - every other rank of the group
// calls take_part_in_save meanwhile. Null: the parameters themselves are the fp32 weights.
std::optional<models::SavedWeights> saved_weights(const MixedPrecision& mp, ShardedOptimizer* gathered);
// A rank that does not write: its part of every parameter's gather, in the writer's order.
void take_part_in_save(ShardedOptimizer& gathered);

// Writes output_dir/checkpoint-{global_step} (the weights: `weights`, else the parameters) and rotates
// (save_total_limit keeps the newest, and the best when one is tracked). Returns the folder. `others` runs
// once every file of this process is in the staging folder, before it is renamed: a sharded run's other
// ranks add their optimizer.rank-K.safetensors there.
// `tok` null: a run on token shards without a tokenizer (the checkpoint then has no tokenizer files).
std::string save_checkpoint(models::CausalLM& model, const models::SavedWeights* weights, MixedPrecision& mp,
                            const optim::Optimizer& opt, const tokenizers::Tokenizer* tok,
                            const TrainerState& state, const TrainingArguments& args,
                            const SaveProbe& probe = {}, const std::function<void()>& others = {});
// The folder a save of `global_step` is staged in before its rename.
std::string checkpoint_staging_dir(const std::string& output_dir, int64_t global_step);

// Checks that `dir` holds every file of a checkpoint and reads the non-weight state; errors name the file
// and field. The optimizer state is loaded into `opt`, the scaler into `mp`.
// `with_tokenizer`: the checkpoint must hold tokenizer.json (false for a run without a tokenizer).
TrainerState load_checkpoint_state(const std::string& dir, optim::Optimizer& opt, MixedPrecision& mp,
                                   bool with_tokenizer = true);

// N of a checkpoint-N folder name, or -1.
int64_t checkpoint_step(const std::string& name);

// Deletes every checkpoint-N folder in output_dir but `kept` (HF's end of a run with save_total_limit 1 and
// a best checkpoint).
void keep_only_checkpoint(const std::string& output_dir, const std::string& kept);

// Copies a checkpoint's model files (config.json, generation_config.json, model*.safetensors and the index)
// into `to`, replacing the weights there (load_best_model_at_end's final model).
void copy_model_files(const std::string& from, const std::string& to);

// Newest checkpoint-N folder in dir (complete or not), or "".
std::string latest_checkpoint(const std::string& dir);

// A JSON file that must hold an object; throws naming the file when it is missing or corrupt.
nlohmann::json read_json_file(const std::string& path);

// trainer_state.json's train_batch_size and gradient_accumulation_steps, validated (both required).
std::pair<int64_t, int64_t> read_batch_split(const nlohmann::json& trainer_state, const std::string& path);

// Whether a metrics.jsonl line survives a resume at `global_step`: a record of a step up to it, or one
// without a step. A line cut short by a kill, or any other unreadable line, is dropped.
bool metrics_line_kept(const std::string& line, int64_t global_step);

}  // namespace tr::train
