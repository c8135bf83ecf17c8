// The training loop around a TrainStep (train_step.h): data -> model -> optimizer with HF's
// accumulation-exact loss normalization, mixed precision (fp32 masters, fp16 loss scaling), gradient
// clipping, LR schedules, evaluation, progress bar and JSON-lines metrics, checkpoint-N saves with bit-exact
// resume, auto_find_batch_size and torch_empty_cache_steps. A finished run leaves HF's files in output_dir:
// the model and tokenizer, train_results.json, eval_results.json, all_results.json, trainer_state.json.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "train/args.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/train_step.h"

namespace tr::train {

struct TrainResult {
  int64_t steps = 0;           // optimizer steps run by this call
  std::vector<double> losses;  // per optimizer step run by this call
  double first_loss = 0, last_loss = 0, train_loss = 0, seconds = 0, tokens_per_second = 0;
  bool interrupted = false;
  std::string last_checkpoint;
  std::vector<EvalResult> evals;  // every evaluation, in order (the final one last)
  int64_t skipped_steps = 0;      // fp16 steps skipped for inf/nan gradients
  int64_t compiled_shapes = 0;    // torch_compile: step shapes captured and replayed (a plan each)
  // torch_compile: the peak of the replayed steps as planned at their captures, and as measured (equal when
  // the plan is right; the capture steps run eagerly, with eager's peak)
  int64_t planned_peak_bytes = 0, replayed_peak_bytes = 0;
  int64_t device_graph_captures = 0;  // torch_compile on a GPU: CUDA graphs captured
  int64_t cache_releases = 0;         // torch_empty_cache_steps releases
  int64_t cache_bytes_released = 0;
  int64_t per_device_train_batch_size = 0, gradient_accumulation_steps = 0;  // after auto_find_batch_size
  int64_t batch_retries = 0;     // auto_find_batch_size: runs restarted after an out-of-memory
  int64_t peak_bytes = 0;        // the training device's allocator peak during training
  int64_t setup_peak_bytes = 0;  // and before it: loading the model, sharding, resuming
  int64_t save_peak_bytes = 0;   // the most during a checkpoint save inside training (0: none saved)
  // A model split by device_map: each device's allocator peak during training, in the placement's order.
  std::vector<std::pair<std::string, int64_t>> device_peak_bytes;
  double unigram_baseline = 0;  // eval-set cross-entropy of the train-set unigram model (with an eval)
  int64_t tokens = 0, global_step = 0;
  double eval_seconds = 0;       // evaluation time, kept out of `seconds`
  double flops_per_token = 0;    // model FLOPs per trained token (6N + 12 L H T)
  std::string device_name;       // "cpu" or the GPU's name
  bool tf32 = false;             // f32 matmuls read TF32 inputs (--tf32, or compile's default on a GPU)
  std::string curves;            // output_dir/training_curves.png when drawn
  std::string logging_dir;       // TensorBoard's folder when --report_to tensorboard
  int world_size = 1;            // processes that trained together (DDP)
  std::string comm_backend;      // their collectives' library (gloo)
  double comm_wait_seconds = 0;  // DDP: time the training thread waited on collectives
  int64_t comm_bytes = 0;        // DDP: this rank's bytes handed to collectives during training
  std::vector<int64_t> rank_peak_bytes, rank_optimizer_bytes, rank_setup_peak_bytes,
      rank_save_peak_bytes;  // distributed: every rank's, by rank
};

struct TrainHooks {
  // Polled after every optimizer step (the CLI sets it from SIGINT/SIGTERM): when it returns true, a
  // checkpoint of that step is written and train() returns with `interrupted` set.
  std::function<bool()> should_stop;
  // Called between the files of every checkpoint save (tests simulate a crash there).
  SaveProbe save_probe;
  // Called with each micro-batch's labels before its forward (tests inspect the data order).
  std::function<void(int64_t step, const Tensor& input_ids)> on_micro_batch;
  // Called after the backward of every step with the model's parameters (tests poison a gradient there to
  // exercise the fp16 overflow path).
  std::function<void(int64_t step, const nn::ParamList& model_params)> after_backward;
};

TrainResult train(const TrainingArguments& args, const TrainHooks& hooks = {});

}  // namespace tr::train
