// metrics.jsonl and the progress line; see metrics_log.h.
#include "train/metrics_log.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_writer.h"
#include "train/checkpoint.h"

namespace tr::train {

namespace fs = std::filesystem;

MetricsLog::MetricsLog(const std::string& output_dir, bool resuming, int64_t resumed_step)
    : path_((fs::path(output_dir) / "metrics.jsonl").string()) {
  if (resuming && fs::exists(path_)) {  // drop lines logged after the checkpoint (they rerun)
    std::ifstream in(path_);
    std::string kept;
    for (std::string line; std::getline(in, line);)
      if (metrics_line_kept(line, resumed_step)) kept += line + "\n";
    in.close();
    write_file(path_, kept);
  }
  out_.open(path_, resuming ? std::ios::app : std::ios::trunc);
  TR_CHECK(out_.is_open(), "{}: cannot open for writing: {}", path_, std::strerror(errno));
}

void MetricsLog::write(const nlohmann::json& entry) {
  out_ << entry.dump() << "\n";
  out_.flush();
  TR_CHECK(out_.good(), "{}: write failed: {}", path_, std::strerror(errno));
}

bool StepWindow::add(double loss) {
  const bool replaced = filter_ && !std::isfinite(loss);
  const double counted = !replaced ? loss : window_n_ > 0 ? window_ / window_n_ : 0.0;
  window_ += counted;
  all_ += counted;
  ++window_n_;
  return replaced;
}

double StepWindow::flush(int64_t step, double lr, double grad_norm, double seconds, double tps) {
  const double mean = window_n_ > 0 ? window_ / window_n_ : 0.0;
  const double eta = step > start_ ? seconds / (step - start_) * (total_ - step) : 0.0;
  const int width = 24, fill = static_cast<int>(width * step / std::max<int64_t>(1, total_));
  if (show_ && !bar_)
    std::fprintf(stderr, "step %lld/%lld  loss %.4f  lr %.3g  grad_norm %.3f  %.0f tok/s  ETA %s\n",
                 static_cast<long long>(step), static_cast<long long>(total_), mean, lr, grad_norm, tps,
                 (eta >= 120 ? fmt::format("{:.1f} min", eta / 60) : fmt::format("{:.0f} s", eta)).c_str());
  else if (show_)
    std::fprintf(stderr, "\r[%s%s] step %lld/%lld  loss %.4f  lr %.3g  grad_norm %.3f  %.0f tok/s  ETA %s   ",
                 std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(),
                 static_cast<long long>(step), static_cast<long long>(total_), mean, lr, grad_norm, tps,
                 (eta >= 120 ? fmt::format("{:.1f} min", eta / 60) : fmt::format("{:.0f} s", eta)).c_str());
  window_ = 0;
  window_n_ = 0;
  return mean;
}

}  // namespace tr::train
