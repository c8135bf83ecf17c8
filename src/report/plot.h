// Training curves as a picture (cairo, PNG or SVG): one panel per metric against the step, several runs
// overlaid in one colour each, a shared legend of run names, ticks and grid; evaluation points marked.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "report/run_metrics.h"

namespace tr::report {

struct PlotOptions {
  // Panels, in order; empty: those of default_plot_metrics() that some run logged.
  std::vector<std::string> metrics;
  bool log_scale_loss = false;  // loss-like panels (name ends in "loss") on a log axis
  int panel_width = 560, panel_height = 340;
};

// loss, eval_loss, learning_rate, grad_norm, tokens_per_second.
const std::vector<std::string>& default_plot_metrics();

// Run i's colour (RGB in [0, 1], Tableau's ten, then repeating).
std::array<double, 3> run_colour(size_t i);

// Draws the runs into `output` (.png or .svg by its extension). Throws naming the metric (with the ones
// the runs have) when a requested metric is logged by no run, and naming the file when it cannot be written.
void plot_runs(const std::vector<RunMetrics>& runs, const PlotOptions& options, const std::string& output);

}  // namespace tr::report
