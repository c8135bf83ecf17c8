// libFuzzer target: --lr_scheduler_type with --lr_scheduler_kwargs, and reduce_lr_on_plateau's state from a
// checkpoint's scheduler.json. The input is "<type index byte><kwargs>\n<plateau state JSON>". Each is refused
// with tr::Error, or gives finite rates >= 0 at every step (warmup and total from the input too), and a
// plateau state whose rate stays finite, >= 0 and never rises through evaluations.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "train/lr_schedule.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tr::train;
  if (size < 1) return 0;
  const auto& names = scheduler_names();
  const std::string type = names[data[0] % names.size()];
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nl = rest.find('\n');
  const std::string kwargs = rest.substr(0, nl), state = nl == std::string::npos ? "" : rest.substr(nl + 1);
  try {
    LrSchedule s(type, kwargs, 1e-3);
    const int64_t total = 1 + static_cast<int64_t>(data[0]) * 7, warmup = static_cast<int64_t>(size % 64);
    for (int64_t step = 0; step <= total + 1; step += 1 + total / 16) {
      const double lr = s.at(step, warmup, total);
      if (!std::isfinite(lr) || lr < 0) __builtin_trap();
    }
    if (s.kind() != LrScheduleKind::reduce_lr_on_plateau || state.empty()) return 0;
    const nlohmann::json j = nlohmann::json::parse(state, nullptr, false);
    if (j.is_discarded()) return 0;
    PlateauState& p = s.plateau();
    p.read_json(j, "scheduler.json");
    for (size_t i = 0; i < 32; ++i) {
      const double before = p.lr;
      p.step(i % 3 == 0 ? 1.0 / static_cast<double>(i + 1) : 2.0);  // improvements and stalls
      if (!std::isfinite(p.lr) || p.lr < 0 || p.lr > before) __builtin_trap();
    }
    p.to_json().dump();
  } catch (const tr::Error&) {
  }
  return 0;
}
