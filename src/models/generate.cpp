// Incremental decoding and token sampling.
#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tr::models {

void check_generate_options(const GenerateOptions& o) {
  // HF's GenerationConfig ranges (its names are the CLI's flags); the sampling ones only when sampling, as
  // HF's warpers (greedy decoding ignores them).
  TR_CHECK(o.max_new_tokens >= 0, "--max_new_tokens {}: expected a count >= 0", o.max_new_tokens);
  if (!o.do_sample) return;
  TR_CHECK(std::isfinite(o.temperature) && o.temperature > 0,
           "--temperature {}: expected a number > 0 when sampling", o.temperature);
  TR_CHECK(o.top_k >= 0, "--top_k {}: expected 0 (off) or a positive count", o.top_k);
  TR_CHECK(o.top_p > 0 && o.top_p <= 1, "--top_p {}: expected a number in (0, 1] (1: off)", o.top_p);
}

int64_t choose_token(const std::vector<double>& logits, const GenerateOptions& o, double u) {
  const int64_t V = static_cast<int64_t>(logits.size());
  TR_CHECK(V > 0, "generate: empty logits");
  if (!o.do_sample) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  TR_CHECK(o.temperature > 0, "generate: temperature must be positive, got {}", o.temperature);
  TR_CHECK(o.top_p > 0 && o.top_p <= 1, "generate: top_p must be in (0, 1], got {}", o.top_p);
  std::vector<int64_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  int64_t keep = V;
  if (o.top_k > 0) keep = std::min(keep, o.top_k);
  const double mx = logits[idx[0]] / o.temperature;
  std::vector<double> p(static_cast<size_t>(keep));
  double z = 0;
  for (int64_t i = 0; i < keep; ++i) z += p[i] = std::exp(logits[idx[i]] / o.temperature - mx);
  if (o.top_p < 1.0) {
    // the smallest prefix whose probability reaches top_p (at least one token), as HF's TopPLogitsWarper
    double cum = 0;
    int64_t n = 0;
    while (n < keep) {
      cum += p[n] / z;
      ++n;
      if (cum >= o.top_p) break;
    }
    keep = n;
    z = 0;
    for (int64_t i = 0; i < keep; ++i) z += p[i];
  }
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[i] / z;
    if (u < acc) return idx[i];
  }
  return idx[keep - 1];
}

Tensor generate(CausalLM& model, const Tensor& input_ids, const GenerateOptions& o) {
  TR_CHECK(input_ids.dim() == 2 && input_ids.dtype() == DType::i64 && input_ids.size(1) > 0,
           "generate: input_ids must be int64 [B, T] with T > 0, got {}", input_ids.describe());
  check_generate_options(o);
  // The positions, checked before the first token rather than at the one past the model's last position.
  // The last new token is not fed back: prompt + max_new_tokens - 1 positions are read.
  const int64_t limit = model.config().max_position_embeddings, prompt = input_ids.size(1);
  if (o.max_new_tokens > 0) {
    TR_CHECK(prompt <= limit, "the prompt has {} tokens, more than the model's {} positions", prompt, limit);
    TR_CHECK(
        o.max_new_tokens <= limit - prompt + 1,
        "--max_new_tokens {}: the prompt's {} tokens and the new ones would pass the model's {} positions; "
        "at most {} new tokens fit",
        o.max_new_tokens, prompt, limit, limit - prompt + 1);
  }
  NoGradGuard ng;
  const int64_t B = input_ids.size(0);
  std::vector<std::vector<int64_t>> seqs(static_cast<size_t>(B));
  auto ids = ops::to_vector<int64_t>(input_ids);
  const int64_t T0 = input_ids.size(1);
  for (int64_t b = 0; b < B; ++b) seqs[b].assign(ids.begin() + b * T0, ids.begin() + (b + 1) * T0);
  std::vector<bool> done(static_cast<size_t>(B), false);
  Generator gen(o.seed);
  KVCache cache;
  Tensor step_ids = ops::to_device(input_ids, model.device());
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    ForwardOptions fo;
    fo.cache = o.use_cache ? &cache : nullptr;
    if (!o.use_cache) {
      std::vector<int64_t> all;
      for (const auto& s : seqs) all.insert(all.end(), s.begin(), s.end());
      step_ids = ops::from_vector<int64_t>(all, {B, static_cast<int64_t>(seqs[0].size())}, model.device());
    }
    Tensor logits = model.forward(step_ids, fo).logits;  // [B, t, V]
    Tensor last = ops::narrow(logits, 1, logits.size(1) - 1, 1);
    const int64_t V = logits.size(2);
    auto lv = ops::to_vector<double>(last);
    const uint64_t off = gen.reserve(static_cast<uint64_t>(B));
    std::vector<int64_t> next(static_cast<size_t>(B));
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> row(lv.begin() + b * V, lv.begin() + (b + 1) * V);
      const double u = uniform_from_word(philox_word(gen.seed(), off, static_cast<uint64_t>(b)));
      next[b] = done[b] ? *o.eos_token_id : choose_token(row, o, u);
      seqs[b].push_back(next[b]);
      if (o.eos_token_id && next[b] == *o.eos_token_id) done[b] = true;
      all_done = all_done && done[b];
    }
    step_ids = ops::from_vector<int64_t>(next, {B, 1}, model.device());
    if (all_done) break;
  }
  std::vector<int64_t> flat;
  for (const auto& s : seqs) flat.insert(flat.end(), s.begin(), s.end());
  return ops::from_vector<int64_t>(flat, {B, static_cast<int64_t>(seqs[0].size())});
}

}  // namespace tr::models
