// torch's CPU generator as far as apollo_torch draws from it (torch.Generator().manual_seed(s), torch.randn
// of floats, torch.randint over int64's range), so APOLLO's random projections are the ones torch makes.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace tr::optim::detail {

class TorchCpuGenerator {
 public:
  // manual_seed: MT19937 seeded with the seed's low 32 bits (at::mt19937 is the standard engine).
  explicit TorchCpuGenerator(uint64_t seed) : engine_(static_cast<uint32_t>(seed)) {}
  uint32_t random() { return engine_(); }
  // Two draws, the first as the high half.
  uint64_t random64() {
    const uint64_t hi = engine_(), lo = engine_();
    return (hi << 32) | lo;
  }
  // torch.randn(n) in f32 as torch's CPU kernel computes it: from 16 values normal_fill (n uniform floats
  // from 24-bit draws, Box-Muller over blocks of 16 - values j and j + 8 from one pair - the last 16 drawn
  // again and transformed when n is not a multiple of 16); below 16, normal_distribution<double> value by
  // value.
  std::vector<float> randn(int64_t n);

 private:
  std::mt19937 engine_;
};

// apollo_torch's next_seed(seed): the last of 15 torch.randint(0, 2^63 - 1) draws of a generator seeded with
// `seed`.
uint64_t apollo_next_seed(uint64_t seed);

}  // namespace tr::optim::detail
