// Counter-based random numbers (Philox4x32-10) and a Generator holding (seed, offset): element i of a draw
// depends only on (seed, offset, i), so CPU and GPU produce the same bits and a checkpoint region can
// replay dropout exactly by restoring the offset.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace tr {

struct Philox4 {
  uint32_t w[4];
};

TR_HD Philox4 philox4x32(uint64_t counter, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// The i-th 32-bit random word of the stream that starts at counter `offset` under `seed`.
TR_HD uint32_t philox_word(uint64_t seed, uint64_t offset, uint64_t i) {
  const Philox4 b = philox4x32(offset + i / 4, seed);
#ifdef __CUDA_ARCH__  // selects: a block indexed by a runtime i % 4 went through local memory
  const uint64_t j = i % 4;
  return j == 0 ? b.w[0] : j == 1 ? b.w[1] : j == 2 ? b.w[2] : b.w[3];
#else
  return b.w[i % 4];
#endif
}

// The N words first .. first + N - 1 of that stream into w, for first and N multiples of 4: N / 4 blocks,
// none made twice (a GPU thread's pack of dropout elements; philox_word per element makes each block 4
// times).
template <int N>
TR_HD void philox_block_words(uint64_t seed, uint64_t offset, uint64_t first, uint32_t (&w)[N]) {
  static_assert(N % 4 == 0, "whole blocks");
  for (int b = 0; b < N / 4; ++b) {
    const Philox4 r = philox4x32(offset + first / 4 + static_cast<uint64_t>(b), seed);
    for (int k = 0; k < 4; ++k) w[4 * b + k] = r.w[k];
  }
}

// Calls f(k, word) for the words first .. first + n - 1 of that stream, k counting from 0: philox_word's
// words, with each Philox block computed once for its four words (host loops over runs of a draw).
template <typename F>
void philox_words(uint64_t seed, uint64_t offset, uint64_t first, int64_t n, F&& f) {
  const uint64_t end = first + static_cast<uint64_t>(n);
  for (uint64_t i = first; i < end;) {
    const Philox4 b = philox4x32(offset + i / 4, seed);
    for (uint64_t j = i % 4; j < 4 && i < end; ++j, ++i) f(static_cast<int64_t>(i - first), b.w[j]);
  }
}

// Uniform in [0, 1) with 24 random bits. Converted as a signed int (the same value: w >> 8 < 2^24), which
// AVX2 converts in vectors where an unsigned one keeps GCC's loops scalar.
TR_HD float uniform_from_word(uint32_t w) {
  return static_cast<float>(static_cast<int32_t>(w >> 8)) * (1.0f / 16777216.0f);
}

class Generator {
 public:
  struct State {
    uint64_t seed = 0;
    uint64_t offset = 0;
    bool operator==(const State&) const = default;
  };

  // This process's part of a batch split across processes (distributed data parallel): samples [first,
  // first + count) of a batch of `total`, cut into slices of `unit` samples per process. While set, a draw of
  // n words for the local batch (n / count words per sample) starts where the whole batch's draw would have
  // put this part and the generator advances by the whole batch's draw: each process's dropout is its slice
  // of the single-process mask. An offset moves by whole 4-word counters, so when a slice's words are not a
  // multiple of 4 each process instead takes the next free counter after the slices before it: disjoint
  // streams, the same advance everywhere, but not the single process's bits.
  struct Shard {
    int64_t first = 0, count = 0, total = 0, unit = 0;
  };

  explicit Generator(uint64_t seed = 42) : state_{seed, 0} {}
  // Reserves room for `n` random words and returns the counter offset where they start.
  uint64_t reserve(uint64_t n) {
    uint64_t start = state_.offset, counters = (n + 3) / 4;
    if (shard_.count > 0 && shard_.unit > 0 && n % static_cast<uint64_t>(shard_.count) == 0) {
      const uint64_t per = n / static_cast<uint64_t>(shard_.count), unit = static_cast<uint64_t>(shard_.unit);
      const uint64_t first = static_cast<uint64_t>(shard_.first), total = static_cast<uint64_t>(shard_.total);
      if (per * unit % 4 == 0) {  // every slice starts on a counter: the single process's words
        start += per * first / 4;
        counters = (per * total + 3) / 4;
      } else {
        const uint64_t stride = (per * unit + 3) / 4;
        start += first / unit * stride;
        counters = (total + unit - 1) / unit * stride;
      }
    }
    state_.offset += counters;
    return start;
  }
  void set_shard(Shard s) { shard_ = s; }
  void clear_shard() { shard_ = {}; }
  uint64_t seed() const { return state_.seed; }
  State state() const { return state_; }
  void set_state(State s) { state_ = s; }
  void manual_seed(uint64_t seed) { state_ = {seed, 0}; }

 private:
  State state_;
  Shard shard_;
};

}  // namespace tr
