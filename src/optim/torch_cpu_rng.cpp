// torch's CPU normal_fill and randint as apollo_torch's random projections use them; see torch_cpu_rng.h.
#include "optim/torch_cpu_rng.h"

#include <cmath>

namespace tr::optim::detail {

namespace {

// at::uniform_real_distribution<float>(0, 1): the low 24 bits of a draw times 2^-24.
float uniform(std::mt19937& e) { return static_cast<float>((e() & ((1u << 24) - 1)) * std::ldexp(1.0, -24)); }

// normal_fill_16: u1 = 1 - data[j] (for the log), u2 = data[j + 8]; theta = 2 pi u2 in double, stored as a
// float; radius and the products in float (mean 0, std 1).
void normal_fill_16(float* data) {
  constexpr double kPi = 3.14159265358979323846;
  for (int j = 0; j < 8; ++j) {
    const float u1 = 1 - data[j], u2 = data[j + 8];
    const float radius = std::sqrt(-2 * std::log(u1));
    const float theta = static_cast<float>(2.0f * kPi * u2);
    data[j] = radius * std::cos(theta) * 1.0f + 0.0f;
    data[j + 8] = radius * std::sin(theta) * 1.0f + 0.0f;
  }
}

}  // namespace

std::vector<float> TorchCpuGenerator::randn(int64_t n) {
  if (n < 16) {
    // at::normal_distribution<double> per value: Box-Muller on two 53-bit uniform doubles, r cos(theta) now
    // and r sin(theta) cached for the next value; rounded to float.
    std::vector<float> out(static_cast<size_t>(n));
    constexpr double kPi = 3.14159265358979323846;
    for (int64_t i = 0; i < n; i += 2) {
      const double u1 = static_cast<double>(random64() & ((uint64_t{1} << 53) - 1)) * std::ldexp(1.0, -53);
      const double u2 = static_cast<double>(random64() & ((uint64_t{1} << 53) - 1)) * std::ldexp(1.0, -53);
      const double r = std::sqrt(-2.0 * std::log(1.0 - u2)), theta = 2.0 * kPi * u1;
      out[static_cast<size_t>(i)] = static_cast<float>(r * std::cos(theta));
      if (i + 1 < n) out[static_cast<size_t>(i + 1)] = static_cast<float>(r * std::sin(theta));
    }
    return out;
  }
  const int64_t size = n;
  std::vector<float> data(static_cast<size_t>(size));
  for (auto& v : data) v = uniform(engine_);
  for (int64_t i = 0; i + 15 < size; i += 16) normal_fill_16(data.data() + i);
  if (size % 16 != 0) {
    float* tail = data.data() + size - 16;
    for (int i = 0; i < 16; ++i) tail[i] = uniform(engine_);
    normal_fill_16(tail);
  }
  return data;
}

uint64_t apollo_next_seed(uint64_t seed) {
  TorchCpuGenerator g(seed);
  constexpr uint64_t kRange = (uint64_t{1} << 63) - 1;  // torch.iinfo(torch.int64).max, exclusive
  uint64_t v = 0;
  for (int i = 0; i < 15; ++i) v = g.random64() % kRange;
  return v;
}

}  // namespace tr::optim::detail
