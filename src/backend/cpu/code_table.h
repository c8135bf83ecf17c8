// Nearest-code lookup for bitsandbytes' 8-bit optimizer states on the CPU: quantize_code (adamw8bit_math.h)
// by a table over the float's order, in place of a binary search of the 256-entry map per value.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace tr::cpu {

// quantize_code(code, x) bit for bit for every float x (NaN included). The floats, in their order, are cut
// into 2^19 buckets of 2^13 consecutive values; a bucket keeps the codes of its first and last value. The
// code is monotone in x, so where the two agree every value between has that code: one load. A bucket that
// holds a boundary between codes (a midpoint; at most a few hundred of the half million) falls back to the
// search. The binary search's eight dependent loads per value bound the 8-bit step on the CPU (16-lane
// gathers are slow on Zen 4); this is one independent load.
class CodeTable {
 public:
  explicit CodeTable(const float* code);
  const std::array<float, 256>& code() const { return code_; }
  uint8_t operator()(float x) const;
  // The bucket count, and how many buckets need the search (for the tests).
  static constexpr int kShift = 13;
  static constexpr uint32_t kBuckets = 1u << (32 - kShift);
  uint32_t searched_buckets() const;

 private:
  std::array<float, 256> code_;
  std::vector<uint16_t> ends_;  // per bucket: the code of its first value | the code of its last << 8
};

// The tables of the code maps a backend has seen (two for AdamW, one for the one-state optimizers): made once
// per map, 1 MiB each.
class CodeTables {
 public:
  const CodeTable& of(const float* code);

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<CodeTable>> tables_;
};

}  // namespace tr::cpu
