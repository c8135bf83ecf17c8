// LOMO and AdaLomo: the options HF's Trainer gives lomo_optim's classes; their updates are SGD's and
// Adafactor's code (see lomo.h).
#include "optim/lomo.h"

#include <fmt/format.h>

#include "optim/common.h"

namespace tr::optim {

namespace {

OptimizerOptions lomo_options(OptimizerOptions o) {
  detail::OptimArgs("lomo", o.args).check_all_used();  // HF passes none of them
  o.weight_decay = 0;
  return o;
}

}  // namespace

Lomo::Lomo(const nn::ParamList& params, OptimizerOptions opts) : SGD(params, lomo_options(std::move(opts))) {}

AdaLomo::AdaLomo(const nn::ParamList& params, OptimizerOptions opts)
    : Adafactor(params, std::move(opts), LomoForm{"adalomo"}) {}

std::string lomo_unused_flags_note(const std::string& name, const OptimizerOptions& opts) {
  if ((name != "lomo" && name != "adalomo") || opts.weight_decay == 0) return "";
  return fmt::format(
      "--optim {}: HF builds lomo_optim's {} with the learning rate alone, so --weight_decay {} is not used",
      name, name == "lomo" ? "Lomo" : "AdaLomo", opts.weight_decay);
}

}  // namespace tr::optim
