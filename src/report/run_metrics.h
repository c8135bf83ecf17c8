// A finished or running training run's curves, read back from its output_dir/metrics.jsonl: every numeric
// field of every line as a series against the line's step.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tr::report {

struct RunMetrics {
  std::string name;  // the run folder's name (the legend's label)
  std::string file;  // the metrics.jsonl read
  // metric -> (step, value) in file order; "step" itself is not a metric.
  std::map<std::string, std::vector<std::pair<double, double>>> series;
};

// Reads RUN_DIR/metrics.jsonl (or a metrics.jsonl path). Throws naming the file (and line) when the folder
// has no metrics file, a line is not a JSON object with an integer "step", or no line holds a number.
RunMetrics read_run_metrics(const std::string& run_dir);

}  // namespace tr::report
