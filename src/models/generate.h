// Token generation with a KV cache: greedy, or sampling with temperature, top-k and top-p; token ids in,
// token ids out. Without the cache every step recomputes the whole sequence (the reference the cache
// matches).
#pragma once
#include <optional>

#include "models/causal_lm.h"

namespace tr::models {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  bool do_sample = false;  // false: greedy (argmax)
  double temperature = 1.0;
  int64_t top_k = 0;   // 0: off
  double top_p = 1.0;  // 1: off
  uint64_t seed = 42;
  std::optional<int64_t> eos_token_id;  // a finished row repeats it until all rows finish
  bool use_cache = true;
};

// Throws naming the flag (HF's GenerationConfig names) when an option is out of its range.
void check_generate_options(const GenerateOptions& opts);

// input_ids int64 [B, T] -> [B, T + generated]. Runs without recording gradients.
Tensor generate(CausalLM& model, const Tensor& input_ids, const GenerateOptions& opts = {});

// Picks a token from one row of logits (the sampling rules above); `u` is a uniform draw in [0, 1).
int64_t choose_token(const std::vector<double>& logits, const GenerateOptions& opts, double u);

}  // namespace tr::models
