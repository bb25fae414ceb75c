// Reading torch.distributed.pipelining's schedule CSV into a validated Schedule (torch_csv.h).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "pipetrain/error.h"
#include "pipetrain/schedule/lower.h"
#include "pipetrain/schedule/torch_csv.h"
#include "pipetrain/schedule/validate.h"

namespace pipetrain::schedule {
namespace {

// torch's _ComputationType values that carry a micro-batch and mean something here.
enum class Type { F, B, I, W, send_f, recv_f, send_b, recv_b };

struct Cell {
  Type type;
  int stage;        // torch's global (virtual) stage index
  int micro_batch;  //
  int row;          // rank
  int column;       // cell index in the row, for messages
  std::string text;
};

constexpr const char* kExpected =
    "expected torch's action text <stage><type><micro-batch> (type F, B, I, W, SEND_F, RECV_F, "
    "SEND_B or RECV_B, e.g. 0F1, 3SEND_B0), (a;b)OVERLAP_F_B, UNSHARD/RESHARD/REDUCE_GRAD "
    "with a stage, or an empty cell";

struct Where {
  std::string_view origin;
  int row;
  int column;
  std::string cell;
  [[noreturn]] void fail(const std::string& why) const {
    throw ScheduleError(fmt::format("{}: row {} (rank {}), column {}, cell '{}': {}", origin, row,
                                    row, column, cell, why));
  }
};

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// RFC 4180 cells of one line: commas separate, double quotes may wrap a cell ("" = ").
std::vector<std::string> split_cells(const std::string& line, std::string_view origin, int row) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (size_t k = 0; k < line.size(); ++k) {
    const char c = line[k];
    if (quoted) {
      if (c == '"' && k + 1 < line.size() && line[k + 1] == '"') {
        cells.back() += '"';
        ++k;
      } else if (c == '"') {
        quoted = false;
      } else {
        cells.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.emplace_back();
    } else {
      cells.back() += c;
    }
  }
  if (quoted)
    throw ScheduleError(fmt::format(
        "{}: row {} (rank {}): a double quote opens a cell that never closes; close it or "
        "remove it",
        origin, row, row));
  return cells;
}

// Digits at s[k...]; nullopt when there are none or they overflow an int.
std::optional<int> digits(const std::string& s, size_t& k) {
  const size_t begin = k;
  long value = 0;
  while (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
    value = value * 10 + (s[k] - '0');
    if (value > 1000000000) return std::nullopt;
    ++k;
  }
  if (k == begin) return std::nullopt;
  return static_cast<int>(value);
}

// One plain action text (no OVERLAP_F_B); nothing for the dropped FSDP / reduce steps.
std::optional<Cell> parse_plain(const std::string& text, const Where& where) {
  size_t k = 0;
  const auto stage = digits(text, k);
  if (!stage) where.fail(fmt::format("'{}' does not start with a stage index; {}", text, kExpected));
  static const std::pair<const char*, std::optional<Type>> kTypes[] = {
      {"SEND_F", Type::send_f}, {"RECV_F", Type::recv_f},   {"SEND_B", Type::send_b},
      {"RECV_B", Type::recv_b}, {"UNSHARD", std::nullopt},  {"RESHARD", std::nullopt},
      {"REDUCE_GRAD", std::nullopt}, {"F", Type::F},        {"B", Type::B},
      {"I", Type::I},           {"W", Type::W}};
  for (const auto& [name, type] : kTypes) {
    const std::string_view n(name);
    if (text.compare(k, n.size(), n) != 0) continue;
    size_t m = k + n.size();
    if (!type) {
      if (m != text.size()) where.fail(fmt::format("{} takes no micro-batch; {}", name, kExpected));
      return std::nullopt;
    }
    const auto mb = digits(text, m);
    if (!mb) where.fail(fmt::format("{} needs a micro-batch index after it; {}", name, kExpected));
    if (m != text.size())
      where.fail(fmt::format("unexpected '{}' after the micro-batch; {}", text.substr(m), kExpected));
    return Cell{*type, *stage, *mb, where.row, where.column, text};
  }
  where.fail(fmt::format("unknown action type '{}'; {}", text.substr(k), kExpected));
}

// The actions of one cell: none (idle, dropped steps), one, or an overlapped pair's parts.
std::vector<Cell> parse_cell(const std::string& raw, const Where& where) {
  const std::string text = trim(raw);
  std::vector<Cell> out;
  if (text.empty()) return out;
  if (text.front() == '(') {
    const size_t close = text.find(')');
    if (close == std::string::npos || text.substr(close + 1) != "OVERLAP_F_B")
      where.fail(fmt::format("a parenthesised cell must read (a;b)OVERLAP_F_B; {}", kExpected));
    std::stringstream parts(text.substr(1, close - 1));
    std::string part;
    while (std::getline(parts, part, ';')) {
      const std::string sub = trim(part);
      if (sub.empty()) continue;
      const auto cell = parse_plain(sub, where);
      if (!cell || cell->type > Type::W)
        where.fail(fmt::format("OVERLAP_F_B may only hold compute actions (F, B, I, W), got '{}'",
                               sub));
      out.push_back(*cell);
      out.back().text = text;
    }
    return out;
  }
  if (auto cell = parse_plain(text, where)) out.push_back(*cell);
  return out;
}

bool is_compute(Type t) { return t <= Type::W; }

Op compute_op(Type t) {
  switch (t) {
    case Type::F:
      return Op::forward;
    case Type::B:
      return Op::backward;
    case Type::I:
      return Op::backward_input;
    default:
      return Op::backward_weight;
  }
}

// Which layout puts every cell's stage on its row: looped first (it is torch's default and the
// only one for V = 1), then the V.
Layout infer_layout(const std::vector<std::vector<Cell>>& rows, int P, int V,
                    std::string_view origin) {
  const Cell* first_misfit[2] = {nullptr, nullptr};
  const LayoutKind kinds[2] = {LayoutKind::looped, LayoutKind::v_shape};
  for (int k = 0; k < 2; ++k) {
    const Layout layout(P, V, kinds[k]);
    for (const auto& row : rows)
      for (const Cell& c : row)
        if (!first_misfit[k] && layout.placement(c.stage).stage != c.row) first_misfit[k] = &c;
    if (!first_misfit[k]) return layout;
  }
  const Cell& a = *first_misfit[0];
  const Cell& b = *first_misfit[1];
  throw ScheduleError(fmt::format(
      "{}: the stages do not follow a layout pipetrain runs: looped (stage s on rank s % {}) "
      "fails at row {}, column {}, cell '{}' (stage {} is on rank {}), and the V fails at row "
      "{}, column {}, cell '{}' (stage {} is on rank {}); write each stage on the rank either "
      "layout gives it",
      origin, P, a.row, a.column, a.text, a.stage, Layout(P, V).placement(a.stage).stage, b.row,
      b.column, b.text, b.stage, Layout(P, V, LayoutKind::v_shape).placement(b.stage).stage));
}

// torch's (type, stage) of one of our lowered cross-rank transfers.
std::optional<std::pair<Type, int>> torch_comm(const Layout& layout, const Action& a) {
  if (!is_comm(a.op) || a.peer_stage == a.stage) return std::nullopt;
  const int v = layout.virtual_stage(a.stage, a.chunk);
  switch (a.op) {
    case Op::send_activation:
      return std::make_pair(Type::send_f, v);
    case Op::recv_activation:
      return std::make_pair(Type::recv_f, v);
    case Op::send_grad:
      return std::make_pair(Type::send_b, v);
    default:
      return std::make_pair(Type::recv_b, v);
  }
}

const char* type_text(Type t) {
  static const char* kNames[] = {"F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"};
  return kNames[static_cast<int>(t)];
}

// The communication cells of `rows` are the lowering's cross-rank transfers, each receive
// before its consumer and each send after its producer in the row.
void check_comm(const Schedule& s, const std::vector<std::vector<Cell>>& rows,
                std::string_view origin) {
  using Key = std::tuple<Type, int, int>;  // type, stage, micro-batch
  for (int r = 0; r < s.num_stages(); ++r) {
    std::map<Key, int> expected;  // -> count
    for (const Action& a : s.stages[r])
      if (auto t = torch_comm(s.layout, a)) ++expected[{t->first, t->second, a.micro_batch}];
    std::map<std::pair<int, int>, int> forward_at, backward_at;  // (stage, mb) -> cell index
    for (size_t k = 0; k < rows[r].size(); ++k) {
      const Cell& c = rows[r][k];
      if (c.type == Type::F) forward_at[{c.stage, c.micro_batch}] = static_cast<int>(k);
      if (c.type == Type::B || c.type == Type::I)
        backward_at[{c.stage, c.micro_batch}] = static_cast<int>(k);
    }
    for (size_t k = 0; k < rows[r].size(); ++k) {
      const Cell& c = rows[r][k];
      if (is_compute(c.type)) continue;
      const Where where{origin, c.row, c.column, c.text};
      // A hand-over between two chunks of this rank: torch needs no message, neither do we.
      const int peer_stage = c.type == Type::recv_f || c.type == Type::send_b ? c.stage - 1
                                                                               : c.stage + 1;
      if (peer_stage >= 0 && peer_stage < s.layout.num_virtual_stages() &&
          s.layout.placement(peer_stage).stage == r &&
          s.layout.placement(c.stage).stage == r)
        continue;
      auto it = expected.find({c.type, c.stage, c.micro_batch});
      if (it == expected.end() || it->second == 0)
        where.fail(fmt::format(
            "rank {} has no such transfer: the compute cells of this file send and receive {} "
            "only where a stage's neighbour is on another rank; remove the cell or fix its "
            "stage or micro-batch",
            r, type_text(c.type)));
      --it->second;
      const bool before = c.type == Type::recv_f || c.type == Type::recv_b;
      const auto& at = c.type == Type::recv_f || c.type == Type::send_f ? forward_at : backward_at;
      const auto consumer = at.find({c.stage, c.micro_batch});
      if (consumer != at.end() && (before ? consumer->second < static_cast<int>(k)
                                          : consumer->second > static_cast<int>(k)))
        where.fail(fmt::format("a {} must come {} the compute action of stage {}, micro-batch "
                               "{} (cell {} of the row)",
                               before ? "receive" : "send", before ? "before" : "after", c.stage,
                               c.micro_batch, rows[r][consumer->second].column));
    }
    for (const auto& [key, count] : expected)
      if (count > 0)
        throw ScheduleError(fmt::format(
            "{}: row {} (rank {}) lacks the transfer {}{}{} that its compute cells need; a file "
            "with communication must list every cross-rank send and receive (or none: "
            "compute-only)",
            origin, r, r, std::get<1>(key), type_text(std::get<0>(key)), std::get<2>(key)));
  }
}

}  // namespace

Schedule from_torch_csv(std::string_view text, std::string_view origin) {
  std::vector<std::string> lines;
  {
    std::string line;
    std::stringstream in{std::string(text)};
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(line);
    }
    while (!lines.empty() && trim(lines.back()).empty()) lines.pop_back();  // trailing newlines
  }
  if (lines.empty())
    throw ScheduleError(fmt::format(
        "{}: no rows; torch's schedule CSV has one row of actions per rank (e.g. 0F0,0F1,0B0)",
        origin));
  std::vector<std::vector<Cell>> rows(lines.size());
  int max_stage = -1, max_mb = -1;
  bool any_comm = false, training = false;
  for (size_t r = 0; r < lines.size(); ++r) {
    const auto cells = split_cells(lines[r], origin, static_cast<int>(r));
    for (size_t col = 0; col < cells.size(); ++col) {
      const Where where{origin, static_cast<int>(r), static_cast<int>(col), trim(cells[col])};
      for (Cell& c : parse_cell(cells[col], where)) {
        max_stage = std::max(max_stage, c.stage);
        if (is_compute(c.type)) max_mb = std::max(max_mb, c.micro_batch);
        any_comm = any_comm || !is_compute(c.type);
        training = training || (is_compute(c.type) && c.type != Type::F);
        rows[r].push_back(std::move(c));
      }
    }
  }
  const int P = static_cast<int>(rows.size());
  if (max_mb < 0)
    throw ScheduleError(fmt::format("{}: no compute action (F, B, I or W) in any of the {} rows",
                                    origin, P));
  if ((max_stage + 1) % P != 0)
    throw ScheduleError(fmt::format(
        "{}: {} stages (0..{}) do not split evenly over {} ranks (rows); every rank holds the "
        "same number of stages: add the missing rows or stages",
        origin, max_stage + 1, max_stage, P));
  const int V = (max_stage + 1) / P;
  const Layout layout = infer_layout(rows, P, V, origin);
  ComputeOrder order(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r)
    for (const Cell& c : rows[r])
      if (is_compute(c.type))
        order[r].push_back({compute_op(c.type), layout.placement(c.stage).chunk, c.micro_batch});
  Schedule s = lower(ScheduleKind::custom, training, max_mb + 1, layout, order);
  if (auto problem = find_problem(s))
    throw ScheduleError(fmt::format("{}: the compute order cannot run here: {}", origin,
                                    describe_problem(s, *problem)));
  if (any_comm) check_comm(s, rows, origin);
  return s;
}

Schedule read_torch_csv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError(fmt::format("{}: cannot open the file (check the path and permissions)",
                                  path));
  std::stringstream text;
  text << in.rdbuf();
  return from_torch_csv(text.str(), path);
}

}  // namespace pipetrain::schedule
