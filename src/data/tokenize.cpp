// Text files to llm.c shards.
#include "data/tokenize.h"

#include <fnmatch.h>
#include <glob.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_writer.h"
#include "core/threads.h"
#include "data/shards.h"

namespace tr::data {

namespace fs = std::filesystem;

namespace {

// The files under `root` (hidden folders and files skipped, as Python's glob; symlinked folders not followed)
// whose path below it ends with components matching `tail`: "**/" matches zero or more folders (datasets'
// data_files).
std::vector<std::string> recursive_matches(const std::string& root, const std::string& tail,
                                           const std::string& flag, const std::string& pattern) {
  std::vector<std::string> out;
  std::error_code walk;
  auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, walk);
  for (; !walk && it != fs::recursive_directory_iterator(); it.increment(walk)) {
    std::error_code ec;
    const std::string name = it->path().filename().string();
    if (it->is_directory(ec)) {
      if (name.starts_with(".")) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;  // a broken link, a socket: no data file
    const std::string rel = it->path().lexically_relative(root).string();
    bool match = false;
    for (size_t at = 0; !match;) {  // the tail against the path from each folder down
      match = ::fnmatch(tail.c_str(), rel.c_str() + at, FNM_PATHNAME | FNM_PERIOD) == 0;
      const size_t slash = rel.find('/', at);
      if (slash == std::string::npos) break;
      at = slash + 1;
    }
    if (match) out.push_back(it->path().string());
  }
  // A folder that could not be read would silently shorten the data.
  TR_CHECK(!walk || walk == std::errc::not_a_directory, "--{} {}: cannot read {} ({})", flag, pattern, root,
           walk.message());
  return out;
}

// One pattern's files: glob(3), or for a pattern with a "**" component, its folders globbed and walked.
std::vector<std::string> pattern_matches(const std::string& p, const std::string& flag) {
  const size_t star2 = p.find("**");
  if (star2 != std::string::npos) {
    TR_CHECK((star2 == 0 || p[star2 - 1] == '/') && (star2 + 2 == p.size() || p[star2 + 2] == '/') &&
                 p.find("**", star2 + 2) == std::string::npos,
             "--{} {}: ** must be a whole path component, once (e.g. data/**/*.txt)", flag, p);
    const std::string base = star2 == 0 ? "." : p.substr(0, star2 - 1);
    const std::string tail = star2 + 2 == p.size() ? "*" : p.substr(star2 + 3);  // "d/**": d/**/*
    std::vector<std::string> out;
    for (const auto& root : pattern_matches(base.empty() ? "/" : base, flag)) {
      const auto found = recursive_matches(root, tail, flag, p);
      out.insert(out.end(), found.begin(), found.end());
    }
    return out;
  }
  glob_t g{};
  const int rc = ::glob(p.c_str(), 0, nullptr, &g);
  std::vector<std::string> hits;
  if (rc == 0) hits.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  globfree(&g);
  return hits;
}

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns, const std::string& flag) {
  std::vector<std::string> out;
  for (const auto& p : patterns) {
    const bool recursive = p.find("**") != std::string::npos;
    std::vector<std::string> hits = pattern_matches(p, flag);
    TR_CHECK(!hits.empty(), "--{} {}: no such file", flag, p);
    std::sort(hits.begin(), hits.end());
    for (const auto& h : hits) {
      std::error_code ec;
      TR_CHECK(recursive || !fs::is_directory(h, ec),
               "--{} {}: {} is a folder; give its files, e.g. {}/*.txt", flag, p, h, h);
    }
    out.insert(out.end(), hits.begin(), hits.end());
  }
  return out;
}

namespace {

using TokenSink = std::function<void(const uint32_t* tokens, size_t n)>;

// Streams the inputs' documents through the tokenizer into `sink`, one EOS between documents (unless the
// tokenizer ends each with one). Documents are encoded in groups (in parallel over a group's documents), so
// memory holds one group's text and ids whatever the inputs' size.
void encode_stream(const tokenizers::Tokenizer& tok, const std::vector<std::string>& patterns, int threads,
                   const DocumentOptions& dopts, TokenizeResult& r,
                   const std::function<void(int64_t, int64_t)>& progress, const TokenSink& sink,
                   const std::string& flag = "input") {
  const auto eos = tok.eos_token_id();
  TR_CHECK(eos.has_value(), "tokenize: the tokenizer has no end-of-text token to separate documents");
  TR_CHECK(threads >= 0 && threads <= max_pool_threads(),
           "tokenize: --num_proc {}: expected 0 (every core) up to {} threads", threads, max_pool_threads());
  const auto files = expand_inputs(patterns, flag);
  int64_t total_bytes = 0, done_files_bytes = 0, tokens = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    TR_CHECK(!ec, "--{} {}: cannot read its size ({})", flag, f, ec.message());
    total_bytes += static_cast<int64_t>(size);
  }
  std::vector<std::string> texts;
  size_t text_bytes = 0, group_first = 0, file = 0;
  int64_t read_in_file = 0;
  const uint32_t sep = static_cast<uint32_t>(*eos);
  auto flush = [&] {
    if (texts.empty()) return;
    const std::vector<std::string_view> views(texts.begin(), texts.end());
    std::vector<std::vector<int32_t>> ids;
    try {
      // As run_clm: each document with the tokenizer's own special tokens (Llama's and Gemma's BOS).
      ids = tok.encode_batch(views, threads, /*allow_special=*/false, /*add_special_tokens=*/true);
    } catch (const Error& e) {
      const std::string& first = files[group_first];
      const std::string& last = files[file];
      fail("tokenize: {} (documents from {})", e.what(), first == last ? first : first + " to " + last);
    }
    for (const auto& d : ids) {
      if (tokens > 0 && !tok.adds_eos()) {
        sink(&sep, 1);
        ++tokens;
      }
      sink(reinterpret_cast<const uint32_t*>(d.data()), d.size());
      tokens += static_cast<int64_t>(d.size());
    }
    texts.clear();
    text_bytes = 0;
    group_first = file;
    if (progress) progress(done_files_bytes + read_in_file, total_bytes);
  };
  for (file = 0; file < files.size(); ++file) {
    if (texts.empty()) group_first = file;
    int64_t docs = 0;
    bool only_empty = true;
    for_each_document(files[file], dopts, [&](std::string&& d, int64_t read) {
      ++docs;
      only_empty = only_empty && d.empty();
      r.bytes += static_cast<int64_t>(d.size());
      ++r.documents;
      read_in_file = read;
      text_bytes += d.size();
      texts.push_back(std::move(d));
      if (texts.size() >= 64 || text_bytes >= (size_t{16} << 20)) flush();
    });
    TR_CHECK(docs > 0 && !(docs == 1 && only_empty), "{}: {}", files[file],
             is_table_file(files[file]) ? "no rows" : "the file is empty");
    std::error_code ec;  // read above; a file that vanished since counts as empty in the progress
    done_files_bytes += static_cast<int64_t>(fs::file_size(files[file], ec));
    read_in_file = 0;
  }
  if (!files.empty()) file = files.size() - 1;
  flush();
}

}  // namespace

std::vector<uint32_t> tokenize_text_files(const tokenizers::Tokenizer& tok,
                                          const std::vector<std::string>& inputs, int threads,
                                          const DocumentOptions& documents, const std::string& flag) {
  TokenizeResult r;
  std::vector<uint32_t> stream;
  encode_stream(
      tok, inputs, threads, documents, r, {},
      [&](const uint32_t* t, size_t n) { stream.insert(stream.end(), t, t + n); }, flag);
  return stream;
}

namespace {

// A shard name of ours: train_N.bin or val_N.bin, N of six digits or more ({:06d}).
bool is_shard_name(const std::string& n) {
  for (const std::string prefix : {"train_", "val_"})
    if (n.size() >= prefix.size() + 10 && n.rfind(prefix, 0) == 0 && n.ends_with(".bin"))
      return std::all_of(n.begin() + static_cast<std::ptrdiff_t>(prefix.size()), n.end() - 4,
                         [](char c) { return c >= '0' && c <= '9'; });
  return false;
}

// Before any work: a folder with a shard's name would stop a rename half-way, leaving two tokenizations.
void check_no_folder_in_the_way(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    TR_CHECK(!(is_shard_name(n) && e.is_directory()),
             "tokenize: --output_dir {}: {} is a folder with a shard's name; move it away", dir, n);
  }
}

// The files a run writes into output_dir before they take their names: partial shards and the token
// stream. All of them go when the run ends, whether it finished or failed.
struct Scratch {
  std::vector<std::string> paths;
  ~Scratch() {
    for (const auto& p : paths) {
      std::error_code ec;
      fs::remove(p, ec);
    }
  }
};

// The new shards take their names at once, after every one of them is complete; then the shards of an
// earlier tokenization into the same folder that this one did not replace go, so that a glob over the
// folder reads this run's tokens alone. Returns how many went.
int64_t publish_shards(const std::string& dir,
                       const std::vector<std::pair<std::string, std::string>>& renames) {
  std::set<std::string> ours;
  for (const auto& [from, to] : renames) {
    std::error_code ec;
    fs::rename(from, to, ec);
    TR_CHECK(!ec,
             "tokenize: cannot name the shard {} ({}); {} now holds shards of two tokenizations: remove its "
             "train_*.bin and val_*.bin and tokenize again",
             to, ec.message(), dir);
    ours.insert(fs::path(to).filename().string());
  }
  int64_t removed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_regular_file() && is_shard_name(n) && !ours.count(n))
      removed += fs::remove(e.path(), ec) ? 1 : 0;
  }
  return removed;
}

}  // namespace

// Two passes over bounded memory: the token stream goes to a temporary file in output_dir (its length
// decides the validation split: the first validation_split_percentage % of the stream), then the shards are
// written from it in order, validation first, under temporary names until all are complete.
TokenizeResult tokenize_files(const tokenizers::Tokenizer& tok, const TokenizeOptions& o,
                              const std::function<void(int64_t, int64_t)>& progress) {
  TR_CHECK(!o.output_dir.empty(), "tokenize: --output_dir is required");
  TR_CHECK(o.validation_split_percentage >= 0 && o.validation_split_percentage < 100,
           "tokenize: --validation_split_percentage must be in [0, 100), got {}",
           o.validation_split_percentage);
  TR_CHECK(o.shard_tokens > 0 && o.shard_tokens <= INT32_MAX,
           "tokenize: --shard_size must be in [1, 2147483647] tokens (llm.c's int32 count), got {}",
           o.shard_tokens);
  TR_CHECK(o.threads >= 0 && o.threads <= max_pool_threads(),
           "tokenize: --num_proc {}: expected 0 (every core) up to {} threads", o.threads,
           max_pool_threads());
  TokenizeResult r;
  make_directories(o.output_dir, "tokenize: --output_dir");
  check_no_folder_in_the_way(o.output_dir);
  Scratch scratch;
  const std::string tmp = (fs::path(o.output_dir) / ".tokens.tmp").string();
  scratch.paths.push_back(tmp);
  int64_t total = 0;
  {
    FileWriter w(tmp);
    encode_stream(tok, o.inputs, o.threads, o.documents, r, progress, [&](const uint32_t* t, size_t n) {
      w.write(t, n * sizeof(uint32_t));
      total += static_cast<int64_t>(n);
    });
    w.close();
  }
  const auto n_val = static_cast<int64_t>(static_cast<double>(total) * o.validation_split_percentage / 100.0);
  std::ifstream in(tmp, std::ios::binary);
  TR_CHECK(in.is_open(), "{}: cannot reopen the token stream", tmp);
  std::vector<uint32_t> chunk(size_t{1} << 20);
  std::vector<std::pair<std::string, std::string>> renames;  // partial -> final
  auto write = [&](const char* prefix, int64_t begin, int64_t end, std::vector<std::string>& names) {
    int shard = 0;
    for (int64_t at = begin; at < end; at += o.shard_tokens, ++shard) {
      const int64_t stop = std::min(end, at + o.shard_tokens);
      const std::string file = fmt::format("{}_{:06d}.bin", prefix, shard);
      const std::string name = (fs::path(o.output_dir) / file).string();
      const std::string partial = (fs::path(o.output_dir) / ("." + file + ".partial")).string();
      scratch.paths.push_back(partial);
      ShardWriter sw(partial, tok.vocab_size(), stop - at);
      for (int64_t left = stop - at; left > 0;) {
        const auto n = static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(chunk.size())));
        in.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(n * sizeof(uint32_t)));
        TR_CHECK(static_cast<size_t>(in.gcount()) == n * sizeof(uint32_t), "{}: the token stream ended early",
                 tmp);
        sw.append(chunk.data(), n);
        left -= static_cast<int64_t>(n);
      }
      sw.close();
      renames.emplace_back(partial, name);
      names.push_back(name);
    }
  };
  write("val", 0, n_val, r.val_shards);
  write("train", n_val, total, r.train_shards);
  r.val_tokens = n_val;
  r.train_tokens = total - n_val;
  r.replaced_shards = publish_shards(o.output_dir, renames);
  return r;
}

}  // namespace tr::data
