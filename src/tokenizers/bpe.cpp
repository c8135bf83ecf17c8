// Byte-level BPE: loading (tokenizer.json, vocab.json + merges.txt; every field and id checked), PCRE2
// pre-tokenization, merging, added tokens, decoding, and saving tokenizer.json.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizers/bpe.h"

#include <omp.h>
#include <pcre2.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "core/file_writer.h"
#include "core/error.h"
#include "core/json_fields.h"

namespace tr::tokenizers {

namespace fs = std::filesystem;

namespace {

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Returns the offset of the first invalid UTF-8 byte, or npos.
size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return i;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += n;
  }
  return std::string_view::npos;
}

// Decodes one byte-level token string (GPT-2 alphabet) to raw bytes; nullopt if a character is outside it.
std::optional<std::string> byte_level_decode(const std::string& tok,
                                             const std::unordered_map<uint32_t, uint8_t>& inv) {
  std::string out;
  size_t i = 0;
  while (i < tok.size()) {
    const auto c = static_cast<unsigned char>(tok[i]);
    uint32_t cp;
    size_t n;
    if (c < 0x80) {
      cp = c;
      n = 1;
    } else if ((c >> 5) == 0x6 && i + 1 < tok.size()) {
      cp = ((c & 0x1F) << 6) | (static_cast<unsigned char>(tok[i + 1]) & 0x3F);
      n = 2;
    } else {
      return std::nullopt;
    }
    auto it = inv.find(cp);
    if (it == inv.end()) return std::nullopt;
    out += static_cast<char>(it->second);
    i += n;
  }
  return out;
}

struct PairHash {
  size_t operator()(uint64_t k) const { return std::hash<uint64_t>()(k * 0x9E3779B97F4A7C15ull); }
};

}  // namespace

const std::vector<std::string>& byte_to_unicode() {
  static const std::vector<std::string> table = [] {
    std::vector<int> bs;
    for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
    std::vector<uint32_t> cp(256, 0);
    std::vector<bool> seen(256, false);
    for (int b : bs) {
      cp[b] = static_cast<uint32_t>(b);
      seen[b] = true;
    }
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b)
      if (!seen[b]) cp[b] = 256 + n++;
    std::vector<std::string> t(256);
    for (int b = 0; b < 256; ++b) append_utf8(t[b], cp[b]);
    return t;
  }();
  return table;
}

struct Tokenizer::Impl {
  std::string source;
  std::vector<std::string> id_bytes;                     // id -> raw bytes (added tokens: their content)
  std::vector<std::string> id_token;                     // id -> token string as written in the vocab
  std::unordered_map<std::string, int32_t> bytes_to_id;  // raw bytes -> id (BPE vocab only)
  std::unordered_map<std::string, int32_t> token_to_id;  // vocab token string -> id (incl. added)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>, PairHash> merges;  // (a, b) -> (rank, merged id)
  std::vector<std::pair<std::string, std::string>> merge_list;                 // for saving
  int32_t byte_id[256];
  bool ignore_merges = false;
  std::string pattern;
  pcre2_code* re = nullptr;
  struct Added {
    std::string content;
    int32_t id;
    bool special;
  };
  std::vector<Added> added;         // longest first, for matching
  bool added_first_byte[256] = {};  // bytes an added token can start with
  nlohmann::json pre_tokenizer, post_processor, added_json;

  ~Impl() {
    if (re) pcre2_code_free(re);
  }

  void compile(const std::string& pat) {
    pattern = pat;
    int err = 0;
    PCRE2_SIZE off = 0;
    re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.c_str()), pat.size(), PCRE2_UTF | PCRE2_UCP, &err,
                       &off, nullptr);
    if (!re) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("{}: pre-tokenizer regex does not compile at offset {}: {}", source, off,
           reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
  }

  void finish() {
    for (int b = 0; b < 256; ++b) {
      auto it = bytes_to_id.find(std::string(1, static_cast<char>(b)));
      TR_CHECK(it != bytes_to_id.end(), "{}: the vocabulary lacks the byte-level token for byte {}", source,
               b);
      byte_id[b] = it->second;
    }
    std::sort(added.begin(), added.end(),
              [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
    for (const auto& a : added)
      if (!a.content.empty()) added_first_byte[static_cast<unsigned char>(a.content[0])] = true;
  }

  // BPE of one pre-token piece (raw bytes).
  void bpe(std::string_view piece, std::vector<int32_t>& out) const {
    if (ignore_merges) {
      auto it = bytes_to_id.find(std::string(piece));
      if (it != bytes_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<int32_t> sym(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) sym[i] = byte_id[static_cast<unsigned char>(piece[i])];
    while (sym.size() > 1) {
      int32_t best_rank = INT32_MAX, best_id = -1;
      size_t best_i = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(sym[i])) << 32) |
                              static_cast<uint32_t>(sym[i + 1]));
        if (it != merges.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          best_id = it->second.second;
          best_i = i;
        }
      }
      if (best_id < 0) break;
      sym[best_i] = best_id;
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best_i) + 1);
    }
    out.insert(out.end(), sym.begin(), sym.end());
  }

  void encode_plain(std::string_view text, std::vector<int32_t>& out, pcre2_match_data* md,
                    pcre2_match_context* mc) const {
    const auto* subj = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos < text.size()) {
      int rc = pcre2_match(re, subj, text.size(), pos, PCRE2_NO_UTF_CHECK, md, mc);
      if (rc < 0) {
        TR_CHECK(rc == PCRE2_ERROR_NOMATCH, "{}: pre-tokenizer regex failed with PCRE2 error {}", source, rc);
        bpe(text.substr(pos), out);
        return;
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t s = ov[0], e = ov[1];
      if (s > pos)
        bpe(text.substr(pos, s - pos), out);  // unmatched text is a piece of its own (Isolated split)
      if (e == s) {                           // empty match: move one character on
        size_t n = 1;
        while (s + n < text.size() && (static_cast<unsigned char>(text[s + n]) & 0xC0) == 0x80) ++n;
        bpe(text.substr(s, n), out);
        pos = s + n;
        continue;
      }
      bpe(text.substr(s, e - s), out);
      pos = e;
    }
  }
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TR_CHECK(in.is_open(), "{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::unordered_map<uint32_t, uint8_t> inverse_byte_map() {
  std::unordered_map<uint32_t, uint8_t> inv;
  const auto& t = byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    const std::string& s = t[b];
    uint32_t cp = s.size() == 1 ? static_cast<unsigned char>(s[0])
                                : ((static_cast<unsigned char>(s[0]) & 0x1F) << 6) |
                                      (static_cast<unsigned char>(s[1]) & 0x3F);
    inv[cp] = static_cast<uint8_t>(b);
  }
  return inv;
}

using MergeList = std::vector<std::pair<std::string, std::string>>;

// A token as a JSON string literal for messages (escaped, so the message stays one line; cut at 60 bytes).
std::string shown(const std::string& token) {
  return nlohmann::json(token.substr(0, 60)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Adds the merges in rank order. Returns the index of the first merge whose tokens or merged token are not in
// the vocabulary (the caller names it in its file), or list.size().
size_t add_merges(Tokenizer::Impl& t, const MergeList& list) {
  int32_t rank = 0;
  for (const auto& [a, b] : list) {
    auto ia = t.token_to_id.find(a), ib = t.token_to_id.find(b), im = t.token_to_id.find(a + b);
    if (ia == t.token_to_id.end() || ib == t.token_to_id.end() || im == t.token_to_id.end())
      return static_cast<size_t>(rank);
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) | static_cast<uint32_t>(ib->second);
    t.merges.emplace(key, std::make_pair(rank, im->second));  // the first (lowest) rank wins on duplicates
    ++rank;
  }
  t.merge_list = list;
  return list.size();
}

// The vocabulary (token -> id). Ids must be below `id_limit`, the number of tokens the file defines (so no
// id can size the tables beyond the file), and each id belongs to one token.
void set_vocab(Tokenizer::Impl& t, const JsonField& vocab, int64_t id_limit) {
  const auto inv = inverse_byte_map();
  vocab.object();
  t.id_bytes.assign(static_cast<size_t>(id_limit), std::string());
  t.id_token.assign(static_cast<size_t>(id_limit), std::string());
  int64_t max_id = -1;
  vocab.each_member([&](const std::string& token, const JsonField& f) {
    const int64_t id = f.integer(0, id_limit - 1);
    if (token.empty()) f.fail("is an empty token");
    auto raw = byte_level_decode(token, inv);
    if (!raw) f.fail("is not byte-level encoded (only byte-level BPE is supported)");
    auto& slot = t.id_token[static_cast<size_t>(id)];
    if (!slot.empty()) f.fail("has id {}, as has field '{}'", id, vocab[slot].path());
    slot = token;
    t.id_bytes[static_cast<size_t>(id)] = *raw;
    t.bytes_to_id[*raw] = static_cast<int32_t>(id);
    t.token_to_id[token] = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
  });
  t.id_bytes.resize(static_cast<size_t>(max_id + 1));
  t.id_token.resize(static_cast<size_t>(max_id + 1));
}

// model.merges of tokenizer.json: "a b" strings or [a, b] pairs of vocabulary tokens.
void read_merges(Tokenizer::Impl& t, const JsonField& merges) {
  MergeList list;
  list.reserve(merges.array().size());
  merges.each_element([&](const JsonField& e) {
    if (e.raw().is_string()) {
      const std::string s = e.string();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size())
        e.fail("must be a merge 'a b' or [a, b], got {}", describe_json(e.raw()));
      list.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      if (!e.raw().is_array() || e.size() != 2) e.fail_expected("a merge 'a b' or [a, b]");
      list.emplace_back(e[0].string(), e[1].string());
    }
  });
  const size_t bad = add_merges(t, list);
  if (bad < list.size())
    merges[bad].fail("merges {} and {}, which (or whose merged token) are not in the vocabulary",
                     shown(list[bad].first), shown(list[bad].second));
}

// added_tokens: matched in the text before pre-tokenization. Each id is below `id_limit` and used once; an id
// inside the BPE vocabulary must be that token's own (as GPT-2's <|endoftext|> is).
void read_added_tokens(Tokenizer::Impl& t, const JsonField& added, int64_t id_limit) {
  const size_t vocab_ids = t.id_bytes.size();
  std::vector<bool> taken(static_cast<size_t>(id_limit), false);
  std::unordered_map<std::string, int32_t> contents;
  added.each_element([&](const JsonField& a) {
    a.object();
    const auto id = static_cast<int32_t>(a["id"].integer(0, id_limit - 1));
    const std::string content = a["content"].string();
    if (content.empty()) a["content"].fail("is empty (an empty token would match everywhere)");
    const bool special = a["special"].boolean_or(false);
    if (taken[static_cast<size_t>(id)]) a["id"].fail("repeats id {} of an earlier added token", id);
    taken[static_cast<size_t>(id)] = true;
    if (!contents.emplace(content, id).second)
      a["content"].fail("repeats the added token {} (id {})", shown(content), contents[content]);
    const size_t i = static_cast<size_t>(id);
    if (i < vocab_ids && !t.id_token[i].empty() && t.id_bytes[i] != content)
      a["id"].fail("{} is the vocabulary's token {}, not {}", id, shown(t.id_token[i]), shown(content));
    if (i >= t.id_bytes.size()) {
      t.id_bytes.resize(i + 1);
      t.id_token.resize(i + 1);
    }
    t.id_bytes[i] = content;
    t.id_token[i] = content;
    t.token_to_id[content] = id;
    t.added.push_back({content, id, special});
  });
  t.added_json = added.present() ? added.raw() : nlohmann::json::array();
}

// Pre-tokenizer: ByteLevel (GPT-2 regex) or Sequence[Split(regex, Isolated), ByteLevel(use_regex=false)].
void read_pre_tokenizer(Tokenizer::Impl& t, const JsonField& pt) {
  t.pre_tokenizer = pt.object().raw();
  const std::string type = pt["type"].one_of({"ByteLevel", "Sequence"});
  if (type == "ByteLevel") {
    if (!pt["use_regex"].boolean_or(true)) pt["use_regex"].fail("false needs a Split before the ByteLevel");
    if (pt["add_prefix_space"].boolean_or(false)) pt["add_prefix_space"].fail("true is not supported");
    t.compile(kGpt2Pattern);
    return;
  }
  const JsonField seq = pt["pretokenizers"];
  if (seq.array().size() != 2) seq.fail("must hold [Split, ByteLevel], got {} pre-tokenizers", seq.size());
  const JsonField split = seq[0], byte_level = seq[1];
  split["type"].one_of({"Split"});
  byte_level["type"].one_of({"ByteLevel"});
  split["behavior"].one_of({"Isolated"});
  if (split["invert"].boolean_or(false)) split["invert"].fail("true is not supported");
  if (byte_level["use_regex"].boolean_or(true)) byte_level["use_regex"].fail("must be false after a Split");
  if (byte_level["add_prefix_space"].boolean_or(false))
    byte_level["add_prefix_space"].fail("true is not supported");
  t.compile(split["pattern"]["Regex"].string());
}

// BOS from a TemplateProcessing post-processor ("single": [SpecialToken BOS, Sequence A]); the ids of its
// special_tokens must be ids of this tokenizer.
std::optional<int32_t> read_post_processor(Tokenizer::Impl& t, const JsonField& pp) {
  t.post_processor = pp.present() ? pp.raw() : nlohmann::json();
  if (!pp.present() || pp["type"].string() != "TemplateProcessing") return std::nullopt;
  const auto vocab = static_cast<int64_t>(t.id_bytes.size());
  if (pp["special_tokens"].present())
    pp["special_tokens"].each_member([&](const std::string&, const JsonField& s) {
      if (s.object()["ids"].present())
        s["ids"].each_element([&](const JsonField& id) { id.integer(0, vocab - 1); });
    });
  const JsonField single = pp["single"];
  if (!single.present() || single.array().size() == 0 || !single[0].object()["SpecialToken"].present())
    return std::nullopt;
  const JsonField id = single[0]["SpecialToken"]["id"];
  const std::string bos = id.string();
  const auto it = t.token_to_id.find(bos);
  if (it == t.token_to_id.end()) id.fail("names {}, which is not a token of this tokenizer", shown(bos));
  return it->second;
}

}  // namespace

Tokenizer Tokenizer::from_vocab_merges(const std::string& vocab_file, const std::string& merges_file) {
  Tokenizer tk;
  Impl& t = *tk.impl_;
  t.source = vocab_file;
  const nlohmann::json vocab = parse_json(read_file(vocab_file), vocab_file);
  const JsonField root(vocab, vocab_file);
  set_vocab(t, root, static_cast<int64_t>(root.object().size()));
  MergeList list;
  std::vector<int64_t> lines;
  std::istringstream in(read_file(merges_file));
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
    const auto sp = line.find(' ');
    TR_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size(),
             "{}: line {} is not a merge 'a b': {}", merges_file, lineno, line.substr(0, 80));
    list.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    lines.push_back(lineno);
  }
  const size_t bad = add_merges(t, list);
  TR_CHECK(bad == list.size(), "{}: line {}: merge '{} {}' uses tokens missing from {}", merges_file,
           bad < lines.size() ? lines[bad] : 0, bad < list.size() ? list[bad].first : "",
           bad < list.size() ? list[bad].second : "", vocab_file);
  t.compile(kGpt2Pattern);
  t.pre_tokenizer = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  t.post_processor = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  // GPT-2's <|endoftext|> is in the vocabulary; treat it as the special EOS token, as HF's GPT2Tokenizer
  // does.
  if (auto it = t.token_to_id.find("<|endoftext|>"); it != t.token_to_id.end()) {
    t.added.push_back({"<|endoftext|>", it->second, true});
    t.id_bytes[it->second] = "<|endoftext|>";
    tk.eos_ = it->second;
  }
  t.finish();
  return tk;
}

Tokenizer Tokenizer::from_tokenizer_json(const std::string& file) {
  Tokenizer tk;
  Impl& t = *tk.impl_;
  t.source = file;
  const nlohmann::json j = parse_json(read_file(file), file);
  const JsonField root(j, file);
  const JsonField m = root.object()["model"];
  m.object()["type"].one_of({"BPE"});
  if (m["byte_fallback"].boolean_or(false))
    m["byte_fallback"].fail("true (SentencePiece style, e.g. Llama 2) is not supported");
  if (m["dropout"].number_or(0.0, 0.0, 1.0) > 0.0)
    m["dropout"].fail("above 0 (BPE dropout) is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!m[k].string_or("").empty()) m[k].fail("is not supported (byte-level BPE has none)");
  if (root["normalizer"].present()) root["normalizer"].fail("is not supported (must be null)");
  // Ids index per-token tables: they may not exceed the count of tokens this file defines.
  const JsonField added = root["added_tokens"];
  const auto id_limit =
      static_cast<int64_t>(m["vocab"].object().size() + (added.present() ? added.array().size() : 0));
  set_vocab(t, m["vocab"], id_limit);
  read_merges(t, m["merges"]);
  t.ignore_merges = m["ignore_merges"].boolean_or(false);
  read_pre_tokenizer(t, root["pre_tokenizer"]);
  if (added.present()) read_added_tokens(t, added, id_limit);
  tk.bos_ = read_post_processor(t, root["post_processor"]);
  for (const char* eos : {"<|end_of_text|>", "<|endoftext|>", "</s>"})
    if (auto it = t.token_to_id.find(eos); it != t.token_to_id.end() && !tk.eos_) tk.eos_ = it->second;
  t.finish();
  return tk;
}

Tokenizer Tokenizer::from_pretrained(const std::string& path) {
  const fs::path p(path);
  if (fs::is_regular_file(p)) return from_tokenizer_json(path);
  TR_CHECK(fs::is_directory(p), "{}: no such tokenizer file or folder", path);
  if (fs::exists(p / "tokenizer.json")) return from_tokenizer_json((p / "tokenizer.json").string());
  if (fs::exists(p / "vocab.json") && fs::exists(p / "merges.txt"))
    return from_vocab_merges((p / "vocab.json").string(), (p / "merges.txt").string());
  if (fs::exists(p / "encoder.json") && fs::exists(p / "vocab.bpe"))
    return from_vocab_merges((p / "encoder.json").string(), (p / "vocab.bpe").string());
  fail("{}: no tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe", path);
}

namespace {

struct MatchScratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* stack = nullptr;
  explicit MatchScratch(const pcre2_code* re) {
    md = pcre2_match_data_create_from_pattern(re, nullptr);
    mc = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(mc, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
  }
};

void check_utf8(std::string_view text) {
  const size_t bad = first_invalid_utf8(text);
  TR_CHECK(bad == std::string_view::npos, "tokenizer: invalid UTF-8 at byte offset {}", bad);
}

}  // namespace

std::vector<int32_t> Tokenizer::encode_ordinary(std::string_view text) const {
  check_utf8(text);
  MatchScratch s(impl_->re);
  std::vector<int32_t> out;
  impl_->encode_plain(text, out, s.md, s.mc);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  check_utf8(text);
  MatchScratch s(impl_->re);
  std::vector<int32_t> out;
  if (add_special_tokens && bos_) out.push_back(*bos_);
  size_t pos = 0, start = 0;
  while (pos < text.size()) {
    const Impl::Added* hit = nullptr;
    if (impl_->added_first_byte[static_cast<unsigned char>(text[pos])]) {
      for (const auto& a : impl_->added)  // longest first
        if (text.compare(pos, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
    }
    if (hit) {
      if (pos > start) impl_->encode_plain(text.substr(start, pos - start), out, s.md, s.mc);
      out.push_back(hit->id);
      pos += hit->content.size();
      start = pos;
    } else {
      ++pos;
    }
  }
  if (start < text.size()) impl_->encode_plain(text.substr(start), out, s.md, s.mc);
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string_view>& texts,
                                                          int threads, bool allow_special) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  std::vector<std::string> errors(texts.size());
  const int nt = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (size_t i = 0; i < texts.size(); ++i) {
    try {
      out[i] = allow_special ? encode(texts[i], false) : encode_ordinary(texts[i]);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  }
  for (size_t i = 0; i < errors.size(); ++i) TR_CHECK(errors[i].empty(), "document {}: {}", i, errors[i]);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    TR_CHECK(id >= 0 && id < vocab_size() && (!impl_->id_bytes[id].empty() || !impl_->id_token[id].empty()),
             "decode: id {} at position {} is not in the vocabulary ({} entries)", id, i, vocab_size());
    out += impl_->id_bytes[id];
  }
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_bytes.size()); }

std::optional<int32_t> Tokenizer::token_to_id(const std::string& token) const {
  auto it = impl_->token_to_id.find(token);
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

void Tokenizer::save(const std::string& file) const {
  const Impl& t = *impl_;
  nlohmann::ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  if (!t.added_json.is_null() && !t.added_json.empty()) {
    added = t.added_json;
  } else {
    for (const auto& a : t.added)
      added.push_back({{"id", a.id},
                       {"content", a.content},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", a.special}});
  }
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = t.pre_tokenizer;
  j["post_processor"] = t.post_processor;
  j["decoder"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  nlohmann::json vocab = nlohmann::json::object();  // a std::map: ordered_json would insert in O(n) each
  for (size_t id = 0; id < t.id_token.size(); ++id)
    if (!t.id_token[id].empty() && t.bytes_to_id.count(t.id_bytes[id]) &&
        t.bytes_to_id.at(t.id_bytes[id]) == static_cast<int32_t>(id))
      vocab[t.id_token[id]] = id;
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (const auto& [a, b] : t.merge_list) merges.push_back({a, b});
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", t.ignore_merges},
                {"vocab", vocab},
                {"merges", merges}};
  const std::string tmp = file + ".tmp";
  write_file(tmp, j.dump(2, ' ', false, nlohmann::json::error_handler_t::strict) + "\n");
  fs::rename(tmp, file);
}

}  // namespace tr::tokenizers
