// Tokenizer, model and data construction shared by `trainer train` and `trainer eval`; see setup.h.
#include "train/setup.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>

#include "backend/cuda_api.h"
#include "data/tokenize.h"
#include "dist/process_group.h"
#include "models/device_map.h"

namespace tr::train {

namespace fs = std::filesystem;

models::ModelConfig config_for(const std::string& name) {
  if (fs::is_directory(name))
    return models::ModelConfig::from_file((fs::path(name) / "config.json").string());
  // A path (a file that may be missing) is read as one, so its error names the file, not the built-ins.
  if (fs::is_regular_file(name) || name.find('/') != std::string::npos || name.ends_with(".json"))
    return models::ModelConfig::from_file(name);
  return models::ModelConfig::builtin(name);
}

namespace {

bool is_shards(const std::string& f) { return f.size() > 4 && f.substr(f.size() - 4) == ".bin"; }

// `make()` on rank 0 of `group`, its result broadcast to every rank (HF's main_process_first around the
// dataset's tokenization, without a cache on disk: the other ranks need not read the file, or have it). One
// tokenization with all of rank 0's threads instead of one per rank at once. An error on rank 0 is rethrown
// there and named on the others.
std::vector<uint32_t> from_rank0(dist::ProcessGroup& group, const std::string& file,
                                 const std::function<std::vector<uint32_t>()>& make) {
  std::vector<uint32_t> ids;
  std::exception_ptr failure;
  int64_t n = -1;
  if (group.rank() == 0) {
    try {
      ids = make();
      n = static_cast<int64_t>(ids.size());
    } catch (...) {
      failure = std::current_exception();
    }
  }
  group.broadcast(&n, sizeof n, 0);
  if (failure) std::rethrow_exception(failure);
  TR_CHECK(n >= 0, "{}: rank 0 could not read or tokenize it (its message says why)", file);
  ids.resize(static_cast<size_t>(n));
  constexpr size_t kChunk = size_t{1} << 24;  // 64 MB per broadcast
  for (size_t at = 0; at < ids.size(); at += kChunk)
    group.broadcast(ids.data() + at, std::min(kChunk, ids.size() - at) * sizeof(uint32_t), 0);
  return ids;
}

// `flag` names the file in errors: train_file or validation_file.
std::shared_ptr<const data::TokenStream> stream_of(const std::string& file, const char* flag,
                                                   const tokenizers::Tokenizer* tok, int64_t vocab,
                                                   const std::string& text_column,
                                                   dist::ProcessGroup* group) {
  if (is_shards(file)) return std::make_shared<data::TokenStream>(data::expand_inputs({file}, flag), vocab);
  TR_CHECK(tok != nullptr, "{}: a text file needs a tokenizer (--tokenizer_name, or a model folder with one)",
           file);
  const auto tokenize = [&] {
    auto ids = data::tokenize_text_files(*tok, {file}, 0, data::DocumentOptions{text_column}, flag);
    TR_CHECK(!ids.empty(), "{}: no tokens (empty file?)", file);
    return ids;
  };
  return std::make_shared<data::TokenStream>(
      group != nullptr && group->size() > 1 ? from_rank0(*group, file, tokenize) : tokenize());
}

}  // namespace

tokenizers::Tokenizer load_tokenizer(const TrainingArguments& a) {
  const std::string p = !a.tokenizer_name.empty() ? a.tokenizer_name : a.model_name_or_path;
  TR_CHECK(!p.empty(), "--tokenizer_name is required when training from {}",
           a.model_type.empty() ? "--config_name" : "--model_type");
  return tokenizers::Tokenizer::from_pretrained(p);
}

namespace {

// The vocabulary a model trains with: grown to the tokenizer's size (run_clm's resize_token_embeddings), then
// padded to --pad_vocab_to_multiple_of; each change said in one line.
int64_t target_vocab(const TrainingArguments& a, int64_t vocab, int64_t tokenizer_size, const char* how) {
  if (tokenizer_size > vocab) {
    std::fprintf(stderr, "train: vocab_size %lld -> %lld, the tokenizer's size (resize_token_embeddings%s)\n",
                 static_cast<long long>(vocab), static_cast<long long>(tokenizer_size), how);
    vocab = tokenizer_size;
  }
  if (const int64_t m = a.pad_vocab_to_multiple_of; m > 1 && vocab % m != 0) {
    const int64_t padded = (vocab + m - 1) / m * m;
    std::fprintf(stderr, "train: vocab_size %lld -> %lld, a multiple of %lld (--pad_vocab_to_multiple_of)\n",
                 static_cast<long long>(vocab), static_cast<long long>(padded), static_cast<long long>(m));
    vocab = padded;
  }
  return vocab;
}

}  // namespace

models::ModelConfig fresh_config(const TrainingArguments& a, int64_t tokenizer_size) {
  models::ModelConfig c;
  if (!a.model_type.empty()) {  // run_clm's CONFIG_MAPPING[model_type]() and update_from_string
    nlohmann::json j = models::hf_default_config(a.model_type);
    models::apply_config_overrides(j, a.config_overrides);
    c = models::ModelConfig::from_json(j, "--model_type " + a.model_type);
  } else {
    c = config_for(a.config_name);
  }
  c.vocab_size = target_vocab(a, c.vocab_size, tokenizer_size, "");
  c.raw["vocab_size"] = c.vocab_size;  // what config.json will say
  return c;
}

bool trains_half_weights(const TrainingArguments& a, const std::string& weights_dir) {
  const std::string& d = a.model_dtype();
  if (d != "auto") return d == "bfloat16";
  const std::string dir = !weights_dir.empty() ? weights_dir : a.model_name_or_path;
  if (dir.empty()) return false;  // a fresh model: run_clm's from_config makes it in f32 whatever the dtype
  const nlohmann::json& raw = config_for(dir).raw;
  const char* key = raw.contains("dtype") ? "dtype" : "torch_dtype";  // transformers 5 writes "dtype"
  const std::string saved =
      raw.contains(key) && raw[key].is_string() ? raw[key].get<std::string>() : "float32";
  TR_CHECK(saved == "float32" || saved == "bfloat16",
           "--{} auto: {}/config.json says {} \"{}\"; trained here as float32 or bfloat16 (give "
           "--torch_dtype float32 with --fp16 for fp16 compute over fp32 masters)",
           a.dtype.empty() ? "torch_dtype" : "dtype", dir, key, saved);
  if (saved == "bfloat16") a.check_half_weight_flags();
  return saved == "bfloat16";
}

std::unique_ptr<models::CausalLM> load_model(const TrainingArguments& a, const std::string& weights_dir,
                                             Generator& gen, Device device, int64_t tokenizer_size,
                                             DType dtype) {
  const std::string dir = !weights_dir.empty() ? weights_dir : a.model_name_or_path;
  if (!dir.empty()) {
    models::PretrainedOptions po;
    po.attn_implementation = a.attn_implementation;
    po.dtype = dtype;
    po.device = device;
    po.device_map = a.device_map;
    TR_CHECK(a.max_memory.empty() || a.device_map == "auto", "--max_memory {} goes with --device_map auto",
             a.max_memory);
    if (!a.max_memory.empty()) po.max_memory = models::parse_device_memory(a.max_memory, "max_memory");
    auto model = models::from_pretrained(dir, po);
    // Fine-tuning with a larger tokenizer: HF's mean-initialized new rows (a resumed checkpoint has them).
    if (weights_dir.empty()) {
      const int64_t vocab = model->config().vocab_size;
      const int64_t want = target_vocab(a, vocab, tokenizer_size, ", new rows from the old rows' mean");
      if (want > vocab) model->resize_token_embeddings(want, gen);
    }
    return model;
  }
  const bool split = a.device_map == "auto" && !a.max_memory.empty();
  // A fresh model to be split is initialized on the host (the same bits: the init draws on the host), where
  // the whole fits when no one device does, then placed as from_pretrained places a checkpoint: by its f32
  // weights over the budgets.
  auto model = models::create_causal_lm(fresh_config(a, tokenizer_size), split ? Device::cpu() : device,
                                        DType::f32, gen, a.attn_implementation);
  if (split) {
    const models::DevicePlacement p = models::infer_auto_device_map(
        *model, DType::f32, models::parse_device_memory(a.max_memory, "max_memory"));
    models::place_parameters(*model, p);
  }
  return model;
}

std::optional<models::DeferredModel> load_deferred_model(const TrainingArguments& a,
                                                         const std::string& weights_dir, Generator& gen,
                                                         Device device, int64_t tokenizer_size) {
  const std::string dir = !weights_dir.empty() ? weights_dir : a.model_name_or_path;
  if (dir.empty())
    return models::deferred_causal_lm(fresh_config(a, tokenizer_size), device, gen, a.attn_implementation);
  if (weights_dir.empty()) {  // new embedding rows are the old rows' mean: that needs the whole matrix
    const int64_t vocab = config_for(dir).vocab_size, m = a.pad_vocab_to_multiple_of;
    if (tokenizer_size > vocab || (m > 1 && vocab % m != 0)) return std::nullopt;
  }
  models::PretrainedOptions po;
  po.attn_implementation = a.attn_implementation;
  po.device = device;
  return models::deferred_pretrained(dir, po);
}

std::optional<tokenizers::Tokenizer> load_tokenizer_for_data(const TrainingArguments& a) {
  const bool shards_only = (!a.train_file.empty() || !a.validation_file.empty()) &&
                           (a.train_file.empty() || is_shards(a.train_file)) &&
                           (a.validation_file.empty() || is_shards(a.validation_file));
  if (!shards_only || !a.tokenizer_name.empty()) return load_tokenizer(a);
  const fs::path m(a.model_name_or_path);
  if (!a.model_name_or_path.empty() &&
      (fs::exists(m / "tokenizer.json") || fs::exists(m / "vocab.json")))  // kept for the saved folders
    return load_tokenizer(a);
  return std::nullopt;
}

Device training_device(const TrainingArguments& a) {
  const Device d = a.use_cpu ? Device::cpu() : backend::default_device();
  if (!d.is_cuda()) return d;
  // A launched rank trains on its node's GPU LOCAL_RANK (torch.cuda.set_device(local_rank) in HF's
  // scripts); more local ranks than GPUs share them in turn.
  const dist::DistEnv env = dist::read_dist_env();
  return env.distributed() ? Device::cuda(env.local_rank % backend::cuda_device_count()) : d;
}

std::string validation_source(const TrainingArguments& a) {
  return a.validation_file.empty() ? a.train_file + " (validation split)" : a.validation_file;
}

namespace {

Streams load_whole_streams(const TrainingArguments& a, const tokenizers::Tokenizer* tok, int64_t vocab,
                           bool want_validation, dist::ProcessGroup* group) {
  Streams s;
  TR_CHECK(!a.train_file.empty(), "--train_file is required");
  auto all = stream_of(a.train_file, "train_file", tok, vocab, a.text_column_name, group);
  if (!want_validation) {
    s.train = all;
    return s;
  }
  if (!a.validation_file.empty()) {
    s.train = all;
    s.validation = stream_of(a.validation_file, "validation_file", tok, vocab, a.text_column_name, group);
    // Checked before any step: an evaluation that cannot run would otherwise fail after the training.
    TR_CHECK(s.validation->size() >= a.block_size,
             "--validation_file {}: {} validation tokens, fewer than one block of --block_size {}",
             a.validation_file, s.validation->size(), a.block_size);
    return s;
  }
  TR_CHECK(a.validation_split_percentage > 0,
           "evaluation needs --validation_file or a positive --validation_split_percentage");
  const int64_t n = all->size(), nv = n * a.validation_split_percentage / 100;
  TR_CHECK(nv >= a.block_size && n - nv >= a.block_size,
           "{}: {} tokens are too few to hold out {}% for validation with --block_size {}", a.train_file, n,
           a.validation_split_percentage, a.block_size);
  s.validation = std::make_shared<data::TokenStream>(all, 0, nv);
  s.train = std::make_shared<data::TokenStream>(all, nv, n);
  return s;
}

// run_clm's max_train_samples / max_eval_samples: the first N blocks of a stream (after the split).
std::shared_ptr<const data::TokenStream> first_blocks(std::shared_ptr<const data::TokenStream> s, int64_t n,
                                                      int64_t block_size) {
  if (n <= 0 || !s || n > (s->size() - 1) / block_size)
    return s;  // n blocks cover it (no n * block overflow)
  return std::make_shared<data::TokenStream>(s, 0, n * block_size);
}

}  // namespace

Streams load_streams(const TrainingArguments& a, const tokenizers::Tokenizer* tok, int64_t vocab,
                     bool want_validation, dist::ProcessGroup* group) {
  Streams s = load_whole_streams(a, tok, vocab, want_validation, group);
  s.train = first_blocks(s.train, a.max_train_samples, a.block_size);
  s.validation = first_blocks(s.validation, a.max_eval_samples, a.block_size);
  return s;
}

}  // namespace tr::train
