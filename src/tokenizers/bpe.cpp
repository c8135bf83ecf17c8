// BPE encoding of one piece, as HF's Rust model (models/bpe/model.rs merge_word, word.rs merge_all).
#include "tokenizers/bpe.h"

#include <algorithm>
#include <queue>

#include "core/error.h"
#include "tokenizers/unicode.h"

namespace tr::tokenizers {

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

std::string shown(const std::string& token) {
  return nlohmann::json(token.substr(0, 60)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

void BpeModel::set_vocab(const JsonField& vocab, int64_t id_limit) {
  vocab.object();
  id_token_.assign(static_cast<size_t>(id_limit), std::string());
  vocab_.reserve(vocab.size());
  int64_t max_id = -1;
  vocab.each_member([&](const std::string& token, const JsonField& f) {
    const int64_t id = f.integer(0, id_limit - 1);
    if (token.empty()) f.fail("is an empty token");
    auto& slot = id_token_[static_cast<size_t>(id)];
    if (!slot.empty()) f.fail("has id {}, as has field '{}'", id, vocab[slot].path());
    slot = token;
    vocab_[token] = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
  });
  id_token_.resize(static_cast<size_t>(max_id + 1));
}

size_t BpeModel::add_merges(const MergeList& list) {
  merges_.reserve(list.size());
  int32_t rank = 0;
  for (const auto& [a, b] : list) {
    auto ia = vocab_.find(a), ib = vocab_.find(b), im = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end()) return static_cast<size_t>(rank);
    merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(rank, im->second));  // first rank wins
    ++rank;
  }
  merge_list_ = list;
  return list.size();
}

void BpeModel::finish(const std::string& source) {
  const auto& alphabet = byte_to_unicode();
  all_alphabet_ = continuing_subword_prefix.empty() && end_of_word_suffix.empty();
  for (int b = 0; b < 256; ++b) {
    alphabet_id_[b] = id(alphabet[b]).value_or(-1);
    all_alphabet_ = all_alphabet_ && alphabet_id_[b] >= 0;
    fallback_id_[b] = id(fmt::format("<0x{:02X}>", b)).value_or(-1);
  }
  if (unk_token) {
    unk_id_ = id(*unk_token);
    TR_CHECK(unk_id_.has_value(), "{}: model.unk_token {} is not in the vocabulary", source,
             shown(*unk_token));
  }
  // Every "▁" inside a token (past its first byte) must follow another "▁" (runs such as "▁▁▁▁" for
  // indentation are fine: splits never fall inside a run). Merge results are tokens, so then no merge joins
  // a character to a following "▁", and the words between such points merge independently.
  static constexpr std::string_view kMeta = "\xE2\x96\x81";
  splits_at_metaspace_ =
      continuing_subword_prefix.empty() && end_of_word_suffix.empty() && id(std::string(kMeta));
  for (const std::string& t : id_token_) {
    if (!splits_at_metaspace_) break;
    for (size_t at = t.find(kMeta, 1); at != std::string::npos; at = t.find(kMeta, at + 1))
      if (at < kMeta.size() || t.compare(at - kMeta.size(), kMeta.size(), kMeta) != 0) {
        splits_at_metaspace_ = false;
        break;
      }
  }
}

// merge_word's first half: each character becomes its vocabulary id (with the subword prefix/suffix where
// set), else its <0xNN> byte tokens (byte_fallback), else unk (runs fused with fuse_unk), else nothing.
void BpeModel::symbols_of(std::string_view w, std::vector<int32_t>& sym) const {
  int32_t pending_unk = -1;  // an unk waiting for the run of unknown characters to end
  std::string s;
  for (size_t i = 0; i < w.size();) {
    const size_t n = std::min(utf8_length(static_cast<unsigned char>(w[i])), w.size() - i);
    s.assign(w.substr(i, n));
    if (i > 0 && !continuing_subword_prefix.empty()) s.insert(0, continuing_subword_prefix);
    if (i + n == w.size() && !end_of_word_suffix.empty()) s += end_of_word_suffix;
    i += n;
    if (auto it = vocab_.find(s); it != vocab_.end()) {
      if (pending_unk >= 0) sym.push_back(pending_unk);
      pending_unk = -1;
      sym.push_back(it->second);
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (char c : s) all = all && fallback_id_[static_cast<unsigned char>(c)] >= 0;
      if (all) {  // HF adds these before a pending unk, which stays pending
        for (char c : s) sym.push_back(fallback_id_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk) sym.push_back(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) sym.push_back(pending_unk);
}

// Lowest rank first, leftmost among equals. Short words scan for the best pair (cheaper than a heap at
// GPT-2's typical 5 symbols); long ones (SentencePiece-style pieces can be whole documents) use HF's heap
// over a linked list. The two pick the same merge at every step, so they give the same ids.
void BpeModel::merge_all(std::vector<int32_t>& sym) const {
  if (sym.size() < 2) return;
  if (sym.size() <= 48) {
    while (sym.size() > 1) {
      int32_t best_rank = INT32_MAX, best_id = -1;
      size_t best_i = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = merges_.find(pair_key(sym[i], sym[i + 1]));
        if (it != merges_.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          best_id = it->second.second;
          best_i = i;
        }
      }
      if (best_id < 0) return;
      sym[best_i] = best_id;
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best_i) + 1);
    }
    return;
  }
  struct Merge {
    int32_t rank, pos, new_id;
    bool operator<(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }  // min-heap
  };
  const auto n = static_cast<int32_t>(sym.size());
  std::vector<int32_t> prev(sym.size()), next(sym.size());
  std::vector<bool> gone(sym.size(), false);
  std::vector<Merge> init;
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
    if (i + 1 < n)
      if (auto it = merges_.find(pair_key(sym[i], sym[i + 1])); it != merges_.end())
        init.push_back({it->second.first, i, it->second.second});
  }
  std::priority_queue<Merge> queue(std::less<Merge>(), std::move(init));
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    if (gone[top.pos] || next[top.pos] < 0) continue;
    const int32_t right = next[top.pos];
    auto it = merges_.find(pair_key(sym[top.pos], sym[right]));
    if (it == merges_.end() || it->second.second != top.new_id) continue;  // a stale entry
    sym[top.pos] = top.new_id;
    gone[right] = true;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0)
      if (auto m = merges_.find(pair_key(sym[prev[top.pos]], sym[top.pos])); m != merges_.end())
        queue.push({m->second.first, prev[top.pos], m->second.second});
    if (next[top.pos] >= 0)
      if (auto m = merges_.find(pair_key(sym[top.pos], sym[next[top.pos]])); m != merges_.end())
        queue.push({m->second.first, top.pos, m->second.second});
  }
  size_t k = 0;
  for (size_t i = 0; i < sym.size(); ++i)
    if (!gone[i]) sym[k++] = sym[i];
  sym.resize(k);
}

void BpeModel::tokenize(const Piece& p, std::vector<int32_t>& out) const {
  if (p.text.empty()) return;
  const bool fast = p.byte_level && all_alphabet_;
  if (ignore_merges) {
    const auto it = vocab_.find(p.byte_level ? byte_level_spelling(p.text) : p.text);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (fast) {
    std::vector<int32_t> sym;
    sym.reserve(p.text.size());
    for (char c : p.text) sym.push_back(alphabet_id_[static_cast<unsigned char>(c)]);
    merge_all(sym);
    out.insert(out.end(), sym.begin(), sym.end());
    return;
  }
  const std::string spelled = p.byte_level ? byte_level_spelling(p.text) : std::string();
  const std::string_view text = p.byte_level ? std::string_view(spelled) : std::string_view(p.text);
  if (!splits_at_metaspace_ || text.size() < 64) {
    tokenize_word(text, out);
    return;
  }
  // Word by word: cut before each "▁" that follows another character than "▁".
  static constexpr std::string_view kMeta = "\xE2\x96\x81";
  size_t start = 0;
  for (size_t at = text.find(kMeta, 1); at != std::string_view::npos; at = text.find(kMeta, at + 1)) {
    if (at >= kMeta.size() && text.compare(at - kMeta.size(), kMeta.size(), kMeta) == 0) continue;  // a run
    tokenize_word(text.substr(start, at - start), out);
    start = at;
  }
  tokenize_word(text.substr(start), out);
}

void BpeModel::tokenize_word(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<int32_t> sym;
  sym.reserve(word.size());
  symbols_of(word, sym);
  merge_all(sym);
  out.insert(out.end(), sym.begin(), sym.end());
}

}  // namespace tr::tokenizers
