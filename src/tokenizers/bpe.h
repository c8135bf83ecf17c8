// The BPE model of a Hugging Face tokenizer: vocabulary, ranked merges, and the encoding of one pre-tokenized
// piece exactly as HF's Rust BPE does it (characters -> ids, with byte_fallback's <0xNN> tokens or the unk
// token for characters outside the vocabulary, then the lowest-ranked adjacent pair merged, leftmost first).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizers/pipeline.h"

namespace tr::tokenizers {

struct PairHash {
  size_t operator()(uint64_t k) const { return std::hash<uint64_t>()(k * 0x9E3779B97F4A7C15ull); }
};

class BpeModel {
 public:
  using MergeList = std::vector<std::pair<std::string, std::string>>;

  // Sets the vocabulary (ids below id_limit, each used once; ids index tables, so they may not exceed what
  // the file defines). Throws naming the field.
  void set_vocab(const JsonField& vocab, int64_t id_limit);
  // Adds merges in rank order; returns the index of the first merge whose tokens (or merged token) are not
  // in the vocabulary, or list.size().
  size_t add_merges(const MergeList& list);
  // Fixes the lookups that depend on the vocabulary (byte tokens, <0xNN> tokens, unk).
  void finish(const std::string& source);

  void tokenize(const Piece& piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> id(const std::string& token) const {
    auto it = vocab_.find(token);
    return it == vocab_.end() ? std::nullopt : std::optional<int32_t>(it->second);
  }
  const std::vector<std::string>& tokens() const { return id_token_; }  // id -> token ("" where unused)
  const MergeList& merges() const { return merge_list_; }

  std::optional<std::string> unk_token;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string continuing_subword_prefix, end_of_word_suffix;

 private:
  void symbols_of(std::string_view word, std::vector<int32_t>& sym) const;
  void merge_all(std::vector<int32_t>& sym) const;
  void tokenize_word(std::string_view word, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_token_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>, PairHash> merges_;  // (a, b) -> (rank, merged id)
  MergeList merge_list_;
  int32_t alphabet_id_[256];  // byte -> id of its GPT-2 alphabet character (-1: not in the vocabulary)
  int32_t fallback_id_[256];  // byte -> id of <0xNN> (-1: not in the vocabulary)
  bool all_alphabet_ = false;
  std::optional<int32_t> unk_id_;
  // SentencePiece-style vocabularies, whose pieces can be whole documents: when no token holds "▁" after
  // another character than "▁", no merge can span a "▁" that follows such a character, so a long piece is
  // merged word by word there - the same ids as merging it whole, without a heap over the document.
  bool splits_at_metaspace_ = false;
};

}  // namespace tr::tokenizers
