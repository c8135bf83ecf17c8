// What `trainer train` and `trainer eval` build from TrainingArguments: the tokenizer, the model (from a
// checkpoint, an HF folder, or a config for training from scratch) and the token streams (train, and
// validation from --validation_file or the first validation_split_percentage % of the training tokens, as
// run_clm splits).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "core/rng.h"
#include "data/shards.h"
#include "models/causal_lm.h"
#include "tokenizers/tokenizer.h"
#include "train/args.h"

namespace tr::dist {
class ProcessGroup;
}

namespace tr::train {

tokenizers::Tokenizer load_tokenizer(const TrainingArguments& a);
// The tokenizer a run needs: none when every data file is a .bin token shard and no tokenizer is named (or
// the model folder holds none): pre-tokenized data trains and evaluates without tokenizer files.
std::optional<tokenizers::Tokenizer> load_tokenizer_for_data(const TrainingArguments& a);
// A model's config: an HF folder's config.json, a config.json file, or a built-in name (gpt2, llama-60m,
// ...).
models::ModelConfig config_for(const std::string& name);

// --config_name's config for a fresh model: vocab_size grown to `tokenizer_size` when that is larger (as
// run_clm resizes the embeddings to len(tokenizer)) and rounded up to --pad_vocab_to_multiple_of, each said
// in one line on stderr.
models::ModelConfig fresh_config(const TrainingArguments& a, int64_t tokenizer_size);
// From `weights_dir` when given (a checkpoint or HF folder), else from --model_name_or_path, else a fresh
// model of fresh_config(a, tokenizer_size) initialized from `gen` (Philox: the same bits on every device).
// A loaded model in `dtype` (f32: mixed precision casts afterwards; bf16 for half weights), a fresh one in
// f32 (the init draws in f32; half weights round it), on `device`.
std::unique_ptr<models::CausalLM> load_model(const TrainingArguments& a, const std::string& weights_dir,
                                             Generator& gen, Device device = Device::cpu(),
                                             int64_t tokenizer_size = 0, DType dtype = DType::f32);
// Whether the run trains the model's own bf16 weights: --torch_dtype bfloat16, or auto over a checkpoint
// (`weights_dir`, else --model_name_or_path) whose config says bfloat16 (then the flags are checked as for
// bfloat16).
bool trains_half_weights(const TrainingArguments& a, const std::string& weights_dir);
// load_model's model as a deferred one (models::DeferredModel: meta parameters, each made on `device` when
// asked), for a sharded run to build its share alone; nothing when the model must exist whole first (a
// pretrained model whose embeddings grow to the tokenizer's size or a --pad_vocab_to_multiple_of).
std::optional<models::DeferredModel> load_deferred_model(const TrainingArguments& a,
                                                         const std::string& weights_dir, Generator& gen,
                                                         Device device = Device::cpu(),
                                                         int64_t tokenizer_size = 0);
// The GPU when one is usable and --use_cpu is not given, else the CPU.
Device training_device(const TrainingArguments& a);

struct Streams {
  std::shared_ptr<const data::TokenStream> train, validation;  // validation null when not wanted
};
// want_validation: an eval is requested. Errors name the file: empty data, ids beyond the vocabulary, a
// text file without a tokenizer (`tok` null). `group` (a distributed run): rank 0 alone reads and tokenizes
// text files and broadcasts the tokens (token shards are read by every rank: mapped, not tokenized); the
// others wait for it within --ddp_timeout - a corpus that takes longer wants `trainer tokenize` ahead.
Streams load_streams(const TrainingArguments& a, const tokenizers::Tokenizer* tok, int64_t vocab,
                     bool want_validation, dist::ProcessGroup* group = nullptr);
// What evaluation reads, for messages: --validation_file, or the train file's held-out split.
std::string validation_source(const TrainingArguments& a);

}  // namespace tr::train
