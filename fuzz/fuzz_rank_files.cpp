// libFuzzer target: a sharded run's per-rank optimizer files (optimizer.rank-0/1.safetensors: their world
// size, rank and slice places in the metadata), reassembled by load_optimizer_state for sharded optimizers of
// 2 and 3 ranks and for a whole one; a load throws tr::Error or succeeds, and an accepted whole state takes a
// step. Input: two little-endian bytes give file 0's length, file 0, then file 1.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "autograd/node.h"
#include "core/error.h"
#include "dist/process_group.h"
#include "fuzz_tensors.h"
#include "fuzz_util.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "train/zero.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tr;
  if (size < 2) return 0;
  const size_t first =
      std::min<size_t>(size - 2, static_cast<size_t>(data[0]) | (static_cast<size_t>(data[1]) << 8));
  const std::filesystem::path dir = fuzz::scratch_dir() / "checkpoint";
  std::filesystem::create_directories(dir);
  fuzz::write_scratch("checkpoint/optimizer.rank-0.safetensors", data + 2, first);
  fuzz::write_scratch("checkpoint/optimizer.rank-1.safetensors", data + 2 + first, size - 2 - first);
  optim::OptimizerOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  for (int world : {2, 3}) {
    Tensor w = fuzz::ramp({8, 16}, 0.1f), b = fuzz::ramp({16}, 0.01f);
    nn::ParamList params{{"h.0.mlp.c_fc.weight", &w}, {"h.0.mlp.c_fc.bias", &b}};
    const auto group = dist::dry_run_group(world);  // rank 0 of `world`: no collective runs here
    train::ShardedOptimizer z(*group, params, "adamw_torch", o, 1 << 20);
    try {
      z.load_state_dict(train::load_optimizer_state(dir.string(), z, params));
    } catch (const Error&) {
    }
  }
  Tensor w = fuzz::ramp({8, 16}, 0.1f), b = fuzz::ramp({16}, 0.01f);
  nn::ParamList params{{"h.0.mlp.c_fc.weight", &w}, {"h.0.mlp.c_fc.bias", &b}};
  auto opt = optim::make_optimizer("adamw_torch", params, o);
  try {
    opt->load_state_dict(train::load_optimizer_state(dir.string(), *opt, params));
  } catch (const Error&) {
    return 0;
  }
  autograd::set_grad(w, fuzz::ramp({8, 16}, 0.5f));
  autograd::set_grad(b, fuzz::ramp({16}, 0.5f));
  opt->step();
  return 0;
}
