// 8-bit AdamW as bitsandbytes' blockwise AdamW8bit (adamw_bnb_8bit / adamw_8bit, paged=False): both moments
// stored as one byte per element in blocks of 256 with an fp32 absmax per block, m on the signed dynamic-tree
// map and v on the unsigned one. Small tensors and embeddings keep 32-bit state, as bitsandbytes and the
// Trainer.
#pragma once
#include <array>
#include <cstdint>

#include "optim/optimizer.h"

namespace tr::optim {

// bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): 256 sorted codes, a sign
// (signed only), a decimal exponent 10^-k and a linear fraction; the signed map spans [-0.993, 1] and holds
// 0, the unsigned one spans [0, 1].
const std::array<float, 256>& dynamic_map(bool is_signed);
// Index of the code nearest to x (a tie goes to the even index, as bitsandbytes' binary search decides);
// x beyond the ends maps to the first or last code.
uint8_t quantize_to_code(const std::array<float, 256>& code, float x);

class AdamW8bit : public Optimizer {
 public:
  static constexpr int64_t kBlock = 256;
  // --optim_args: min_8bit_size (4096: tensors with fewer elements keep 32-bit state, bitsandbytes' default).
  // Weight decay from the options on the names decays() accepts, applied after the Adam step as bitsandbytes'
  // kernels do: p = (p - lr * m_hat / (sqrt(v_hat) + eps)) * (1 - lr * wd).
  // optim_bits 32: bitsandbytes' 32-bit AdamW (paged_adamw_32bit), every tensor on the 32-bit-state kernel.
  AdamW8bit(const nn::ParamList& params, OptimizerOptions opts, int optim_bits = 8);
  int64_t step_count() const override { return step_; }
  // {"step", per parameter "state1.<name>", "state2.<name>" (u8 codes, flat) + "absmax1.<name>",
  //  "absmax2.<name>" (f32 per block), or "state1"/"state2" as f32 tensors for 32-bit state}
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

  // Whether a parameter keeps 32-bit state: fewer than min_8bit_size elements, or an embedding (the Trainer
  // registers every nn.Embedding weight for 32-bit state: names with "embed", "wte" or "wpe").
  static bool keeps_32bit_state(const std::string& name, int64_t numel, int64_t min_8bit_size = 4096);

 protected:
  void step_params(size_t lo, size_t hi, bool advance) override;

 private:
  struct Slot {
    std::string name;
    Tensor* param;
    bool eight_bit, decay;
    Tensor state1, state2;    // u8 codes [numel] or f32 [shape]
    Tensor absmax1, absmax2;  // f32 [blocks] (8-bit only)
  };
  std::vector<Slot> slots_;
  Tensor signed_map_, unsigned_map_;  // the dynamic maps on the parameters' device
  int64_t min_8bit_size_ = 4096;
  int64_t step_ = 0;
};

}  // namespace tr::optim
