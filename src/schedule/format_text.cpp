// Text forms of a schedule: listing, compute table and the marked step-by-stage grid.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "pipetrain/schedule/format.h"

namespace pipetrain::schedule {
namespace {

std::string header(const Schedule& s) {
  std::string buffers;
  for (int b : s.buffers) buffers += (buffers.empty() ? "" : " ") + std::to_string(b);
  return fmt::format(
      "{}: {} stages, {} micro-batches, {} chunk(s) per stage ({} layout); "
      "buffers per stage: {}\n",
      kind_name(s.kind), s.num_stages(), s.num_micro_batches, s.num_chunks(),
      layout_name(s.layout.kind()), buffers);
}

std::string pad(const std::string& text, size_t width) {
  return text + std::string(width > text.size() ? width - text.size() : 0, ' ');
}

}  // namespace

std::string format_text(const Schedule& s, int only_stage) {
  std::string out = header(s);
  for (int j = 0; j < static_cast<int>(s.stages.size()); ++j) {
    if (only_stage >= 0 && j != only_stage) continue;
    out += fmt::format("stage {}:", j);
    for (const Action& a : s.stages[j]) out += " " + to_string(a);
    out += "\n";
  }
  return out;
}

std::string format_compute_table(const Schedule& s) {
  std::vector<std::vector<std::string>> rows(s.stages.size());
  size_t width = 0;
  for (size_t j = 0; j < s.stages.size(); ++j)
    for (const Action& a : s.stages[j])
      if (is_compute(a.op)) {
        rows[j].push_back(short_label(a));
        width = std::max(width, rows[j].back().size());
      }
  std::string out;
  for (size_t j = 0; j < rows.size(); ++j) {
    std::string line = fmt::format("stage {}:", j);
    for (const auto& label : rows[j]) line += " " + pad(label, width);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string format_grid(const Schedule& s, const std::vector<std::pair<int, int>>& marks,
                        int max_columns) {
  int length = 0;
  for (const auto& actions : s.stages) length = std::max(length, static_cast<int>(actions.size()));
  int first = 0;
  int last = std::min(length, max_columns) - 1;
  if (!marks.empty() && length > max_columns) {
    // Centre on the first mark, widening towards the others while the budget allows.
    int lo = marks[0].second;
    int hi = marks[0].second;
    for (const auto& m : marks) {
      if (std::max(hi, m.second) - std::min(lo, m.second) < max_columns) {
        lo = std::min(lo, m.second);
        hi = std::max(hi, m.second);
      }
    }
    const int spare = max_columns - (hi - lo + 1);
    first = std::max(0, lo - spare / 2);
    last = std::min(length - 1, first + max_columns - 1);
    first = std::max(0, last - max_columns + 1);
  }
  auto marked = [&](int j, int k) {
    return std::find(marks.begin(), marks.end(), std::make_pair(j, k)) != marks.end();
  };
  auto cell = [&](int j, int k) -> std::string {
    if (k >= static_cast<int>(s.stages[j].size())) return "";
    const std::string text = to_string(s.stages[j][k]);
    return marked(j, k) ? "[" + text + "]" : text;
  };
  std::vector<size_t> width;
  for (int k = first; k <= last; ++k) {
    size_t w = std::to_string(k).size();
    for (int j = 0; j < static_cast<int>(s.stages.size()); ++j) w = std::max(w, cell(j, k).size());
    width.push_back(w);
  }
  std::string out = "position";
  out += first > 0 ? " ..." : "    ";
  for (int k = first; k <= last; ++k) out += " " + pad(std::to_string(k), width[k - first]);
  if (last < length - 1) out += " ...";
  while (out.back() == ' ') out.pop_back();
  out += "\n";
  for (int j = 0; j < static_cast<int>(s.stages.size()); ++j) {
    std::string line = pad(fmt::format("stage {}", j), 12);
    std::string underline(12, ' ');
    bool any = false;
    for (int k = first; k <= last; ++k) {
      const std::string text = cell(j, k);
      line += " " + pad(text, width[k - first]);
      underline += " " + pad(marked(j, k) ? std::string(text.size(), '^') : "", width[k - first]);
      any = any || marked(j, k);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
    if (any) {
      while (!underline.empty() && underline.back() == ' ') underline.pop_back();
      out += underline + "\n";
    }
  }
  return out;
}

}  // namespace pipetrain::schedule
