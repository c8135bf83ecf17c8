// The training loop (first version): data -> model -> AdamW with HF's accumulation-exact loss normalization,
// gradient clipping, learning-rate schedule, progress bar and JSON-lines metrics; the final model, tokenizer
// and train_results.json are saved in output_dir as HF does. Checkpoints, resume, evaluation and mixed
// precision come with the rest of the Trainer issue.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "train/args.h"

namespace tr::train {

struct TrainResult {
  int64_t steps = 0;
  std::vector<double> losses;  // per optimizer step run by this call
  double first_loss = 0, last_loss = 0, train_loss = 0, seconds = 0, tokens_per_second = 0;
  bool interrupted = false;
  std::string last_checkpoint;
};

// should_stop is polled after every optimizer step (the CLI sets it from SIGINT/SIGTERM): when it returns
// true, a checkpoint of that step is written and train() returns with `interrupted` set.
struct TrainHooks {
  std::function<bool()> should_stop;
};

TrainResult train(const TrainingArguments& args, const TrainHooks& hooks = {});

}  // namespace tr::train
