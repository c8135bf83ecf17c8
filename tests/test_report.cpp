// Watching runs (issue 14): CRC-32C, the event file's exact bytes, HF's tag and folder names, metrics.jsonl
// read back, the curves as pixels, the summary table. tests/tensorboard_runs.sh reads real runs' files with
// an independent (Python) reader.
#include <cairo.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include "core/error.h"
#include "core/file_writer.h"
#include "report/crc32c.h"
#include "report/plot.h"
#include "report/run_metrics.h"
#include "report/summary.h"
#include "report/tensorboard.h"
#include "report/tfevents.h"
#include "train/args.h"

namespace fs = std::filesystem;
using namespace tr;

namespace {

// Bit-by-bit CRC-32C (reflected 0x82F63B78): the definition, to check the SSE4.2 path against.
uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
  }
  return ~c;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("trainer_report_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The records of an event file, CRCs checked.
std::vector<std::string> records_of(const std::string& raw) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < raw.size()) {
    uint64_t len;
    uint32_t len_crc, data_crc;
    if (pos + 12 > raw.size()) {
      ADD_FAILURE() << "a record header runs past the end at " << pos;
      break;
    }
    std::memcpy(&len, raw.data() + pos, 8);
    if (len > raw.size() - pos - 16) {
      ADD_FAILURE() << "a record of " << len << " bytes runs past the end at " << pos;
      break;
    }
    std::memcpy(&len_crc, raw.data() + pos + 8, 4);
    EXPECT_EQ(len_crc, report::masked_crc32c(raw.data() + pos, 8));
    std::string data = raw.substr(pos + 12, len);
    std::memcpy(&data_crc, raw.data() + pos + 12 + len, 4);
    EXPECT_EQ(data_crc, report::masked_crc32c(data.data(), data.size()));
    out.push_back(data);
    pos += 12 + len + 4;
  }
  EXPECT_EQ(pos, raw.size());
  return out;
}

}  // namespace

TEST(Report, Crc32cMatchesItsDefinitionAndKnownValues) {
  EXPECT_EQ(report::crc32c("123456789", 9), 0xe3069283u);  // the standard check value
  const std::string zeros(32, '\0');
  EXPECT_EQ(report::crc32c(zeros.data(), zeros.size()), 0x8a9136aau);  // RFC 3720 B.4
  std::mt19937 rng(7);
  for (size_t n = 0; n < 200; ++n) {
    std::vector<unsigned char> b(n);
    for (auto& x : b) x = static_cast<unsigned char>(rng());
    ASSERT_EQ(report::crc32c(b.data(), n), crc32c_bitwise(b.data(), n)) << n;
  }
}

TEST(Report, EventFileHoldsExactlyTheEncodedRecords) {
  const fs::path d = fresh_dir("events");
  std::string path;
  {
    report::EventFileWriter w(d.string());
    path = w.path();
    w.add_scalar("a", 1.0, 3, 0.5);
    w.add_session_start(7, 0.5);
    EXPECT_EQ(records_of(read_bytes(path)).size(), 1u) << "records reach the file only at flush()";
    w.flush();
  }
  EXPECT_TRUE(std::regex_match(fs::path(path).filename().string(),
                               std::regex(R"(events\.out\.tfevents\.\d{10}\..+\.\d+\.0)")));
  const auto recs = records_of(read_bytes(path));
  ASSERT_EQ(recs.size(), 3u);
  // file_version: wall_time (field 1, fixed64), file_version (field 3) = "brain.Event:2".
  EXPECT_EQ(recs[0][0], '\x09');
  EXPECT_EQ(recs[0].substr(9), std::string("\x1a\x0d") + "brain.Event:2");
  // Event{wall_time 0.5, step 3, summary{value{tag "a", simple_value 1.0f}}}, byte for byte.
  const std::string half("\x09\x00\x00\x00\x00\x00\x00\xe0\x3f", 9);
  EXPECT_EQ(recs[1], half + std::string("\x10\x03\x2a\x0a\x0a\x08\x0a\x01"
                                        "a"
                                        "\x15\x00\x00\x80\x3f",
                                        14));
  // Event{wall_time 0.5, step 7, session_log{status START}}.
  EXPECT_EQ(recs[2], half + std::string("\x10\x07\x3a\x02\x08\x01", 6));
  // A second writer in the same second takes the next suffix instead of truncating the first file.
  report::EventFileWriter second(d.string());
  EXPECT_NE(second.path(), path);
  EXPECT_EQ(records_of(read_bytes(path)).size(), 3u);
}

TEST(Report, TagsAndFolderFollowHuggingFace) {
  const auto tags = report::rewrite_logs(
      {{"step", 10}, {"loss", 2.5}, {"eval_loss", 3.0}, {"test_x", 1}, {"epoch", 0.5}, {"note", "text"}});
  std::map<std::string, double> m(tags.begin(), tags.end());
  EXPECT_EQ(m, (std::map<std::string, double>{
                   {"train/loss", 2.5}, {"eval/loss", 3.0}, {"test/x", 1}, {"train/epoch", 0.5}}));
  const std::string dir = report::default_logging_dir("out");
  EXPECT_TRUE(std::regex_match(dir, std::regex(R"(out/runs/[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_.+)")))
      << dir;
}

TEST(Report, ReportToAcceptsHfNamesAndListsAndRefusesTheRest) {
  train::TrainingArguments a;
  EXPECT_FALSE(a.reports_tensorboard()) << "HF's default is none";
  for (const char* ok : {"tensorboard", "all", "jsonl, tensorboard"}) {
    a.report_to = ok;
    EXPECT_TRUE(a.reports_tensorboard()) << ok;
  }
  a.update_from_json({{"report_to", {"tensorboard"}}}, "args.json");  // HF's training_args.json form
  EXPECT_EQ(a.report_to, "tensorboard");
  auto message = [](const std::string& v) {
    train::TrainingArguments b;
    b.report_to = v;
    try {
      b.reports_tensorboard();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("wandb").find("Python library"), std::string::npos);
  EXPECT_NE(message("tensorbord").find("did you mean"), std::string::npos) << message("tensorbord");
  EXPECT_NE(message("none,tensorboard").find("cannot be combined"), std::string::npos);
}

TEST(Report, MetricsFileReadBackWithClearErrors) {
  const fs::path d = fresh_dir("metrics");
  write_file(
      (d / "metrics.jsonl").string(),
      "{\"step\": 2, \"loss\": 3.5, \"learning_rate\": 0.001}\n\n{\"step\": 4, \"eval_loss\": 3.25}\n");
  const auto r = report::read_run_metrics(d.string());
  EXPECT_EQ(r.name, d.filename().string());
  EXPECT_EQ(r.series.at("loss"), (std::vector<std::pair<double, double>>{{2, 3.5}}));
  EXPECT_EQ(r.series.at("eval_loss"), (std::vector<std::pair<double, double>>{{4, 3.25}}));
  EXPECT_EQ(r.series.count("step"), 0u);
  auto error_of = [&](const std::string& content) {
    write_file((d / "metrics.jsonl").string(), content);
    try {
      report::read_run_metrics(d.string());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("{\"step\": 1}\n[1,2\n").find("metrics.jsonl:2: not a JSON object"), std::string::npos);
  EXPECT_NE(error_of("{\"loss\": 1}\n").find("metrics.jsonl:1: field 'step': expected an integer"),
            std::string::npos);
  EXPECT_NE(error_of("").find("no metrics logged yet"), std::string::npos);
  EXPECT_THROW(report::read_run_metrics((d / "nowhere").string()), Error);
}

TEST(Report, CurvesAreDrawnInEachRunsColour) {
  const fs::path d = fresh_dir("plot");
  std::vector<report::RunMetrics> runs(2);
  for (int i = 0; i < 2; ++i) {
    runs[i].name = "run" + std::to_string(i);
    for (int s = 1; s <= 50; ++s) {
      runs[i].series["loss"].emplace_back(s, 5.0 / (s + i * 3));
      runs[i].series["learning_rate"].emplace_back(s, 1e-3 * (50 - s) / 50);
    }
  }
  runs[0].series["eval_loss"] = {{10, 4.0}, {20, 3.0}, {30, 2.5}};
  runs[1].series["loss"].emplace_back(51, std::nan(""));  // not drawn, and no error
  report::PlotOptions o;
  o.log_scale_loss = true;
  const std::string png = (d / "curves.png").string();
  report::plot_runs(runs, o, png);
  cairo_surface_t* s = cairo_image_surface_create_from_png(png.c_str());
  ASSERT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS);
  // Three panels (loss, eval_loss, learning_rate) in two columns: two rows under the legend.
  EXPECT_EQ(cairo_image_surface_get_width(s), 2 * o.panel_width);
  EXPECT_EQ(cairo_image_surface_get_height(s), 36 + 2 * o.panel_height);
  auto pixels_of = [&](size_t run, int x0, int x1, int y0, int y1) {
    const auto c = report::run_colour(run);
    const uint32_t want = (static_cast<uint32_t>(std::lround(c[0] * 255)) << 16) |
                          (static_cast<uint32_t>(std::lround(c[1] * 255)) << 8) |
                          static_cast<uint32_t>(std::lround(c[2] * 255));
    const unsigned char* data = cairo_image_surface_get_data(s);
    const int stride = cairo_image_surface_get_stride(s);
    int n = 0;
    for (int y = y0; y < y1; ++y)
      for (int x = x0; x < x1; ++x) {
        uint32_t px;
        std::memcpy(&px, data + y * stride + x * 4, 4);
        n += (px & 0xffffffu) == want;
      }
    return n;
  };
  const int w = o.panel_width, top = 36, h = o.panel_height;
  EXPECT_GT(pixels_of(0, 0, w, top, top + h), 100) << "run 0's loss curve";
  EXPECT_GT(pixels_of(1, 0, w, top, top + h), 100) << "run 1's loss curve";
  EXPECT_GT(pixels_of(0, w, 2 * w, top, top + h), 100) << "run 0's eval_loss curve and points";
  EXPECT_LT(pixels_of(1, w, 2 * w, top, top + h), 5) << "run 1 has no eval_loss";
  EXPECT_GT(pixels_of(1, 0, w, top + h, top + 2 * h), 100) << "run 1's learning_rate curve";
  EXPECT_GT(pixels_of(1, 0, 2 * w, 0, top), 50) << "run 1's legend swatch";
  cairo_surface_destroy(s);
  // Bad requests name what is wrong.
  o.metrics = {"loss", "perplexity"};
  try {
    report::plot_runs(runs, o, png);
    FAIL() << "an unknown metric was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metric 'perplexity' is in no run's metrics.jsonl; logged metrics: "
                                         "eval_loss, learning_rate, loss"),
              std::string::npos)
        << e.what();
  }
  o.metrics.clear();
  EXPECT_THROW(report::plot_runs(runs, o, (d / "curves.jpg").string()), Error);
  // Values a few ULPs apart and steps near 2^53 are drawn (once a tick loop that never advanced).
  report::RunMetrics flat;
  flat.name = "flat";
  flat.series["loss"] = {{1, 1.0}, {2, std::nextafter(1.0, 2.0)}};
  flat.series["grad_norm"] = {{9007199254740992.0, 3.0}, {9007199254740992.0, 3.0}};
  for (bool log : {false, true}) {
    o.log_scale_loss = log;
    EXPECT_NO_THROW(report::plot_runs({flat}, o, (d / "flat.svg").string()));
  }
}

TEST(Report, SummaryGivesMfuWhereThePeakIsKnown) {
  report::RunSummary s;
  s.steps = s.global_step = 100;
  s.tokens = 409600;
  s.seconds = 10;
  s.tokens_per_second = 40960;
  s.flops_per_token = 6 * 124e6;
  s.device = "NVIDIA H200";
  s.compute = DType::bf16;
  s.output_dir = "out";
  s.has_eval = true;
  s.eval_loss = 3;
  s.unigram_baseline = 7;
  const std::string t = report::summary_table(s);
  // 40960 tokens/s x 744 MFLOP = 30.5 TFLOP/s of 989.4: 3.1%.
  EXPECT_NE(t.find("MFU          3.1% of NVIDIA H200's 989 TFLOP/s (bf16)"), std::string::npos) << t;
  EXPECT_NE(t.find("3.0000 vs the unigram baseline 7.0000"), std::string::npos) << t;
  EXPECT_DOUBLE_EQ(report::peak_flops("NVIDIA H100 PCIe", DType::f32, true), 378e12);
  EXPECT_DOUBLE_EQ(report::peak_flops("NVIDIA A100-SXM4-80GB", DType::f32, false), 19.5e12);
  // HBM bandwidth, for the kernel benchmark's share of peak.
  EXPECT_DOUBLE_EQ(report::peak_memory_bandwidth("NVIDIA H200"), 4.8e12);
  EXPECT_DOUBLE_EQ(report::peak_memory_bandwidth("NVIDIA H100 80GB HBM3"), 3.35e12);
  EXPECT_DOUBLE_EQ(report::peak_memory_bandwidth("NVIDIA H100 PCIe"), 2.0e12);
  EXPECT_DOUBLE_EQ(report::peak_memory_bandwidth("NVIDIA A100-SXM4-80GB"), 2.039e12);
  EXPECT_DOUBLE_EQ(report::peak_memory_bandwidth("NVIDIA A100-SXM4-40GB"), 1.555e12);
  EXPECT_DOUBLE_EQ(report::peak_memory_bandwidth("NVIDIA L4"), 0.3e12);
  EXPECT_DOUBLE_EQ(report::peak_memory_bandwidth("cpu"), 0.0);
  s.device = "cpu";
  EXPECT_NE(report::summary_table(s).find("MFU          n/a: the peak FLOP/s of cpu is not known"),
            std::string::npos);
}
