// HF's TensorBoardCallback semantics over EventFileWriter (see tensorboard.h).
#include "report/tensorboard.h"

#include <unistd.h>

#include <ctime>
#include <filesystem>

#include "core/error.h"

namespace tr::report {

std::string default_logging_dir(const std::string& output_dir) {
  const std::time_t t = std::time(nullptr);
  std::tm local{};
  localtime_r(&t, &local);
  char stamp[64];
  std::strftime(stamp, sizeof(stamp), "%b%d_%H-%M-%S", &local);
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return (std::filesystem::path(output_dir) / "runs" / (std::string(stamp) + "_" + host)).string();
}

std::vector<std::pair<std::string, double>> rewrite_logs(const nlohmann::json& entry) {
  std::vector<std::pair<std::string, double>> out;
  for (auto it = entry.begin(); it != entry.end(); ++it) {
    const std::string& k = it.key();
    if (k == "step" || !it.value().is_number()) continue;
    std::string tag;
    if (k.starts_with("eval_"))
      tag = "eval/" + k.substr(5);
    else if (k.starts_with("test_"))
      tag = "test/" + k.substr(5);
    else
      tag = "train/" + k;
    out.emplace_back(tag, it.value().get<double>());
  }
  return out;
}

TensorBoardLog::TensorBoardLog(const std::string& logdir, int64_t resumed_step) : writer_(logdir) {
  if (resumed_step >= 0) {
    writer_.add_session_start(resumed_step + 1, wall_time_now());
    writer_.flush();
  }
}

void TensorBoardLog::log(const nlohmann::json& entry) {
  TR_CHECK(entry.contains("step") && entry["step"].is_number_integer(),
           "tensorboard: a log entry without an integer step: {}", entry.dump());
  const int64_t step = entry["step"].get<int64_t>();
  const double now = wall_time_now();
  for (const auto& [tag, value] : rewrite_logs(entry)) writer_.add_scalar(tag, value, step, now);
  writer_.flush();
}

void TensorBoardLog::text(const std::string& tag, const std::string& text) {
  writer_.add_text(tag, text, 0, wall_time_now());
  writer_.flush();
}

}  // namespace tr::report
