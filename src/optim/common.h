// Helpers the optimizers share (not part of the public interface): typed reading of --optim_args with unknown
// keys rejected, parameter checks, and strict state-dict lookups.
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "optim/optimizer.h"

namespace tr::optim::detail {

// Reads one optimizer's --optim_args entries by key; check_all_used() throws naming any key never asked for,
// so a typo ("momentun=0.9") is an error instead of a silently ignored setting.
class OptimArgs {
 public:
  OptimArgs(std::string optimizer, const std::map<std::string, std::string>& args)
      : optimizer_(std::move(optimizer)), args_(args) {}
  double number(const std::string& key, double fallback);
  std::optional<double> optional_number(const std::string& key);
  bool flag(const std::string& key, bool fallback);
  std::string text(const std::string& key, const std::string& fallback);
  void check_all_used() const;

 private:
  const std::string* find(const std::string& key);
  std::string optimizer_;
  std::map<std::string, std::string> args_;
  std::vector<std::string> known_;
};

// The --adam_* flags given values other than HF's defaults, each as "--adam_beta2 0.95 (it uses 0.999)", for
// optimizers HF builds without them (the class's own betas and `eps_used` hold).
std::vector<std::string> unused_adam_flags(const OptimizerOptions& opts, const char* eps_used);

// Every parameter on the CPU, contiguous, with a dtype in `dtypes`; throws naming the first that is not.
// any_device: the optimizer also runs on GPUs (through the backend's kernels), and on a model split across
// devices (the ops run one pass per device); else CPU only.
void check_params(const char* optimizer, const nn::ParamList& params, const std::vector<DType>& dtypes,
                  bool any_device = false);

// The parameter's gradient made contiguous, or undefined when it has none; throws when its dtype or shape
// differs from the parameter's.
Tensor gradient(const char* optimizer, const std::string& name, const Tensor& param);

// state[key], or an error naming the optimizer and the missing key.
const Tensor& state_entry(const std::map<std::string, Tensor>& state, const std::string& key,
                          const char* optimizer);
// Copies state[key] into `dst` after checking that dtype and shape agree (an error names the key).
void load_entry(const std::map<std::string, Tensor>& state, const std::string& key, const Tensor& dst,
                const char* optimizer);
// The "step" entry as an integer.
int64_t load_step(const std::map<std::string, Tensor>& state, const char* optimizer);
Tensor step_tensor(int64_t step);

}  // namespace tr::optim::detail
