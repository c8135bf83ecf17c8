// HF's TensorBoardCallback without Python: logging_dir's default name, rewrite_logs' tags (train/..,
// eval/..), one scalar per number of a log entry at the entry's step, the run's arguments as text.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/tfevents.h"

namespace tr::report {

// HF's default logging_dir: output_dir/runs/<%b%d_%H-%M-%S>_<hostname> (local time).
std::string default_logging_dir(const std::string& output_dir);

// HF's rewrite_logs: eval_x -> eval/x, test_x -> test/x, anything else -> train/x; only numbers are kept
// (HF warns about and drops the rest) and "step" is the event's step, not a scalar.
std::vector<std::pair<std::string, double>> rewrite_logs(const nlohmann::json& entry);

class TensorBoardLog {
 public:
  // A new event file in `logdir`. A resumed run (resumed_step >= 0) first writes a SessionLog START at
  // resumed_step + 1, so TensorBoard forgets what an earlier file logged after the checkpoint.
  TensorBoardLog(const std::string& logdir, int64_t resumed_step);
  // One metrics.jsonl entry (with its "step"): its scalars, flushed.
  void log(const nlohmann::json& entry);
  // A text summary at step 0 (HF writes the arguments and the model config this way), flushed.
  void text(const std::string& tag, const std::string& text);
  const std::string& path() const { return writer_.path(); }

 private:
  EventFileWriter writer_;
};

}  // namespace tr::report
