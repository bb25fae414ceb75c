// Slurm's compressed host lists ("node[01-04,07],gpu3") and task counts ("2(x3),1").
#pragma once

#include <string>
#include <vector>

namespace pipetrain::comm {

// The first host of a Slurm host list: "node[01-04,07],gpu3" -> "node01",
// "rack[2-3]-n[5,9]" -> "rack2-n5". ConfigError for an empty or malformed list.
std::string slurm_first_host(const std::string& nodelist);

// Expands SLURM_TASKS_PER_NODE: "2(x3),1" -> {2, 2, 2, 1}. ConfigError when malformed.
std::vector<int> slurm_tasks_per_node(const std::string& spec);

}  // namespace pipetrain::comm
