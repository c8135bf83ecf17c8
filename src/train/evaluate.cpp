// Evaluation loss and perplexity, the unigram baseline, and `trainer eval`; see evaluate.h.
#include "train/evaluate.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/file_writer.h"
#include "autograd/node.h"
#include "data/loader.h"
#include "train/setup.h"
#include "train/zero3.h"

namespace tr::train {

nlohmann::json EvalResult::to_json(const std::string& prefix) const {
  return {{prefix + "loss", loss},
          {prefix + "perplexity", perplexity},
          {prefix + "samples", samples},
          {prefix + "runtime", seconds},
          {prefix + "samples_per_second", seconds > 0 ? samples / seconds : 0.0},
          {prefix + "tokens", tokens}};
}

EvalResult evaluate(models::CausalLM& model, std::shared_ptr<const data::TokenStream> stream,
                    int64_t block_size, int64_t batch_size, const std::string& source,
                    dist::ProcessGroup* group, double label_smoothing) {
  TR_CHECK(stream && stream->size() >= block_size,
           "{}: {} validation tokens, fewer than one block of --block_size {}", source,
           stream ? stream->size() : 0, block_size);
  const auto t0 = std::chrono::steady_clock::now();
  data::DatasetOptions dopt;
  dopt.block_size = block_size;
  dopt.shuffle = false;
  dopt.vocab_size = model.config().vocab_size;
  if (group) {  // rank r's batch k is the single process's batch k x size() + r
    dopt.rank = group->rank();
    dopt.world_size = group->size();
    dopt.rank_slice = batch_size;
  }
  auto ds = std::make_shared<data::SequenceDataset>(stream, dopt);
  data::DataLoaderOptions lopt;
  lopt.batch_size = batch_size;
  lopt.device = model.device();
  data::DataLoader loader(ds, lopt);
  autograd::NoGradGuard no_grad;
  EvalResult r;
  double sum = 0;
  while (auto b = loader.next()) {
    if (b->epoch > 0) break;
    // This rank's slice of the last batches is empty: skipped, except under ZeRO-3, whose ranks all take
    // part in every forward's gathers (an idle row whose labels are all ignored adds nothing).
    const bool idle = b->input_ids.size(0) == 0;
    if (idle && model.layer_hooks() == nullptr) continue;
    if (idle) {
      data::Batch i = idle_batch(std::max<int64_t>(2, b->input_ids.size(1)), model.device());
      models::ForwardOptions fo;
      fo.labels = i.labels;
      fo.num_items_in_batch = 1.0;
      fo.return_logits = false;
      model.forward(i.input_ids, fo);
      continue;
    }
    models::ForwardOptions fo;
    fo.labels = b->labels;
    fo.label_smoothing = label_smoothing;
    fo.num_items_in_batch = 1.0;  // loss = sum of token losses
    fo.return_logits = false;
    sum += ops::to_device(model.forward(b->input_ids, fo).loss, Device::cpu()).item();
    r.samples += b->input_ids.size(0);
    r.tokens += b->input_ids.size(0) * (b->input_ids.size(1) - 1);
  }
  if (group) {
    double v[3] = {sum, static_cast<double>(r.samples), static_cast<double>(r.tokens)};
    group->all_reduce_sum(v, 3);
    sum = v[0];
    r.samples = static_cast<int64_t>(v[1]);
    r.tokens = static_cast<int64_t>(v[2]);
  }
  r.loss = sum / static_cast<double>(r.tokens);
  r.perplexity = std::exp(r.loss);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

double unigram_cross_entropy(const data::TokenStream& train, const data::TokenStream& eval, int64_t vocab) {
  std::vector<double> counts(static_cast<size_t>(vocab), 1.0);  // add-one smoothing
  std::vector<int64_t> buf(1 << 16);
  auto each = [&](const data::TokenStream& s, auto&& fn) {
    for (int64_t at = 0; at < s.size(); at += static_cast<int64_t>(buf.size())) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(buf.size()), s.size() - at);
      s.read(at, n, buf.data());
      for (int64_t i = 0; i < n; ++i) fn(buf[static_cast<size_t>(i)]);
    }
  };
  double total = static_cast<double>(vocab);
  each(train, [&](int64_t id) {
    counts[static_cast<size_t>(id)] += 1;
    total += 1;
  });
  double nll = 0;
  each(eval, [&](int64_t id) { nll -= std::log(counts[static_cast<size_t>(id)] / total); });
  return nll / static_cast<double>(eval.size());
}

EvalResult evaluate_command(const TrainingArguments& a) {
  namespace fs = std::filesystem;
  TR_CHECK(!a.model_name_or_path.empty(), "trainer eval: --model_name_or_path is required");
  TR_CHECK(fs::is_directory(a.model_name_or_path), "--model_name_or_path {}: no such model folder",
           a.model_name_or_path);
  TR_CHECK(!a.output_dir.empty(), "trainer eval: --output_dir is required");
  TR_CHECK(!a.validation_file.empty() || !a.train_file.empty(),
           "trainer eval: give --validation_file (or --train_file to evaluate its validation split)");
  TR_CHECK(!(a.fp16 && a.bf16), "--fp16 and --bf16 are mutually exclusive: choose one half-precision type");
  TR_CHECK(a.per_device_eval_batch_size > 0, "--per_device_eval_batch_size {}: expected a positive count",
           a.per_device_eval_batch_size);
  TR_CHECK(a.block_size > 1, "--block_size {}: expected at least 2", a.block_size);
  make_directories(a.output_dir, "--output_dir");  // before the work: the results have a place to go
  const auto tok = load_tokenizer_for_data(a);
  Generator gen(a.seed);
  auto model = load_model(a, "", gen, training_device(a));
  TR_CHECK(!tok || tok->vocab_size() <= model->config().vocab_size,
           "tokenizer {} has {} tokens, more than the model's vocab_size {}: give the model's own tokenizer "
           "(--tokenizer_name)",
           a.tokenizer_name.empty() ? a.model_name_or_path : a.tokenizer_name, tok ? tok->vocab_size() : 0,
           model->config().vocab_size);
  TrainingArguments b = a;
  if (b.train_file.empty()) b.train_file = b.validation_file;  // only the validation stream is used
  auto streams = load_streams(b, tok ? &*tok : nullptr, model->config().vocab_size, true);
  if (a.bf16 || a.fp16) {
    const DType half = a.bf16 ? DType::bf16 : DType::f16;
    for (auto& [n, p] : model->named_parameters()) *p = ops::to_dtype(*p, half);
  }
  // Started by a launcher: the batches are split across the ranks (Gloo on CPUs) and rank 0 writes.
  const dist::DistEnv env = dist::read_dist_env();
  std::unique_ptr<dist::ProcessGroup> group;
  if (env.distributed()) {
    group = dist::init_process_group(env,
                                     dist::parse_comm_backend(a.ddp_backend.empty() ? "gloo" : a.ddp_backend),
                                     std::chrono::milliseconds(a.ddp_timeout * 1000));
  }
  auto r = evaluate(*model, streams.validation, a.block_size, a.per_device_eval_batch_size,
                    !a.validation_file.empty() ? a.validation_file : a.train_file, group.get(),
                    a.label_smoothing_factor);
  if (group && group->rank() != 0) return r;
  write_file((fs::path(a.output_dir) / "eval_results.json").string(), r.to_json().dump(2) + "\n");
  return r;
}

}  // namespace tr::train
