// SVG timeline of timed events: rows per stage, coloured compute boxes, axis and legend.
#include "pipetrain/schedule/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace pipetrain::schedule {
namespace {

struct Rgb {
  int r, g, b;
};

Rgb base_colour(Op op) {
  switch (op) {
    case Op::forward:
      return {0x4e, 0x79, 0xa7};  // blue
    case Op::backward:
      return {0xb0, 0x3a, 0x2e};  // dark red
    case Op::backward_input:
      return {0xe1, 0x57, 0x59};  // red
    case Op::backward_weight:
      return {0x59, 0xa1, 0x4f};  // green
    default:
      return {0x9c, 0x75, 0x5f};
  }
}

// Later chunks mix towards white so chunk 0 and chunk 1 of one op stay distinguishable.
Rgb shade(Rgb c, int chunk, int num_chunks) {
  if (num_chunks <= 1 || chunk == 0) return c;
  const double t = 0.5 * chunk / (num_chunks - 1);
  auto mix = [t](int v) { return static_cast<int>(std::lround(v + (255 - v) * t)); };
  return {mix(c.r), mix(c.g), mix(c.b)};
}

std::string hex(Rgb c) { return fmt::format("#{:02x}{:02x}{:02x}", c.r, c.g, c.b); }

bool dark(Rgb c) { return 0.299 * c.r + 0.587 * c.g + 0.114 * c.b < 150; }

std::string escape(const std::string& text) {
  std::string out;
  for (char ch : text) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

// 1, 2 or 5 times a power of ten, about a tenth of `span`.
double tick_step(double span) {
  const double raw = span / 10.0;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * power) return m * power;
  return 10.0 * power;
}

std::string number(double v) { return fmt::format("{:g}", std::round(v * 1e6) / 1e6); }

}  // namespace

std::string render_svg(const std::vector<TimedEvent>& events, const SvgOptions& options) {
  int rows = options.num_rows;
  int num_chunks = 1;
  double t0 = events.empty() ? 0.0 : events.front().start;
  double t1 = t0;
  bool present[kNumOps] = {};
  for (const TimedEvent& e : events) {
    if (options.num_rows <= 0) rows = std::max(rows, e.stage + 1);
    num_chunks = std::max(num_chunks, e.chunk + 1);
    t0 = std::min(t0, e.start);
    t1 = std::max(t1, e.end);
    if (is_compute(e.op)) present[static_cast<int>(e.op)] = true;
  }
  rows = std::max(rows, 1);
  const double span = t1 > t0 ? t1 - t0 : 1.0;
  const int left = 70, right = 20, top = options.title.empty() ? 16 : 44;
  const int row_h = std::max(options.row_height, 12), gap = 6;
  const int plot_w = std::max(options.width - left - right, 100);
  const int plot_h = rows * (row_h + gap) - gap;
  const int axis_y = top + plot_h + 18;
  const int legend_y = axis_y + 22;
  const int height = legend_y + 26;
  const int width = left + plot_w + right;
  auto x_of = [&](double t) { return left + (t - t0) / span * plot_w; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"Helvetica, Arial, sans-serif\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, width, height);
  if (!options.title.empty())
    svg += fmt::format("<text x=\"{}\" y=\"26\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
                       left, escape(options.title));
  for (int j = 0; j < rows; ++j) {
    const int y = top + j * (row_h + gap);
    svg +=
        fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"end\">{} {}</text>\n",
                    left - 8, y + row_h / 2 + 4, escape(options.row_name), j);
    svg += fmt::format(
        "<rect class=\"idle\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" "
        "fill=\"#e6e6e6\"/>\n",
        left, y, plot_w, row_h);
  }
  for (const TimedEvent& e : events) {
    if (!is_compute(e.op) || e.stage < 0 || e.stage >= rows || e.end <= e.start) continue;
    const Rgb colour = shade(base_colour(e.op), e.chunk, num_chunks);
    const double x = x_of(e.start);
    const double w = std::max(x_of(e.end) - x, 0.5);
    const int y = top + e.stage * (row_h + gap);
    std::string what = fmt::format("{} {}: {}", escape(options.row_name), e.stage, op_name(e.op));
    if (e.micro_batch >= 0) what += fmt::format(" micro-batch {}", e.micro_batch);
    if (num_chunks > 1) what += fmt::format(" chunk {}", e.chunk);
    what += fmt::format(", {} to {}", number(e.start), number(e.end));
    svg += fmt::format(
        "<g class=\"{}\"><title>{}</title><rect x=\"{:.2f}\" y=\"{}\" "
        "width=\"{:.2f}\" height=\"{}\" fill=\"{}\" stroke=\"white\" "
        "stroke-width=\"0.5\"/>",
        op_name(e.op), what, x, y, w, row_h, hex(colour));
    const std::string label = e.micro_batch >= 0 ? std::to_string(e.micro_batch) : "";
    const int font = std::min(12, row_h - 10);
    if (!label.empty() && w >= label.size() * font * 0.62 + 2)
      svg += fmt::format(
          "<text class=\"label\" x=\"{:.2f}\" y=\"{}\" font-size=\"{}\" "
          "text-anchor=\"middle\" "
          "fill=\"{}\">{}</text>",
          x + w / 2, y + row_h / 2 + font / 2 - 1, font, dark(colour) ? "white" : "black", label);
    svg += "</g>\n";
  }
  const double step = tick_step(span);
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#666\"/>\n", left,
                     axis_y - 12, left + plot_w, axis_y - 12);
  for (double t = 0; t <= span + step * 1e-9; t += step) {
    const double x = x_of(t0 + t);
    svg += fmt::format(
        "<line x1=\"{:.2f}\" y1=\"{}\" x2=\"{:.2f}\" y2=\"{}\" stroke=\"#666\"/>"
        "<text x=\"{:.2f}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\" "
        "fill=\"#444\">{}</text>\n",
        x, axis_y - 12, x, axis_y - 8, x, axis_y + 2, number(t));
  }
  int lx = left;
  auto legend = [&](const std::string& fill, const std::string& text) {
    svg += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"{}\"/>"
        "<text x=\"{}\" y=\"{}\" font-size=\"12\">{}</text>\n",
        lx, legend_y, fill, lx + 19, legend_y + 11, text);
    lx += 24 + static_cast<int>(text.size()) * 7;
  };
  for (Op op : {Op::forward, Op::backward, Op::backward_input, Op::backward_weight})
    if (present[static_cast<int>(op)]) legend(hex(base_colour(op)), op_name(op));
  legend("#e6e6e6", "idle");
  if (num_chunks > 1) {
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"#444\">lighter shade = "
        "later chunk; labels are micro-batch ids</text>\n",
        lx, legend_y + 11);
  } else {
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"#444\">labels are "
        "micro-batch ids</text>\n",
        lx, legend_y + 11);
  }
  svg += "</svg>\n";
  return svg;
}

std::string timeline_title(const Schedule& s, double bubble) {
  return fmt::format("{}: P={} stages, M={} micro-batches, V={}, bubble {:.1f}%", kind_name(s.kind),
                     s.num_stages(), s.num_micro_batches, s.num_chunks(), 100.0 * bubble);
}

}  // namespace pipetrain::schedule
