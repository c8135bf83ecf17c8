// libFuzzer target: a checkpoint's optimizer.safetensors, loaded into each optimizer over two small
// parameters; a load throws tr::Error or succeeds, and an accepted state must take a step and save again.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "core/error.h"
#include "fuzz_tensors.h"
#include "fuzz_util.h"
#include "io/safetensors.h"
#include "ops/ops.h"
#include "optim/optimizer.h"

namespace {

struct Case {
  const char* optim;
  std::map<std::string, std::string> args;
};

// min_8bit_size 64: the 8-bit state (uint8 moments + absmax) on a tensor small enough for a short input.
const std::vector<Case> kCases = {{"adamw_torch", {}},
                                  {"sgd", {{"momentum", "0.9"}}},
                                  {"adafactor", {{"beta1", "0.9"}}},
                                  {"adamw_8bit", {{"min_8bit_size", "64"}}},
                                  {"adagrad", {}},
                                  {"rmsprop", {{"momentum", "0.9"}}},
                                  {"lion_32bit", {}},
                                  {"ademamix_8bit", {{"min_8bit_size", "64"}}},
                                  {"schedule_free_adamw", {}},
                                  {"schedule_free_sgd", {}},
                                  {"stable_adamw", {}},
                                  {"galore_adamw", {{"rank", "4"}, {"update_proj_gap", "2"}}},
                                  {"galore_adafactor", {{"rank", "4"}, {"proj_type", "full"}}},
                                  {"apollo_adamw", {{"rank", "4"}, {"update_proj_gap", "2"}}},
                                  {"adalomo", {}},
                                  {"grokadamw", {}}};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tr;
  std::map<std::string, Tensor> state;
  try {
    auto f = io::SafetensorsFile::open(fuzz::write_scratch("optimizer.safetensors", data, size));
    for (const auto& t : f.header().tensors) state[t.name] = f.load(t.name);
  } catch (const Error&) {
    return 0;
  }
  for (const auto& c : kCases) {
    // Fresh parameters each time: the run does not depend on earlier inputs.
    Tensor w = fuzz::ramp({8, 16}, 0.1f), b = fuzz::ramp({16}, 0.01f);
    nn::ParamList params{{"h.0.mlp.c_fc.weight", &w}, {"h.0.mlp.c_fc.bias", &b}};
    optim::OptimizerOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.01;
    o.args = c.args;
    o.target_modules = "all-linear";  // GaLore's and APOLLO's: the weight projected
    o.linear_weights = {"h.0.mlp.c_fc.weight"};
    auto opt = optim::make_optimizer(c.optim, params, o);
    try {
      opt->load_state_dict(state);
    } catch (const Error&) {
      continue;
    }
    opt->set_train_mode(true, {});  // a schedule-free state saved in eval mode moves back to y first
    autograd::set_grad(w, fuzz::ramp({8, 16}, 0.5f));
    autograd::set_grad(b, fuzz::ramp({16}, 0.5f));
    opt->step();
    io::save_safetensors((fuzz::scratch_dir() / "saved.safetensors").string(), opt->state_dict());
  }
  return 0;
}
