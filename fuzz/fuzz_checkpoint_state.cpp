// libFuzzer target: a checkpoint's JSON state files (trainer_state, scheduler, rng_state, scaler) as
// train::load_checkpoint_state reads them; the input takes each file's place in turn, the others valid.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"
#include "optim/optimizer.h"
#include "train/checkpoint.h"
#include "train/mixed_precision.h"

namespace {

struct StateFile {
  const char* name;
  const char* valid;  // as save_checkpoint writes it
};

constexpr StateFile kStateFiles[] = {
    {"trainer_state.json",
     R"({"global_step": 12, "epoch": 1.0, "data_position": {"epoch": 1, "batch": 3}, "skipped_steps": 1,
         "train_batch_size": 8, "gradient_accumulation_steps": 2, "train_tokens": 4096, "best_metric": 2.5,
         "best_model_checkpoint": "out/checkpoint-10", "log_history": [{"step": 10, "loss": 3.25}]})"},
    {"scheduler.json", R"({"last_epoch": 11, "_last_lr": [0.0001]})"},
    {"rng_state.json", R"({"dropout": {"seed": 42, "offset": 123456}})"},
    {"scaler.json",
     R"({"scale": 32768.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
         "_growth_tracker": 7})"},
};

// One checkpoint folder per state file, that file's place left for the input: the other files exist (their
// contents are read elsewhere), the other state files are valid, and the optimizer state is an empty SGD's.
// The loss-scaling MixedPrecision makes load_checkpoint_state read scaler.json too.
struct Fixture {
  std::vector<std::string> dirs;
  std::unique_ptr<tr::optim::Optimizer> opt = tr::optim::make_optimizer("sgd", {}, {});
  tr::train::MixedPrecision mp{{}, tr::DType::f16, /*loss_scaling=*/true};

  Fixture() {
    for (size_t k = 0; k < std::size(kStateFiles); ++k) {
      const std::string dir = "checkpoint-" + std::to_string(k);
      std::filesystem::create_directories(tr::fuzz::scratch_dir() / dir);
      dirs.push_back((tr::fuzz::scratch_dir() / dir).string());
      tr::io::save_safetensors(dirs.back() + "/optimizer.safetensors", opt->state_dict());
      for (const char* f : {"config.json", "training_args.json", "tokenizer.json"})
        tr::fuzz::write_scratch(dir + "/" + f, "{}");
      for (const auto& s : kStateFiles) tr::fuzz::write_scratch(dir + "/" + s.name, s.valid);
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture fx;
  for (size_t k = 0; k < std::size(kStateFiles); ++k) {
    tr::fuzz::write_scratch("checkpoint-" + std::to_string(k) + "/" + kStateFiles[k].name, data, size);
    try {
      tr::train::load_checkpoint_state(fx.dirs[k], *fx.opt, fx.mp);
    } catch (const tr::Error&) {
    }
  }
  return 0;
}
