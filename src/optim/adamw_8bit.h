// bitsandbytes' two-state optimizers. 8-bit AdamW as its blockwise AdamW8bit (adamw_bnb_8bit / adamw_8bit):
// both moments stored as one byte per element in blocks of 256 with an fp32 absmax per block, m on the signed
// dynamic-tree map and v on the unsigned one; and AdEMAMix (ademamix*), whose slow EMA m2 is stored as m is.
// Small tensors and embeddings keep 32-bit state, as bitsandbytes and the Trainer.
#pragma once
#include <array>
#include <cstdint>
#include <optional>

#include "backend/adamw8bit_math.h"
#include "optim/optimizer.h"

namespace tr::optim {

namespace detail {
class OptimArgs;
}

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
  // ademamix: bitsandbytes' AdEMAMix (arXiv 2409.03137) as HF builds it: --optim_args beta1, beta2 (default
  // adam_beta1/2), beta3 (0.9999), alpha (5), eps (adam_epsilon), t_alpha and t_beta3 (steps of the alpha and
  // beta3 warm-up schedules; absent or 0: none). Its step, as bitsandbytes' kernels compute it:
  // p = (p - lr * (m1 / (1 - b1^t) + alpha * m2) / (sqrt(nu) / sqrt(1 - b2^t) + eps)) * (1 - lr * wd).
  // bitsandbytes packs m1 and m2 into one buffer and reads m2's 8-bit absmax at (n + i) / 256: where n is not
  // a multiple of 256, m2's first block shares a slot with m1's last (two CUDA blocks race on it). Here each
  // state has its own absmax: bitsandbytes' bits wherever 256 divides n (GPT-2's and Llama's matrices).
  AdamW8bit(const nn::ParamList& params, OptimizerOptions opts, int optim_bits = 8, bool ademamix = false);
  int64_t step_count() const override { return step_; }
  // {"step", per parameter "state1.<name>", "state2.<name>" (u8 codes, flat) + "absmax1.<name>",
  //  "absmax2.<name>" (f32 per block), or "state1"/"state2" as f32 tensors for 32-bit state; AdEMAMix's slow
  //  EMA as "state3.<name>" (+ "absmax3.<name>")}
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
    Tensor state1, state2, state3;     // u8 codes [numel] or f32 [shape]; state3: AdEMAMix's m2
    Tensor absmax1, absmax2, absmax3;  // f32 [blocks] (8-bit only)
  };
  // AdEMAMix's hyper-parameters (Python floats in bitsandbytes: its schedules run in double).
  struct Ademamix {
    double beta1, beta2, beta3, alpha, eps;
    int64_t t_alpha, t_beta3;
  };
  static Ademamix parse_ademamix(detail::OptimArgs& args, const OptimizerOptions& opts);
  backend::Adam8bitConsts adamw_consts(float wd) const;
  backend::Adam8bitConsts ademamix_consts(float wd) const;
  std::vector<Slot> slots_;
  std::optional<Ademamix> ademamix_;
  Tensor signed_map_, unsigned_map_;  // the dynamic maps on the parameters' device
  int64_t min_8bit_size_ = 4096;
  int64_t step_ = 0;
};

}  // namespace tr::optim
