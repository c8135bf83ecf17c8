// What a run shows while it trains: output_dir/metrics.jsonl (one JSON object per logging step or
// evaluation, HF's log_history entries) and the progress line on stderr (bar, loss, lr, grad norm,
// tokens/s, ETA), with HF's logging_nan_inf_filter over the window between two logs.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace tr::train {

class MetricsLog {
 public:
  // A fresh run truncates the file; a resumed one keeps the lines up to `resumed_step` and appends (lines of
  // the steps after the checkpoint are dropped: they run again).
  MetricsLog(const std::string& output_dir, bool resuming, int64_t resumed_step);
  // Appends one line, flushed; a failed write throws naming the file.
  void write(const nlohmann::json& entry);

 private:
  std::string path_;
  std::ofstream out_;
};

// The loss window between two logging steps and the progress line.
class StepWindow {
 public:
  // `show`: print the progress line (rank 0 of a distributed run; the others keep only the numbers).
  // `filter`: HF's logging_nan_inf_filter. `bar` false (HF's disable_tqdm): each log a line of its own.
  StepWindow(int64_t start_step, int64_t total_steps, bool show = true, bool filter = true, bool bar = true)
      : start_(start_step), total_(total_steps), show_(show), filter_(filter), bar_(bar) {}
  // A finished step's loss. Filtered, a non-finite one counts as the mean of the window so far (0 in an
  // empty window), and add() returns true; unfiltered it counts as it is (the window's mean is then nan).
  bool add(double loss);
  // Prints the progress line for `step` (1-based; `seconds` of training since the start step, `tps` tokens
  // per second) and returns the window's mean loss; the next window starts empty.
  double flush(int64_t step, double lr, double grad_norm, double seconds, double tps);
  // Every loss counted since the start step (HF's train_loss is their mean).
  double counted_sum() const { return all_; }

 private:
  int64_t start_, total_;
  bool show_, filter_, bar_;
  double window_ = 0, all_ = 0;
  int64_t window_n_ = 0;
};

}  // namespace tr::train
