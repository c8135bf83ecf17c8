// metrics.jsonl read back as series (see run_metrics.h).
#include "report/run_metrics.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tr::report {

namespace fs = std::filesystem;

RunMetrics read_run_metrics(const std::string& run_dir) {
  const fs::path given(run_dir);
  std::error_code ec;
  const bool is_dir = fs::is_directory(given, ec);
  const fs::path file = is_dir ? given / "metrics.jsonl" : given;
  TR_CHECK(fs::exists(file, ec), "{}: no metrics.jsonl here (expected a trainer output_dir, or the file)",
           is_dir ? run_dir : file.string());
  RunMetrics r;
  r.file = file.string();
  const fs::path folder = is_dir ? given : file.parent_path();
  r.name = fs::weakly_canonical(folder, ec).filename().string();
  if (r.name.empty()) r.name = folder.string();
  std::ifstream in(file);
  TR_CHECK(in.good(), "{}: cannot open for reading", r.file);
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    TR_CHECK(j.is_object(), "{}:{}: not a JSON object (a metrics.jsonl line is one)", r.file, line_no);
    const auto step = j.find("step");
    TR_CHECK(step != j.end() && step->is_number_integer(), "{}:{}: field 'step': expected an integer", r.file,
             line_no);
    const double x = static_cast<double>(step->get<int64_t>());
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "step" && it.value().is_number())
        r.series[it.key()].emplace_back(x, it.value().get<double>());
  }
  TR_CHECK(!r.series.empty(), "{}: no metrics logged yet (no line with a number)", r.file);
  return r;
}

}  // namespace tr::report
