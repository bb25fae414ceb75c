// Slurm's compressed host lists and task-count lists.
#include "pipetrain/comm/slurm_hostlist.h"

#include <cctype>

#include "pipetrain/error.h"

namespace pipetrain::comm {
namespace {

[[noreturn]] void bad_list(const std::string& what, const std::string& list, const std::string& why) {
  throw ConfigError(what + "='" + list + "' is not a Slurm host list (" + why +
                    "); set MASTER_ADDR to the host of rank 0 instead");
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

std::string slurm_first_host(const std::string& nodelist) {
  const std::string what = "SLURM_NODELIST";
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    const char c = nodelist[i];
    if (c == ']') bad_list(what, nodelist, "']' without '['");
    if (c != '[') {
      host += c;
      ++i;
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string::npos) bad_list(what, nodelist, "'[' without ']'");
    const std::string inside = nodelist.substr(i + 1, close - i - 1);
    if (inside.find('[') != std::string::npos) bad_list(what, nodelist, "nested '['");
    // The first element of "01-04,07" is the start of its first range, zero padding kept.
    std::string first = inside.substr(0, inside.find_first_of(",-"));
    if (!all_digits(first)) bad_list(what, nodelist, "range '" + inside + "' is not numeric");
    host += first;
    i = close + 1;
  }
  if (host.empty()) bad_list(what, nodelist, "no host name");
  return host;
}

std::vector<int> slurm_tasks_per_node(const std::string& spec) {
  auto bad = [&](const std::string& why) -> std::vector<int> {
    throw ConfigError("SLURM_TASKS_PER_NODE='" + spec + "' is not a Slurm task list (" + why +
                      "); set LOCAL_WORLD_SIZE to the number of ranks on this host instead");
  };
  std::vector<int> counts;
  size_t i = 0;
  while (i <= spec.size()) {
    size_t end = spec.find(',', i);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(i, end - i);
    std::string count = item;
    int repeat = 1;
    const size_t paren = item.find("(x");
    if (paren != std::string::npos) {
      if (item.back() != ')') return bad("'" + item + "' lacks ')'");
      const std::string times = item.substr(paren + 2, item.size() - paren - 3);
      if (!all_digits(times) || times.size() > 6) return bad("bad repeat in '" + item + "'");
      repeat = std::stoi(times);
      count = item.substr(0, paren);
    }
    if (!all_digits(count) || count.size() > 6) return bad("bad count '" + item + "'");
    const int n = std::stoi(count);
    if (n < 1 || repeat < 1) return bad("'" + item + "' has a zero count");
    counts.insert(counts.end(), static_cast<size_t>(repeat), n);
    i = end + 1;
  }
  return counts;
}

}  // namespace pipetrain::comm
