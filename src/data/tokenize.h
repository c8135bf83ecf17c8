// `trainer tokenize`: data files -> llm.c token shards (train_NNNNNN.bin, val_NNNNNN.bin). A .txt file is one
// document, a .jsonl/.json/.csv/.tsv file one per row (data/documents.h); each is encoded with the
// tokenizer's special tokens as run_clm does (Llama's and Gemma's BOS; special-token text stays text), and
// documents are joined by one EOS unless the tokenizer already ends each with one. The first
// validation_split_percentage % of the token stream goes to the validation shards (HF's percentage split,
// taken over tokens so a single book can be split too). Output is the same whatever the thread count. Memory
// is bounded whatever the inputs' size: documents stream through the tokenizer in groups (JSON lines a read
// chunk at a time; other formats one file at a time), the token stream goes to a temporary file, and the
// shards are written from it.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "data/documents.h"
#include "tokenizers/tokenizer.h"

namespace tr::data {

struct TokenizeOptions {
  std::vector<std::string> inputs;  // files or glob patterns
  std::string output_dir;
  double validation_split_percentage = 0.0;
  int64_t shard_tokens = 100'000'000;
  int threads = 0;            // 0: all
  DocumentOptions documents;  // which column of a table holds the text
};

struct TokenizeResult {
  int64_t documents = 0, bytes = 0, train_tokens = 0, val_tokens = 0;
  std::vector<std::string> train_shards, val_shards;
  int64_t replaced_shards = 0;  // an earlier tokenization's shards in output_dir that this one removed
};

// `progress(done_bytes, total_bytes)` is called as documents finish (may be empty).
TokenizeResult tokenize_files(const tokenizers::Tokenizer& tok, const TokenizeOptions& opts,
                              const std::function<void(int64_t, int64_t)>& progress = {});

// Small inputs tokenized in memory (one EOS between documents), for training without a tokenize step.
// `flag` names the inputs in errors (train_file, validation_file).
std::vector<uint32_t> tokenize_text_files(const tokenizers::Tokenizer& tok,
                                          const std::vector<std::string>& inputs, int threads = 0,
                                          const DocumentOptions& documents = {},
                                          const std::string& flag = "input");

// Expands glob patterns (sorted) into files - with "**" as a path component matching zero or more folders,
// as datasets' data_files (data/**/*.txt) - ; a pattern matching nothing, or naming a folder, is an error
// naming it and `flag`, the option that gave it.
std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns,
                                       const std::string& flag = "input");

}  // namespace tr::data
