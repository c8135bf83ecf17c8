// Tokenizer: loading tokenizer.json / vocab + merges (every field and id checked), added-token matching
// (leftmost-longest, lstrip/rstrip/single_word, raw or normalized), the pipeline per piece, post-processing,
// decoding and saving.
#include "tokenizers/tokenizer.h"

#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_writer.h"
#include "core/json_fields.h"
#include "tokenizers/bpe.h"
#include "tokenizers/pipeline.h"
#include "tokenizers/unicode.h"

namespace tr::tokenizers {

namespace fs = std::filesystem;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TR_CHECK(in.is_open(), "{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A token as a JSON string literal for messages (escaped, one line, cut at 60 bytes).
std::string shown(const std::string& token) {
  return nlohmann::json(token.substr(0, 60)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip, single_word, normalized;
};

// A run of text (id < 0) or an added token, at `offset` in the text it came from.
struct Segment {
  std::string text;
  size_t offset;
  int32_t id;
};

size_t utf8_start(std::string_view s, size_t i) {
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

// Leftmost-longest matching of a set of added tokens (a byte trie), with HF's lstrip / rstrip / single_word.
class AddedMatcher {
 public:
  void add(const AddedToken& t) {
    int32_t node = 0;
    for (char ch : t.content) {
      const auto c = static_cast<unsigned char>(ch);
      auto& kids = nodes_[static_cast<size_t>(node)].next;
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == c; });
      if (it == kids.end()) {
        kids.emplace_back(c, static_cast<int32_t>(nodes_.size()));
        node = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
      } else {
        node = it->second;
      }
    }
    nodes_[static_cast<size_t>(node)].token = &t;
    first_[static_cast<unsigned char>(t.content[0])] = true;
    any_ = true;
  }

  void split(std::string_view text, size_t base, std::vector<Segment>& out) const {
    if (!any_) {
      if (!text.empty()) out.push_back({std::string(text), base, -1});
      return;
    }
    size_t start_offset = 0, pos = 0;
    while (pos < text.size()) {
      const AddedToken* hit = first_[static_cast<unsigned char>(text[pos])] ? longest_at(text, pos) : nullptr;
      if (!hit) {
        ++pos;
        continue;
      }
      size_t start = pos, stop = pos + hit->content.size();
      pos = stop;
      if (hit->single_word && !(word_boundary_before(text, start) && word_boundary_after(text, stop)))
        continue;
      if (hit->lstrip) {
        size_t s = start;
        while (s > 0) {
          const size_t c = utf8_start(text, s - 1);
          size_t n = 0;
          if (!is_whitespace(utf8_decode(text, c, &n))) break;
          s = c;
        }
        start = std::max(s, start_offset);
      }
      if (hit->rstrip) {
        while (stop < text.size()) {
          size_t n = 0;
          if (!is_whitespace(utf8_decode(text, stop, &n))) break;
          stop += n;
        }
        pos = stop;
      }
      if (start_offset < start)
        out.push_back(
            {std::string(text.substr(start_offset, start - start_offset)), base + start_offset, -1});
      out.push_back({std::string(), base + start, hit->id});
      start_offset = stop;
    }
    if (start_offset < text.size())
      out.push_back({std::string(text.substr(start_offset)), base + start_offset, -1});
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;
    const AddedToken* token = nullptr;
  };

  const AddedToken* longest_at(std::string_view text, size_t pos) const {
    const AddedToken* best = nullptr;
    int32_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      const auto& kids = nodes_[static_cast<size_t>(node)].next;
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == c; });
      if (it == kids.end()) break;
      node = it->second;
      if (nodes_[static_cast<size_t>(node)].token) best = nodes_[static_cast<size_t>(node)].token;
    }
    return best;
  }
  static bool word_boundary_before(std::string_view t, size_t at) {
    if (at == 0) return true;
    size_t n = 0;
    return !is_word_char(utf8_decode(t, utf8_start(t, at - 1), &n));
  }
  static bool word_boundary_after(std::string_view t, size_t at) {
    size_t n = 0;
    return at >= t.size() || !is_word_char(utf8_decode(t, at, &n));
  }

  std::vector<Node> nodes_{1};
  bool first_[256] = {};
  bool any_ = false;
};

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  std::string json_text, config_text;  // as read, for saving (empty: synthesized from vocab + merges)
  BpeModel model;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  std::vector<AddedToken> added;
  // [normalized?][special tokens matched?]
  AddedMatcher matchers[2][2];
  std::vector<std::string> id_token;    // id -> token string for decoding (model token or added content)
  std::vector<int32_t> prefix, suffix;  // the post-processor's tokens around one sequence
  std::optional<int32_t> eos;

  void build_matchers() {
    for (const AddedToken& t : added)
      for (int special = 0; special < 2; ++special)
        if (special || !t.special) matchers[t.normalized ? 1 : 0][special].add(t);
  }

  void encode(std::string_view text, bool match_special, bool add_special, std::vector<int32_t>& out) const {
    const size_t bad = first_invalid_utf8(text);
    TR_CHECK(bad == std::string_view::npos, "tokenizer: invalid UTF-8 at byte offset {}", bad);
    MatchScratch scratch;
    if (add_special) out.insert(out.end(), prefix.begin(), prefix.end());
    std::vector<Segment> raw, norm;
    matchers[0][match_special].split(text, 0, raw);
    std::vector<Piece> pieces;
    for (Segment& seg : raw) {
      if (seg.id >= 0) {
        out.push_back(seg.id);
        continue;
      }
      std::string normalized =
          normalizer ? normalizer->apply(std::move(seg.text), scratch) : std::move(seg.text);
      norm.clear();
      matchers[1][match_special].split(normalized, 0, norm);
      for (Segment& sub : norm) {
        if (sub.id >= 0) {
          out.push_back(sub.id);
          continue;
        }
        pieces.clear();
        pieces.push_back({std::move(sub.text), false, seg.offset == 0 && sub.offset == 0});
        if (pre_tokenizer) pre_tokenizer->apply(pieces, scratch);
        for (const Piece& p : pieces) model.tokenize(p, out);
      }
    }
    if (add_special) out.insert(out.end(), suffix.begin(), suffix.end());
  }
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

namespace {

// model.merges of tokenizer.json: "a b" strings or [a, b] pairs of vocabulary tokens.
void read_merges(BpeModel& model, const JsonField& merges) {
  BpeModel::MergeList list;
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
  const size_t bad = model.add_merges(list);
  if (bad < list.size())
    merges[bad].fail("merges {} and {}, which (or whose merged token) are not in the vocabulary",
                     shown(list[bad].first), shown(list[bad].second));
}

// added_tokens: each id below `id_limit` and used once; an id inside the model's vocabulary must be that
// token's own (as GPT-2's <|endoftext|> is).
void read_added_tokens(Tokenizer::Impl& t, const JsonField& added, int64_t id_limit) {
  const auto& vocab = t.model.tokens();
  std::vector<bool> taken(static_cast<size_t>(id_limit), false);
  std::unordered_map<std::string, int32_t> contents;
  added.each_element([&](const JsonField& a) {
    a.object();
    const auto id = static_cast<int32_t>(a["id"].integer(0, id_limit - 1));
    const std::string content = a["content"].string();
    if (content.empty()) a["content"].fail("is empty (an empty token would match everywhere)");
    if (taken[static_cast<size_t>(id)]) a["id"].fail("repeats id {} of an earlier added token", id);
    taken[static_cast<size_t>(id)] = true;
    if (!contents.emplace(content, id).second)
      a["content"].fail("repeats the added token {} (id {})", shown(content), contents[content]);
    const auto i = static_cast<size_t>(id);
    if (i < vocab.size() && !vocab[i].empty() && vocab[i] != content)
      a["id"].fail("{} is the vocabulary's token {}, not {}", id, shown(vocab[i]), shown(content));
    const bool special = a["special"].boolean_or(false);
    t.added.push_back({content, id, special, a["lstrip"].boolean_or(false), a["rstrip"].boolean_or(false),
                       a["single_word"].boolean_or(false), a["normalized"].boolean_or(!special)});
  });
}

// The ids of a template's special token: from special_tokens, else (files HF would refuse, written by hand)
// the vocabulary's token of that name.
std::vector<int32_t> special_ids(const Tokenizer& tk, const JsonField& specials, const JsonField& name,
                                 int64_t vocab) {
  const std::string key = name.string();
  const JsonField s = specials.present() ? specials.object()[key] : specials;
  if (!s.present()) {
    if (auto id = tk.token_to_id(key)) return {*id};
    name.fail("names {}, which is not a token of this tokenizer", shown(key));
  }
  std::vector<int32_t> ids;
  s.object()["ids"].array().each_element(
      [&](const JsonField& id) { ids.push_back(static_cast<int32_t>(id.integer(0, vocab - 1))); });
  return ids;
}

// The tokens a post-processor adds around a single sequence.
void read_post_processor(Tokenizer::Impl& t, const Tokenizer& tk, const JsonField& pp, int64_t vocab) {
  if (!pp.present()) return;
  const std::string type = pp.object()["type"].one_of(
      {"TemplateProcessing", "ByteLevel", "Sequence", "RobertaProcessing", "BertProcessing"});
  if (type == "Sequence") {
    pp["processors"].array().each_element([&](const JsonField& e) { read_post_processor(t, tk, e, vocab); });
  } else if (type == "TemplateProcessing") {
    bool seen_sequence = false;
    pp["single"].array().each_element([&](const JsonField& item) {
      item.object();
      if (item["Sequence"].present()) {
        if (seen_sequence) item.fail("repeats the sequence (a single-sequence template holds one)");
        seen_sequence = true;
      } else if (item["SpecialToken"].present()) {
        const auto ids = special_ids(tk, pp["special_tokens"], item["SpecialToken"]["id"], vocab);
        auto& side = seen_sequence ? t.suffix : t.prefix;
        side.insert(side.end(), ids.begin(), ids.end());
      } else {
        item.fail_expected("{\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
    });
    if (!seen_sequence) pp["single"].fail("has no {{\"Sequence\": ...}} item");
  } else if (type != "ByteLevel") {  // Roberta / Bert: <cls> A <sep>
    t.prefix.push_back(static_cast<int32_t>(pp["cls"][1].integer(0, vocab - 1)));
    t.suffix.push_back(static_cast<int32_t>(pp["sep"][1].integer(0, vocab - 1)));
  }
}

// A special token named in tokenizer_config.json: a string or {"content": ...}; nullopt when null.
std::optional<int32_t> config_token(const Tokenizer::Impl& t, const JsonField& f, const Tokenizer& tk) {
  if (!f.present()) return std::nullopt;
  const std::string name = f.raw().is_object() ? f["content"].string() : f.string();
  const auto id = tk.token_to_id(name);
  if (!id) f.fail("names {}, which is not a token of {}", shown(name), t.source);
  return id;
}

// tokenizer_config.json's add_bos_token / add_eos_token decide the BOS / EOS around a sequence, as HF's
// Llama and Gemma tokenizers rebuild their post-processor from them.
void read_config(Tokenizer::Impl& t, const std::string& file, const Tokenizer& tk) {
  t.config_text = read_file(file);
  const nlohmann::json j = parse_json(t.config_text, file);
  const JsonField root(j, file);
  root.object();
  // add_X_token present: the config decides that side of the template, with X_token as its one token.
  auto side = [&](const char* add, const char* token, std::vector<int32_t>& ids) {
    if (!root[add].present()) return;
    ids.clear();
    if (!root[add].boolean()) return;
    const auto id = config_token(t, root[token], tk);
    if (!id) root[add].fail("is true, but {} is not set", token);
    ids.push_back(*id);
  };
  side("add_bos_token", "bos_token", t.prefix);
  side("add_eos_token", "eos_token", t.suffix);
  if (!t.eos && root["eos_token"].present()) t.eos = config_token(t, root["eos_token"], tk);
}

void finish(Tokenizer::Impl& t) {
  t.model.finish(t.source);
  const auto& vocab = t.model.tokens();
  t.id_token = vocab;
  for (const AddedToken& a : t.added) {
    if (static_cast<size_t>(a.id) >= t.id_token.size()) t.id_token.resize(static_cast<size_t>(a.id) + 1);
    t.id_token[static_cast<size_t>(a.id)] = a.content;
  }
  t.build_matchers();
  // The end-of-text token separating documents: the base model's special token, not a chat template's
  // end-of-turn (which tokenizer_config.json's eos_token often names) nor an ordinary piece spelled alike.
  for (const char* eos : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"})
    for (const AddedToken& a : t.added)
      if (!t.eos && a.special && a.content == eos) t.eos = a.id;
}

}  // namespace

Tokenizer Tokenizer::from_vocab_merges(const std::string& vocab_file, const std::string& merges_file) {
  Tokenizer tk;
  Impl& t = *tk.impl_;
  t.source = vocab_file;
  const nlohmann::json vocab = parse_json(read_file(vocab_file), vocab_file);
  const JsonField root(vocab, vocab_file);
  t.model.set_vocab(root, static_cast<int64_t>(root.object().size()));
  BpeModel::MergeList list;
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
  const size_t bad = t.model.add_merges(list);
  TR_CHECK(bad == list.size(), "{}: line {}: merge '{} {}' uses tokens missing from {}", merges_file,
           bad < lines.size() ? lines[bad] : 0, bad < list.size() ? list[bad].first : "",
           bad < list.size() ? list[bad].second : "", vocab_file);
  t.pre_tokenizer = gpt2_byte_level();
  const nlohmann::json byte_level = {{"type", "ByteLevel"}};
  t.decoder = read_decoder(JsonField(byte_level, vocab_file));
  // GPT-2's <|endoftext|> is in the vocabulary; HF's GPT2Tokenizer treats it as a special token.
  if (auto id = t.model.id("<|endoftext|>"))
    t.added.push_back({"<|endoftext|>", *id, true, false, false, false, false});
  finish(t);
  return tk;
}

Tokenizer Tokenizer::from_tokenizer_json(const std::string& file, const std::string& config_file) {
  Tokenizer tk;
  Impl& t = *tk.impl_;
  t.source = file;
  t.json_text = read_file(file);
  const nlohmann::json j = parse_json(t.json_text, file);
  const JsonField root(j, file);
  const JsonField m = root.object()["model"];
  m.object()["type"].one_of({"BPE"});
  if (m["dropout"].number_or(0.0, 0.0, 1.0) > 0.0)
    m["dropout"].fail(
        "above 0 (BPE dropout) is not supported: training data must encode the same every time");
  t.model.byte_fallback = m["byte_fallback"].boolean_or(false);
  t.model.fuse_unk = m["fuse_unk"].boolean_or(false);
  t.model.ignore_merges = m["ignore_merges"].boolean_or(false);
  t.model.continuing_subword_prefix = m["continuing_subword_prefix"].string_or("");
  t.model.end_of_word_suffix = m["end_of_word_suffix"].string_or("");
  if (m["unk_token"].present()) t.model.unk_token = m["unk_token"].string();
  // Ids index per-token tables: they may not exceed the count of tokens this file defines.
  const JsonField added = root["added_tokens"];
  const auto id_limit =
      static_cast<int64_t>(m["vocab"].object().size() + (added.present() ? added.array().size() : 0));
  t.model.set_vocab(m["vocab"], id_limit);
  read_merges(t.model, m["merges"]);
  t.normalizer = read_normalizer(root["normalizer"]);
  t.pre_tokenizer = read_pre_tokenizer(root["pre_tokenizer"]);
  t.decoder = read_decoder(root["decoder"]);
  if (added.present()) read_added_tokens(t, added, id_limit);
  finish(t);
  read_post_processor(t, tk, root["post_processor"], tk.vocab_size());
  if (!config_file.empty()) read_config(t, config_file, tk);
  return tk;
}

Tokenizer Tokenizer::from_pretrained(const std::string& path) {
  const fs::path p(path);
  if (fs::is_regular_file(p)) {
    const fs::path config = p.parent_path() / "tokenizer_config.json";
    return from_tokenizer_json(path,
                               p.filename() == "tokenizer.json" && fs::exists(config) ? config.string() : "");
  }
  TR_CHECK(fs::is_directory(p), "{}: no such tokenizer file or folder", path);
  if (fs::exists(p / "tokenizer.json"))
    return from_tokenizer_json((p / "tokenizer.json").string(), fs::exists(p / "tokenizer_config.json")
                                                                    ? (p / "tokenizer_config.json").string()
                                                                    : "");
  if (fs::exists(p / "vocab.json") && fs::exists(p / "merges.txt"))
    return from_vocab_merges((p / "vocab.json").string(), (p / "merges.txt").string());
  if (fs::exists(p / "encoder.json") && fs::exists(p / "vocab.bpe"))
    return from_vocab_merges((p / "encoder.json").string(), (p / "vocab.bpe").string());
  fail("{}: no tokenizer.json, vocab.json + merges.txt, or encoder.json + vocab.bpe", path);
}

std::vector<int32_t> Tokenizer::encode_ordinary(std::string_view text) const {
  std::vector<int32_t> out;
  impl_->encode(text, false, false, out);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  impl_->encode(text, true, add_special_tokens, out);
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string_view>& texts,
                                                          int threads, bool allow_special,
                                                          bool add_special_tokens) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  std::vector<std::string> errors(texts.size());
  const int nt = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (size_t i = 0; i < texts.size(); ++i) {
    try {
      impl_->encode(texts[i], allow_special, add_special_tokens, out[i]);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  }
  for (size_t i = 0; i < errors.size(); ++i) TR_CHECK(errors[i].empty(), "document {}: {}", i, errors[i]);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const auto& names = impl_->id_token;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    TR_CHECK(id >= 0 && static_cast<size_t>(id) < names.size() && !names[static_cast<size_t>(id)].empty(),
             "decode: id {} at position {} is not in the vocabulary ({} entries)", id, i, vocab_size());
    tokens.push_back(names[static_cast<size_t>(id)]);
  }
  if (!impl_->decoder) {  // HF joins the tokens with spaces
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  impl_->decoder->apply(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_token.size()); }

std::optional<int32_t> Tokenizer::token_to_id(const std::string& token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  return impl_->model.id(token);
}

std::optional<int32_t> Tokenizer::bos_token_id() const {
  return impl_->prefix.empty() ? std::nullopt : std::optional<int32_t>(impl_->prefix.front());
}

std::optional<int32_t> Tokenizer::eos_token_id() const { return impl_->eos; }

bool Tokenizer::adds_eos() const {
  return impl_->eos && !impl_->suffix.empty() && impl_->suffix.back() == *impl_->eos;
}

void Tokenizer::save(const std::string& file) const {
  const Impl& t = *impl_;
  std::string text = t.json_text;
  if (text.empty()) {  // vocab + merges: HF's tokenizer.json for GPT-2
    nlohmann::ordered_json j;
    j["version"] = "1.0";
    j["truncation"] = nullptr;
    j["padding"] = nullptr;
    nlohmann::ordered_json added = nlohmann::ordered_json::array();
    for (const auto& a : t.added)
      added.push_back({{"id", a.id},
                       {"content", a.content},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", a.special}});
    j["added_tokens"] = added;
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {
        {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
    j["post_processor"] = {
        {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
    j["decoder"] = {
        {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
    nlohmann::json vocab = nlohmann::json::object();  // a std::map: ordered_json would insert in O(n) each
    const auto& tokens = t.model.tokens();
    for (size_t id = 0; id < tokens.size(); ++id)
      if (!tokens[id].empty()) vocab[tokens[id]] = id;
    nlohmann::ordered_json merges = nlohmann::ordered_json::array();
    for (const auto& [a, b] : t.model.merges()) merges.push_back({a, b});
    j["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", false},
                  {"vocab", vocab},
                  {"merges", merges}};
    text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::strict) + "\n";
  }
  const std::string tmp = file + ".tmp";
  write_file(tmp, text);
  fs::rename(tmp, file);
}

void Tokenizer::save_pretrained(const std::string& dir) const {
  save((fs::path(dir) / "tokenizer.json").string());
  if (!impl_->config_text.empty()) {
    const std::string file = (fs::path(dir) / "tokenizer_config.json").string();
    write_file(file + ".tmp", impl_->config_text);
    fs::rename(file + ".tmp", file);
  }
}

}  // namespace tr::tokenizers
