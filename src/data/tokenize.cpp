// Text files to llm.c shards.
#include "data/tokenize.h"

#include <glob.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/shards.h"

namespace tr::data {

namespace fs = std::filesystem;

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  for (const auto& p : patterns) {
    glob_t g{};
    const int rc = ::glob(p.c_str(), 0, nullptr, &g);
    TR_CHECK(rc == 0 && g.gl_pathc > 0, "--input {}: no such file", p);
    std::vector<std::string> hits(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    globfree(&g);
    std::sort(hits.begin(), hits.end());
    out.insert(out.end(), hits.begin(), hits.end());
  }
  return out;
}

namespace {

// Reads and encodes the inputs into one stream with an EOS between documents.
std::vector<uint32_t> encode_files(const tokenizers::Tokenizer& tok, const std::vector<std::string>& patterns,
                                   int threads, const DocumentOptions& dopts, TokenizeResult& r,
                                   const std::function<void(int64_t, int64_t)>& progress) {
  const auto eos = tok.eos_token_id();
  TR_CHECK(eos.has_value(), "tokenize: the tokenizer has no end-of-text token to separate documents");
  const auto files = expand_inputs(patterns);
  std::vector<std::string> texts;
  std::vector<size_t> file_of;  // each document's file, for error messages
  for (size_t fi = 0; fi < files.size(); ++fi) {
    const auto& f = files[fi];
    auto docs = read_documents(f, dopts);
    TR_CHECK(!docs.empty() && !(docs.size() == 1 && docs[0].empty()),
             "{}: {}", f, is_table_file(f) ? "no rows" : "the file is empty");
    for (auto& d : docs) {
      r.bytes += static_cast<int64_t>(d.size());
      texts.push_back(std::move(d));
      file_of.push_back(fi);
    }
  }
  r.documents = static_cast<int64_t>(texts.size());
  // Encode in groups so progress can be reported; each group is encoded in parallel over its documents.
  std::vector<uint32_t> stream;
  int64_t done = 0;
  const size_t group = 64;
  for (size_t g0 = 0; g0 < texts.size(); g0 += group) {
    std::vector<std::string_view> views;
    for (size_t i = g0; i < std::min(texts.size(), g0 + group); ++i) views.push_back(texts[i]);
    std::vector<std::vector<int32_t>> ids;
    try {
      // As run_clm: each document with the tokenizer's own special tokens (Llama's and Gemma's BOS).
      ids = tok.encode_batch(views, threads, /*allow_special=*/false, /*add_special_tokens=*/true);
    } catch (const Error& e) {
      const std::string& first = files[file_of[g0]];
      const std::string& last = files[file_of[g0 + views.size() - 1]];
      fail("tokenize: {} (documents from {})", e.what(), first == last ? first : first + " to " + last);
    }
    for (size_t k = 0; k < ids.size(); ++k) {
      if (!stream.empty() && !tok.adds_eos()) stream.push_back(static_cast<uint32_t>(*eos));
      stream.insert(stream.end(), ids[k].begin(), ids[k].end());
      done += static_cast<int64_t>(views[k].size());
    }
    if (progress) progress(done, r.bytes);
  }
  return stream;
}

}  // namespace

std::vector<uint32_t> tokenize_text_files(const tokenizers::Tokenizer& tok,
                                          const std::vector<std::string>& inputs, int threads,
                                          const DocumentOptions& documents) {
  TokenizeResult r;
  return encode_files(tok, inputs, threads, documents, r, {});
}

TokenizeResult tokenize_files(const tokenizers::Tokenizer& tok, const TokenizeOptions& o,
                              const std::function<void(int64_t, int64_t)>& progress) {
  TR_CHECK(!o.output_dir.empty(), "tokenize: --output_dir is required");
  TR_CHECK(o.validation_split_percentage >= 0 && o.validation_split_percentage < 100,
           "tokenize: --validation_split_percentage must be in [0, 100), got {}",
           o.validation_split_percentage);
  TR_CHECK(o.shard_tokens > 0, "tokenize: shard size must be positive");
  TokenizeResult r;
  std::vector<uint32_t> stream = encode_files(tok, o.inputs, o.threads, o.documents, r, progress);
  fs::create_directories(o.output_dir);
  const auto n_val =
      static_cast<int64_t>(static_cast<double>(stream.size()) * o.validation_split_percentage / 100.0);
  auto write = [&](const char* prefix, int64_t begin, int64_t end, std::vector<std::string>& names) {
    int shard = 0;
    for (int64_t at = begin; at < end; at += o.shard_tokens, ++shard) {
      const int64_t stop = std::min(end, at + o.shard_tokens);
      const std::string name =
          (fs::path(o.output_dir) / fmt::format("{}_{:06d}.bin", prefix, shard)).string();
      write_llmc_shard(name, std::vector<uint32_t>(stream.begin() + at, stream.begin() + stop),
                       tok.vocab_size());
      names.push_back(name);
    }
  };
  write("val", 0, n_val, r.val_shards);
  write("train", n_val, static_cast<int64_t>(stream.size()), r.train_shards);
  r.val_tokens = n_val;
  r.train_tokens = static_cast<int64_t>(stream.size()) - n_val;
  return r;
}

}  // namespace tr::data
