// CodeTable: the buckets' end codes from quantize_code, and the lookup.
#include "backend/cpu/code_table.h"

#include <algorithm>
#include <cstring>

#include "backend/adamw8bit_math.h"

namespace tr::cpu {

namespace {

// The float's bits as an unsigned key in the floats' order (-inf < ... < -0 < +0 < ... < +inf; NaNs beyond).
uint32_t order_key(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

float from_key(uint32_t key) {
  const uint32_t u = (key & 0x80000000u) != 0 ? (key & 0x7FFFFFFFu) : ~key;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace

CodeTable::CodeTable(const float* code) : ends_(kBuckets) {
  std::copy(code, code + 256, code_.begin());
  for (uint32_t b = 0; b < kBuckets; ++b) {
    const float first = from_key(b << kShift), last = from_key((b << kShift) | ((1u << kShift) - 1));
    uint16_t e = 0xFF00;  // a bucket with NaNs: searched (quantize_code gives NaN code 0)
    if (first == first && last == last)
      e = static_cast<uint16_t>(backend::quantize_code(code_.data(), first) |
                                (backend::quantize_code(code_.data(), last) << 8));
    ends_[b] = e;
  }
}

uint8_t CodeTable::operator()(float x) const {
  const uint16_t e = ends_[order_key(x) >> kShift];
  const int lo = e & 0xFF, hi = e >> 8;
  if (lo == hi) return static_cast<uint8_t>(lo);
  // The code is in [lo, hi], so x's lower bound (the first code >= x) is in [lo, hi + 1]: a short scan
  // (a NaN stops at once: code 0 as quantize_code gives it).
  int bound = lo;
  while (bound <= hi && code_[static_cast<size_t>(bound)] < x) ++bound;
  return backend::code_from_bound(code_.data(), x, bound);
}

uint32_t CodeTable::searched_buckets() const {
  return static_cast<uint32_t>(
      std::count_if(ends_.begin(), ends_.end(), [](uint16_t e) { return (e & 0xFF) != (e >> 8); }));
}

const CodeTable& CodeTables::of(const float* code) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& t : tables_)
    if (std::equal(t->code().begin(), t->code().end(), code)) return *t;
  tables_.push_back(std::make_unique<CodeTable>(code));
  return *tables_.back();
}

}  // namespace tr::cpu
