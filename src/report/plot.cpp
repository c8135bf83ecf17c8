// Training curves drawn with cairo (see plot.h). The picture is rendered into memory and written with
// write_file, so an unwritable output fails with the system's reason.
#include "report/plot.h"

#include <cairo-svg.h>
#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "core/file_writer.h"

namespace tr::report {

namespace {

using Points = std::vector<std::pair<double, double>>;

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return !(lo <= hi); }
};

// About `target` round steps (1, 2 or 5 x 10^k) covering [lo, hi].
std::vector<double> linear_ticks(double lo, double hi, int target) {
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  std::vector<double> t;
  // Ranges at the ends of double (denormal widths, spans that overflow) get no ticks rather than a loop; an
  // integer index bounds the loop even where adding the step no longer changes the value.
  if (!(step > 0) || !std::isfinite(step) || !std::isfinite(lo) || (hi - lo) / step > 100) return t;
  const double first = std::ceil(lo / step);
  for (int k = 0; k <= 100; ++k) {
    const double v = (first + k) * step;
    if (!(v <= hi + step * 1e-9)) break;
    t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  return t;
}

// 1, 2, 5 x 10^k inside [lo, hi] (lo > 0); every digit when that gives fewer than two; round linear steps
// when even that does (a range inside one decade, as a loss late in training).
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> t;
  if (!(lo > 0) || !(hi >= lo) || !std::isfinite(hi)) return t;
  for (const auto& mantissas :
       {std::vector<double>{1, 2, 5}, std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9}}) {
    t.clear();
    for (int k = static_cast<int>(std::floor(std::log10(lo)));
         k <= static_cast<int>(std::ceil(std::log10(hi))); ++k)
      for (double m : mantissas) {
        const double v = m * std::pow(10.0, k);
        if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
      }
    if (t.size() >= 2) return t;
  }
  t.clear();
  for (double v : linear_ticks(lo, hi, 5))
    if (v > 0) t.push_back(v);
  return t;
}

std::string tick_label(double v) {
  if (v == 0) return "0";
  const double a = std::abs(v);
  if (a >= 1e5 || a < 1e-3) return fmt::format("{:.2g}", v);
  return fmt::format("{:.4g}", v);
}

// Where a panel's plot area is and how values map into it.
struct Axes {
  double left, top, width, height;
  double x0, x1, y0, y1;  // y0/y1 are log10 values on a log axis
  bool log_y;
  double px(double x) const { return left + (x - x0) / (x1 - x0) * width; }
  double py(double y) const {
    const double v = log_y ? std::log10(y) : y;
    return top + height - (v - y0) / (y1 - y0) * height;
  }
};

void set_rgb(cairo_t* cr, const std::array<double, 3>& c) { cairo_set_source_rgb(cr, c[0], c[1], c[2]); }

void text_at(cairo_t* cr, double x, double y, const std::string& s, double align_x, double align_y) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  cairo_move_to(cr, x - e.x_advance * align_x, y + e.height * align_y);
  cairo_show_text(cr, s.c_str());
}

bool loss_like(const std::string& metric) { return metric.ends_with("loss"); }

// The values a panel shows: finite, and positive on a log axis.
Points usable(const Points& p, bool log_y) {
  Points out;
  for (const auto& [x, y] : p)
    if (std::isfinite(x) && std::isfinite(y) && (!log_y || y > 0)) out.emplace_back(x, y);
  return out;
}

Axes panel_axes(const std::vector<RunMetrics>& runs, const std::string& metric, bool log_y, double ox,
                double oy, const PlotOptions& o) {
  Range xr, yr;
  for (const auto& r : runs) {
    const auto it = r.series.find(metric);
    if (it == r.series.end()) continue;
    for (const auto& [x, y] : usable(it->second, log_y)) {
      xr.add(x);
      yr.add(log_y ? std::log10(y) : y);
    }
  }
  if (xr.empty()) xr = {0, 1};
  if (yr.empty()) yr = {0, 1};
  // Ranges narrower than a few ULPs of their values are flat: widened relative to the value, so the axis maps
  // to finite coordinates (x +-1 is lost on steps near 2^53).
  auto flat = [](const Range& r) { return r.hi - r.lo <= 1e-9 * std::max(std::abs(r.lo), std::abs(r.hi)); };
  if (flat(xr)) {
    const double pad = std::max(1.0, std::abs(xr.lo) * 1e-6);
    xr = {xr.lo - pad, xr.hi + pad};
  }
  if (flat(yr)) {
    const double pad = log_y ? 0.1 : std::max(std::abs(yr.lo) * 0.1, 1e-12);
    yr = {yr.lo - pad, yr.hi + pad};
  }
  // A margin inside the frame, so end points and their markers are not cut by it.
  const double xpad = (xr.hi - xr.lo) * 0.02, ypad = (yr.hi - yr.lo) * 0.05;
  return {ox + 72,
          oy + 34,
          o.panel_width - 72.0 - 18,
          o.panel_height - 34.0 - 46,
          xr.lo - xpad,
          xr.hi + xpad,
          yr.lo - ypad,
          yr.hi + ypad,
          log_y};
}

void draw_frame(cairo_t* cr, const Axes& a, const std::string& metric) {
  // Grid and ticks.
  const auto xt = linear_ticks(a.x0, a.x1, 6);
  const auto yt =
      a.log_y ? log_ticks(std::pow(10.0, a.y0), std::pow(10.0, a.y1)) : linear_ticks(a.y0, a.y1, 5);
  cairo_set_line_width(cr, 1);
  cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
  for (double x : xt) {
    cairo_move_to(cr, std::round(a.px(x)) + 0.5, a.top);
    cairo_line_to(cr, std::round(a.px(x)) + 0.5, a.top + a.height);
  }
  for (double y : yt) {
    cairo_move_to(cr, a.left, std::round(a.py(y)) + 0.5);
    cairo_line_to(cr, a.left + a.width, std::round(a.py(y)) + 0.5);
  }
  cairo_stroke(cr);
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  cairo_rectangle(cr, a.left + 0.5, a.top + 0.5, a.width, a.height);
  cairo_stroke(cr);
  cairo_set_font_size(cr, 11);
  for (double x : xt) text_at(cr, a.px(x), a.top + a.height + 6, tick_label(x), 0.5, 1.0);
  for (double y : yt) text_at(cr, a.left - 6, a.py(y), tick_label(y), 1.0, 0.5);
  text_at(cr, a.left + a.width / 2, a.top + a.height + 24, "step", 0.5, 1.0);
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
  cairo_set_font_size(cr, 13);
  text_at(cr, a.left, a.top - 10, metric + (a.log_y ? "  (log scale)" : ""), 0.0, 0.0);
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
}

// One stroked path per run (the curve), and a filled dot per point for evaluations and lone points.
void draw_curves(cairo_t* cr, const Axes& a, const std::vector<RunMetrics>& runs, const std::string& metric) {
  cairo_save(cr);
  cairo_rectangle(cr, a.left, a.top, a.width, a.height);
  cairo_clip(cr);
  cairo_set_line_width(cr, 2);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto it = runs[i].series.find(metric);
    if (it == runs[i].series.end()) continue;
    const Points p = usable(it->second, a.log_y);
    if (p.empty()) continue;
    set_rgb(cr, run_colour(i));
    for (size_t k = 0; k < p.size(); ++k)
      (k == 0 ? cairo_move_to : cairo_line_to)(cr, a.px(p[k].first), a.py(p[k].second));
    cairo_stroke(cr);
    if (metric.starts_with("eval_") || p.size() == 1)
      for (const auto& [x, y] : p) {
        cairo_new_sub_path(cr);
        cairo_arc(cr, a.px(x), a.py(y), 3.5, 0, 2 * M_PI);
        cairo_fill(cr);
      }
  }
  cairo_restore(cr);
}

void draw_legend(cairo_t* cr, const std::vector<RunMetrics>& runs, double width) {
  cairo_set_font_size(cr, 12);
  double x = 16;
  for (size_t i = 0; i < runs.size(); ++i) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, runs[i].name.c_str(), &e);
    if (x + 20 + e.x_advance > width && x > 16) break;  // the rest would fall off the picture
    set_rgb(cr, run_colour(i));
    cairo_rectangle(cr, x, 12, 14, 14);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    text_at(cr, x + 20, 19, runs[i].name, 0.0, 0.5);
    x += 20 + e.x_advance + 24;
  }
}

cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

std::vector<std::string> chosen_metrics(const std::vector<RunMetrics>& runs, const PlotOptions& o) {
  auto logged = [&](const std::string& m) {
    return std::any_of(runs.begin(), runs.end(), [&](const RunMetrics& r) { return r.series.count(m) > 0; });
  };
  std::vector<std::string> out;
  for (const auto& m : o.metrics.empty() ? default_plot_metrics() : o.metrics) {
    if (logged(m)) {
      out.push_back(m);
      continue;
    }
    if (o.metrics.empty()) continue;  // a default metric the runs do not have is just not drawn
    std::vector<std::string> have;
    for (const auto& r : runs)
      for (const auto& [name, _] : r.series)
        if (std::find(have.begin(), have.end(), name) == have.end()) have.push_back(name);
    fail("plot: metric '{}' is in no run's metrics.jsonl; logged metrics: {}", m, fmt::join(have, ", "));
  }
  TR_CHECK(!out.empty(), "plot: the runs logged none of {}", fmt::join(default_plot_metrics(), ", "));
  return out;
}

}  // namespace

const std::vector<std::string>& default_plot_metrics() {
  static const std::vector<std::string> m = {"loss", "eval_loss", "learning_rate", "grad_norm",
                                             "tokens_per_second"};
  return m;
}

std::array<double, 3> run_colour(size_t i) {
  static const int rgb[10][3] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                                 {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127},
                                 {188, 189, 34},  {23, 190, 207}};
  const int* c = rgb[i % 10];
  return {c[0] / 255.0, c[1] / 255.0, c[2] / 255.0};
}

void plot_runs(const std::vector<RunMetrics>& runs, const PlotOptions& o, const std::string& output) {
  TR_CHECK(!runs.empty(), "plot: no runs given");
  const bool svg = output.ends_with(".svg"), png = output.ends_with(".png");
  TR_CHECK(svg || png, "plot: --output {}: expected a .png or .svg file name", output);
  const auto metrics = chosen_metrics(runs, o);
  const int cols = metrics.size() == 1 ? 1 : 2, rows = static_cast<int>((metrics.size() + cols - 1) / cols);
  const double legend = 36, width = cols * o.panel_width, height = legend + rows * o.panel_height;
  std::string bytes;
  using SurfacePtr = std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)>;
  SurfacePtr surface(
      svg ? cairo_svg_surface_create_for_stream(append_bytes, &bytes, width, height)
          : cairo_image_surface_create(CAIRO_FORMAT_RGB24, static_cast<int>(width), static_cast<int>(height)),
      cairo_surface_destroy);
  TR_CHECK(cairo_surface_status(surface.get()) == CAIRO_STATUS_SUCCESS, "plot: cairo cannot make a {}x{} {}",
           width, height, svg ? "SVG" : "PNG");
  {
    std::unique_ptr<cairo_t, decltype(&cairo_destroy)> cr(cairo_create(surface.get()), cairo_destroy);
    cairo_set_source_rgb(cr.get(), 1, 1, 1);
    cairo_paint(cr.get());
    cairo_select_font_face(cr.get(), "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    draw_legend(cr.get(), runs, width);
    for (size_t k = 0; k < metrics.size(); ++k) {
      const double ox = static_cast<double>(k % cols) * o.panel_width;
      const double oy = legend + static_cast<double>(k / cols) * o.panel_height;
      const bool log_y = o.log_scale_loss && loss_like(metrics[k]);
      const Axes a = panel_axes(runs, metrics[k], log_y, ox, oy, o);
      draw_frame(cr.get(), a, metrics[k]);
      draw_curves(cr.get(), a, runs, metrics[k]);
    }
    TR_CHECK(cairo_status(cr.get()) == CAIRO_STATUS_SUCCESS, "plot: drawing failed: {}",
             cairo_status_to_string(cairo_status(cr.get())));
  }
  if (png)
    TR_CHECK(cairo_surface_write_to_png_stream(surface.get(), append_bytes, &bytes) == CAIRO_STATUS_SUCCESS,
             "plot: PNG encoding failed");
  cairo_surface_finish(surface.get());  // an SVG surface emits its document here
  TR_CHECK(cairo_surface_status(surface.get()) == CAIRO_STATUS_SUCCESS, "plot: {} encoding failed",
           svg ? "SVG" : "PNG");
  // Written beside and renamed over: a failed write never leaves half a picture in place of the old one.
  const std::string tmp = output + ".tmp";
  try {
    write_file(tmp, bytes);
  } catch (const Error& e) {
    fail("plot: --output {}: {}", output, e.what());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, output, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  TR_CHECK(!ec, "plot: {}: cannot write: {}", output, ec.message());
}

}  // namespace tr::report
