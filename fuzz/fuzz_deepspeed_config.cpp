// libFuzzer target: --deepspeed's JSON file (a DeepSpeed config). read_deepspeed_config and
// apply_deepspeed_config throw tr::Error naming the file and key, or give arguments that validate; the
// config's schedule gives finite rates >= 0 and its fp16 scaler a finite positive scale (DeepSpeed's own: a
// start below min_loss_scale is allowed, its first halving lands on the minimum; or the "already at minimum"
// error). The input's length picks --fp16, the world size and the run's warmup.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "fuzz_util.h"
#include "train/deepspeed_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tr::fuzz::write_scratch("ds_config.json", data, size);
  try {
    tr::train::TrainingArguments a;
    a.output_dir = "out";
    a.model_type = "gpt2";
    a.train_file = "train.txt";
    a.deepspeed = path;
    a.fp16 = size % 2 != 0;  // the flags the config is checked against vary with the input's length
    a.learning_rate = 1e-3;
    const tr::train::TrainingArguments r =
        tr::train::apply_deepspeed_config(a, 1 + static_cast<int>(size / 2 % 4));
    r.validate();
    const tr::train::DeepSpeedConfig c = tr::train::read_deepspeed_config(path);
    const int64_t warmup = static_cast<int64_t>(size % 7), total = 20;
    if (c.schedule) {
      tr::train::check_deepspeed_steps(c, warmup, total);
      const tr::train::LrSchedule s(*c.schedule, r.learning_rate);
      for (int64_t step = 0; step <= total; ++step) {
        const double lr = s.at(step, warmup, total);
        if (!std::isfinite(lr) || lr < 0) std::abort();
      }
    }
    if (c.initial_scale) {
      tr::train::GradScaler g;
      g.scale = *c.initial_scale;
      g.deepspeed = c.scaling;
      for (size_t i = 0; i < 64; ++i) {
        g.update(i < size && (data[i] & 2) != 0);
        if (!std::isfinite(g.scale) || !(g.scale > 0)) std::abort();
      }
    }
  } catch (const tr::Error&) {
  }
  return 0;
}
