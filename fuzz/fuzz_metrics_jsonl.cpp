// libFuzzer target: metrics.jsonl as `trainer plot` reads it. Rejected with tr::Error, or read and drawn
// (SVG and PNG, every metric on linear and log axes) without a crash, a hang or a sanitizer report.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "fuzz_util.h"
#include "report/plot.h"
#include "report/run_metrics.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tr;
  try {
    fuzz::write_scratch("metrics.jsonl", data, size);
    const auto run = report::read_run_metrics(fuzz::scratch_dir().string());
    report::PlotOptions o;
    for (const auto& [name, points] : run.series) o.metrics.push_back(name);
    o.panel_width = 200;  // small pictures: the drawing code is what is fuzzed, not the pixel count
    o.panel_height = 120;
    report::plot_runs({run}, o, (fuzz::scratch_dir() / "curves.svg").string());
    o.log_scale_loss = true;
    report::plot_runs({run, run}, o, (fuzz::scratch_dir() / "curves.png").string());
  } catch (const tr::Error&) {
  }
  return 0;
}
