// The loss curve of a run, as SVG.
#include "apps/train/run_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

namespace pipetrain::apps {

namespace {

struct Series {
  std::vector<std::pair<double, double>> points;  // (step, value)
  double lo = 1e300, hi = -1e300;
  void add(double x, double y) {
    if (!std::isfinite(y)) return;
    points.emplace_back(x, y);
    lo = std::min(lo, y);
    hi = std::max(hi, y);
  }
};

std::string polyline(const Series& s, double max_step, double x0, double y0, double w, double h, const char* color) {
  if (s.points.empty()) return "";
  const double span = s.hi > s.lo ? s.hi - s.lo : 1.0;
  std::string pts;
  for (const auto& [x, y] : s.points) {
    pts += fmt::format("{:.1f},{:.1f} ", x0 + w * x / std::max(1.0, max_step), y0 + h - h * (y - s.lo) / span);
  }
  return fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>)", color, pts) + "\n";
}

}  // namespace

void write_loss_curve(const std::filesystem::path& metrics, const std::filesystem::path& svg,
                      const std::string& title, const std::string& metric) {
  Series loss, eval;
  double max_step = 1;
  std::ifstream in(metrics);
  std::string line;
  const std::string eval_key = "eval_" + metric;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    const double step = j.value("step", 0.0);
    max_step = std::max(max_step, step);
    if (j.contains("loss")) loss.add(step, j["loss"].get<double>());
    if (j.contains(eval_key)) eval.add(step, j[eval_key].get<double>());
  }
  constexpr double kW = 720, kH = 360, kX = 60, kY = 40, kPlotW = 600, kPlotH = 260;
  std::string out = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12">)"
      "\n"
      R"(<rect width="100%" height="100%" fill="white"/>)"
      "\n"
      R"(<text x="{}" y="22" font-size="14">{}: training loss (blue){}</text>)"
      "\n"
      R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#888"/>)"
      "\n",
      kW, kH, kX, title, eval.points.empty() ? "" : fmt::format(", {} (orange, right axis)", metric), kX, kY, kPlotW,
      kPlotH);
  out += polyline(loss, max_step, kX, kY, kPlotW, kPlotH, "#1f77b4");
  out += polyline(eval, max_step, kX, kY, kPlotW, kPlotH, "#ff7f0e");
  if (!loss.points.empty()) {
    out += fmt::format(R"(<text x="{}" y="{}" text-anchor="end">{:.3g}</text>)" "\n", kX - 4, kY + 10, loss.hi);
    out += fmt::format(R"(<text x="{}" y="{}" text-anchor="end">{:.3g}</text>)" "\n", kX - 4, kY + kPlotH, loss.lo);
  }
  if (!eval.points.empty()) {
    out += fmt::format(R"(<text x="{}" y="{}">{:.3g}</text>)" "\n", kX + kPlotW + 4, kY + 10, eval.hi);
    out += fmt::format(R"(<text x="{}" y="{}">{:.3g}</text>)" "\n", kX + kPlotW + 4, kY + kPlotH, eval.lo);
  }
  out += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">step (0 .. {:.0f})</text>)" "\n", kX + kPlotW / 2,
                     kY + kPlotH + 24, max_step);
  out += "</svg>\n";
  std::ofstream(svg) << out;
}

}  // namespace pipetrain::apps
