// GaLore (arXiv 2403.03507) under HF's names galore_adamw, galore_adamw_8bit and galore_adafactor, and APOLLO
// (arXiv 2412.05270, apollo_adamw) which shares its projections: the
// gradient of each targeted linear weight is projected onto its top singular vectors (refreshed by an SVD
// every update_proj_gap steps), the optimizer's state lives at that low rank, and the update is projected
// back and scaled. As galore_torch 1.0 with the arguments HF's Trainer passes. The _layerwise names update
// each parameter during backward as its gradient is final (HF: one optimizer per parameter, stepped by a
// post-accumulate-grad hook): the same arithmetic, without the model's gradients held together.
#pragma once
#include <memory>

#include "optim/optimizer.h"

namespace tr::optim {

// GaLore's projector types: std (the smaller side of the gradient), reverse_std, right, left, full (both).
enum class GaloreProjection { std_side, reverse_std, right, left, full };

class GaLore : public Optimizer {
 public:
  static bool implements(const std::string& name);
  // HF builds galore_torch's classes with the learning rate alone, so their own defaults hold: GaLoreAdamW
  // betas (0.9, 0.999), eps 1e-6, no weight decay, bias correction; GaLoreAdafactor as adafactor without
  // weight decay; GaLoreAdamW8bit bitsandbytes' AdamW8bit with betas (0.9, 0.999), eps 1e-8, weight decay
  // 0.01 on every parameter (HF's groups do not apply). --optim_args rank (128), update_proj_gap (200),
  // scale (0.25), proj_type (std). The targets: opts.target_modules matched against opts.linear_weights'
  // modules (required; an error when none matches, once there are parameters).
  GaLore(const std::string& name, const nn::ParamList& params, OptimizerOptions opts);
  // apollo_adamw (apollo_torch 1.0's APOLLOAdamW as HF builds it): each target's gradient projected by a
  // random Gaussian matrix (proj=random, drawn as torch's CPU generator draws it from apollo_torch's seeds;
  // or proj=svd, GaLore's basis), AdamW's moments kept at that rank (HF's --adam_* betas and epsilon), and
  // the full-rank gradient scaled by the ratio of the low-rank AdamW update's norm to the projected
  // gradient's - per channel (scale_type=channel: the columns of a wide weight, the rows of a tall one) or
  // per tensor - then by APOLLO's norm-growth limiter (at most 1.01x the last step's norm) and sqrt(scale).
  // The other parameters take apollo_torch's AdamW defaults (betas 0.9/0.999, eps 1e-6); no weight decay (HF
  // passes none). --optim_args rank (128), proj (random), scale_type (channel), update_proj_gap (200), scale
  // (1.0), proj_type (std, reverse_std, right, left). On a GPU the random matrices are the CPU generator's
  // too (apollo_torch would draw them from the CUDA generator there).
  int64_t step_count() const override { return low_->step_count(); }
  bool updates_in_backward() const override { return layerwise_; }
  void set_lr(double lr) override;
  // The two inner optimizers' entries (the full-rank parameters' under their names, the projected ones'
  // low-rank state under the weights' names; one "step") + "galore_ortho.<name>" per projected weight
  // (+ "galore_ortho_right.<name>" for proj_type full).
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state) override;
  int64_t state_bytes() const override;
  // The projected weights' names, in parameter order.
  std::vector<std::string> projected() const;
  // Non-default --adam_* / --weight_decay values that HF does not hand GaLore's classes ("" when none).
  static std::string unused_flags_note(const std::string& name, const OptimizerOptions& opts);

 protected:
  void step_params(size_t lo, size_t hi, bool advance) override;

 private:
  enum class Kind { adamw, adamw_8bit, adafactor, apollo };
  struct Slot {
    std::string name;
    Tensor* param;
    bool projected = false;
    bool right = false;  // std/reverse_std/right/left: which side the single basis multiplies
    Tensor buffer;       // the low-rank stand-in the inner optimizer updates from zero
    Tensor ortho, ortho_right;
    bool has_basis = false;
    // APOLLO: the seed of the next random basis, and the last step's scaled-gradient norm (its limiter's)
    uint64_t seed = 0;
    Tensor last_norm;
    bool has_norm = false;
  };
  void parse_args(const std::string& name);
  void random_basis(Slot& s);  // apollo.cpp
  void apollo_update(Slot& s, const Tensor& grad, const Tensor& low) const;
  void apply_update(Slot& s, const Tensor& grad, const Tensor& low);
  void allocate_projection(Slot& s) const;
  // `targets`: the projected weights' stand-ins (APOLLO hands them the --adam_* values)
  std::unique_ptr<Optimizer> make_inner(const nn::ParamList& params, double weight_decay, bool targets) const;
  void refresh_basis(Slot& s, const Tensor& grad);
  void project_into(const Slot& s, const Tensor& grad, const Tensor& low) const;
  void add_projected_back(const Slot& s, const Tensor& low) const;

  Kind kind_;
  bool layerwise_ = false;
  bool random_ = false, channel_ = true;  // APOLLO's proj and scale_type
  GaloreProjection proj_ = GaloreProjection::std_side;
  int64_t rank_ = 128, gap_ = 200;
  double scale_ = 0.25, weight_decay_ = 0.0;
  std::vector<Slot> slots_;
  std::vector<size_t> full_before_, low_before_;  // per parameter index: how many of each kind precede it
  std::unique_ptr<Optimizer> full_, low_;
  Tensor scratch_;  // the low-rank gradient of the weight being updated (the largest's size)
  // APOLLO: the squares of a low-rank tensor (scratch_'s size) and a gradient's f64 statistics
  Tensor square_scratch_, grad_stats_;
  Tensor apollo_channels_;              // two vectors of the longest channel count: the factors' terms
  std::vector<Tensor> apollo_scalars_;  // three 0-d f32
};

}  // namespace tr::optim
