// Evaluation as HF's Trainer.evaluate for causal LMs: eval_loss = mean token cross-entropy over the blocks
// of the validation stream (group_texts semantics: the remainder shorter than a block is dropped),
// perplexity = exp(eval_loss); and the unigram baseline a trained model should beat by far.
#pragma once
#include <memory>

#include <nlohmann/json.hpp>

#include "data/shards.h"
#include "dist/process_group.h"
#include "models/causal_lm.h"
#include "train/args.h"

namespace tr::train {

struct EvalResult {
  double loss = 0, perplexity = 0, seconds = 0;
  int64_t samples = 0, tokens = 0;  // tokens: predicted (label) tokens
  nlohmann::json to_json(const std::string& prefix = "eval_") const;
};

// No gradients are recorded. Throws when the stream holds fewer tokens than one block. With a `group`, rank r
// evaluates every size()-th batch from the r-th and the sums are gathered: every rank returns the global
// result. label_smoothing: HF's label_smoothing_factor, whose eval_loss is the smoothed loss (HF's
// prediction_step calls the same compute_loss as training).
EvalResult evaluate(models::CausalLM& model, std::shared_ptr<const data::TokenStream> stream,
                    int64_t block_size, int64_t batch_size, const std::string& source,
                    dist::ProcessGroup* group = nullptr, double label_smoothing = 0);

// Cross-entropy (nats/token) of `eval` under the add-one-smoothed unigram distribution of `train`.
double unigram_cross_entropy(const data::TokenStream& train, const data::TokenStream& eval, int64_t vocab);

// `trainer eval`: loads --model_name_or_path, evaluates on --validation_file (or the validation split of
// --train_file) and writes eval_results.json into output_dir.
EvalResult evaluate_command(const TrainingArguments& args);

}  // namespace tr::train
