// Action names, codes, the compact printer and its parser.
#include "pipetrain/schedule/action.h"

#include <fmt/format.h>

#include <cctype>
#include <ostream>
#include <string>

#include "pipetrain/error.h"

namespace pipetrain::schedule {
namespace {

struct OpInfo {
  const char* name;
  const char* code;
};

// Indexed by Op.
constexpr OpInfo kOps[kNumOps] = {
    {"load_micro_batch", "L"},  {"forward", "F"},         {"backward", "B"},
    {"backward_input", "I"},    {"backward_weight", "W"}, {"send_activation", "SA"},
    {"recv_activation", "RA"},  {"send_grad", "SG"},      {"recv_grad", "RG"},
    {"reduce_tied_grads", "T"}, {"reduce_grads", "R"},    {"optimizer_step", "O"},
};

// An op outside the enum (a corrupt trace row, a cast integer) prints as "unknown" instead of
// reading past the table.
const OpInfo& info(Op op) {
  static constexpr OpInfo kUnknown{"unknown", "?"};
  const int index = static_cast<int>(op);
  return index < kNumOps ? kOps[index] : kUnknown;
}

std::string all_names() {
  std::string out;
  for (const auto& op : kOps) out += (out.empty() ? "" : ", ") + std::string(op.name);
  return out;
}

std::string all_codes() {
  std::string out;
  for (const auto& op : kOps) out += (out.empty() ? "" : " ") + std::string(op.code);
  return out;
}

[[noreturn]] void bad_text(std::string_view text, const std::string& why) {
  throw ScheduleError(fmt::format(
      "cannot parse action '{}': {}; expected <stage><code>[mb][c<chunk>][#<slot>][>|<<peer>"
      "[c<chunk>]], e.g. 2F5 or 0SA4#1>1 (codes: {})",
      text, why, all_codes()));
}

// Reads a non-negative decimal integer at text[pos]; -1 when there is no digit there.
int read_int(std::string_view text, size_t& pos) {
  if (pos >= text.size() || !std::isdigit(static_cast<unsigned char>(text[pos]))) return -1;
  long value = 0;
  size_t digits = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
    if (++digits > 9) bad_text(text, "number too long");
    value = value * 10 + (text[pos] - '0');
    ++pos;
  }
  return static_cast<int>(value);
}

}  // namespace

const char* op_name(Op op) { return info(op).name; }
const char* op_code(Op op) { return info(op).code; }

Op op_from_index(int index) {
  if (index < 0 || index >= kNumOps) {
    throw ScheduleError(fmt::format("op index {} names no action (expected 0 to {}: {}); the data it "
                                    "came from was written by another version or is corrupt",
                                    index, kNumOps - 1, all_names()));
  }
  return static_cast<Op>(index);
}

Op parse_op_name(std::string_view name) {
  for (int i = 0; i < kNumOps; ++i)
    if (name == kOps[i].name) return static_cast<Op>(i);
  throw ScheduleError(fmt::format("unknown op '{}': expected one of {}", name, all_names()));
}

bool Action::operator==(const Action& o) const {
  return op == o.op && stage == o.stage && micro_batch == o.micro_batch && chunk == o.chunk &&
         slot == o.slot && peer_stage == o.peer_stage && peer_chunk == o.peer_chunk;
}

std::string malformation(const Action& a) {
  // The fast path: the validator asks this of every action, and nearly all are fine.
  const bool mb = has_micro_batch(a.op);
  const bool comm = is_comm(a.op);
  if (static_cast<int>(a.op) < kNumOps && a.stage >= 0 && a.chunk >= 0 && a.slot >= -1 &&
      (mb ? a.micro_batch >= 0 : a.micro_batch == -1 && a.slot == -1) &&
      (comm ? a.peer_stage >= 0 && a.peer_chunk >= 0 : a.peer_stage == -1 && a.peer_chunk == -1))
    return {};
  if (static_cast<int>(a.op) >= kNumOps) return "unknown op";
  if (a.stage < 0) return fmt::format("negative stage {}", a.stage);
  if (a.chunk < 0) return fmt::format("negative chunk {}", a.chunk);
  if (a.slot < -1) return fmt::format("slot {} (expected >= 0, or -1 for none)", a.slot);
  if (has_micro_batch(a.op) && a.micro_batch < 0)
    return fmt::format("{} needs a micro-batch id >= 0, got {}", op_name(a.op), a.micro_batch);
  if (!has_micro_batch(a.op) && a.micro_batch != -1)
    return fmt::format("{} takes no micro-batch, got {}", op_name(a.op), a.micro_batch);
  if (!has_micro_batch(a.op) && a.slot != -1)
    return fmt::format("{} takes no buffer slot, got {}", op_name(a.op), a.slot);
  if (is_comm(a.op) && (a.peer_stage < 0 || a.peer_chunk < 0))
    return fmt::format("{} needs a peer stage and chunk >= 0, got {} and {}", op_name(a.op),
                       a.peer_stage, a.peer_chunk);
  if (!is_comm(a.op) && (a.peer_stage != -1 || a.peer_chunk != -1))
    return fmt::format("{} takes no peer, got stage {} chunk {}", op_name(a.op), a.peer_stage,
                       a.peer_chunk);
  return {};
}

std::string to_string(const Action& a) {
  std::string out = std::to_string(a.stage) + op_code(a.op);
  if (a.micro_batch >= 0) out += std::to_string(a.micro_batch);
  if (a.chunk != 0) out += "c" + std::to_string(a.chunk);
  if (a.slot >= 0) out += "#" + std::to_string(a.slot);
  if (a.peer_stage >= 0) {
    out += is_send(a.op) ? ">" : "<";
    out += std::to_string(a.peer_stage);
    if (a.peer_chunk != 0) out += "c" + std::to_string(a.peer_chunk);
  }
  return out;
}

Action parse_action(std::string_view text) {
  Action a;
  size_t pos = 0;
  a.stage = read_int(text, pos);
  if (a.stage < 0) bad_text(text, "no stage number at the start");
  const size_t code_begin = pos;
  while (pos < text.size() && std::isupper(static_cast<unsigned char>(text[pos]))) ++pos;
  const std::string_view code = text.substr(code_begin, pos - code_begin);
  bool found = false;
  for (int i = 0; i < kNumOps && !found; ++i) {
    if (code == kOps[i].code) {
      a.op = static_cast<Op>(i);
      found = true;
    }
  }
  if (!found) bad_text(text, fmt::format("unknown op code '{}'", code));
  a.micro_batch = read_int(text, pos);
  if (pos < text.size() && text[pos] == 'c') {
    ++pos;
    a.chunk = read_int(text, pos);
    if (a.chunk < 0) bad_text(text, "'c' must be followed by a chunk number");
  }
  if (pos < text.size() && text[pos] == '#') {
    ++pos;
    a.slot = read_int(text, pos);
    if (a.slot < 0) bad_text(text, "'#' must be followed by a slot number");
  }
  if (pos < text.size() && (text[pos] == '>' || text[pos] == '<')) {
    const bool arrow_out = text[pos] == '>';
    if (!is_comm(a.op)) bad_text(text, fmt::format("{} takes no peer", op_name(a.op)));
    if (arrow_out != is_send(a.op))
      bad_text(text, fmt::format("{} takes '{}' before its peer", op_name(a.op),
                                 is_send(a.op) ? '>' : '<'));
    ++pos;
    a.peer_stage = read_int(text, pos);
    if (a.peer_stage < 0) bad_text(text, "the arrow must be followed by a peer stage number");
    a.peer_chunk = 0;
    if (pos < text.size() && text[pos] == 'c') {
      ++pos;
      a.peer_chunk = read_int(text, pos);
      if (a.peer_chunk < 0) bad_text(text, "'c' must be followed by a chunk number");
    }
  }
  if (pos != text.size()) bad_text(text, fmt::format("unexpected '{}'", text.substr(pos)));
  const std::string problem = malformation(a);
  if (!problem.empty()) bad_text(text, problem);
  return a;
}

std::vector<Action> parse_actions(std::string_view text) {
  std::vector<Action> out;
  size_t pos = 0;
  while (pos < text.size()) {
    while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
    const size_t begin = pos;
    while (pos < text.size() && !std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
    if (pos > begin) out.push_back(parse_action(text.substr(begin, pos - begin)));
  }
  return out;
}

std::string short_label(const Action& a) {
  std::string out = op_code(a.op);
  if (a.micro_batch >= 0) out += std::to_string(a.micro_batch);
  if (a.chunk != 0) out += "c" + std::to_string(a.chunk);
  return out;
}

std::ostream& operator<<(std::ostream& out, const Action& a) { return out << to_string(a); }
std::ostream& operator<<(std::ostream& out, Op op) { return out << op_name(op); }

}  // namespace pipetrain::schedule
