// pipetrain._C functions the Python package calls into: checkpoint phase, skip tracker,
// partitioning and profiling, and the launcher's rendezvous facts (pipetrain.comm).
#include <torch/extension.h>

#include <chrono>

#include "batch_convert.h"
#include "layer.h"
#include "pipetrain/comm/rank_info.h"
#include "pipetrain/partition/balance.h"
#include "pipetrain/partition/min_max.h"
#include "pipetrain/runtime/checkpoint.h"
#include "pipetrain/skip/tracker.h"

namespace pipetrain::python {

void bind_runtime(py::module& m) {
  // One owner for who this process is: the native parser of the launchers' variables (torchrun,
  // pipetrain launch, mpirun, srun), which the engine's own connection reads as well.
  m.def("launch_env", [] {
    const comm::RankInfo info = comm::rank_info_from_env();
    py::dict d;
    d["rank"] = info.rank;
    d["world_size"] = info.world_size;
    d["local_rank"] = info.local_rank;
    d["local_world_size"] = info.local_world_size;
    d["master_addr"] = info.master_addr;
    d["master_port"] = info.master_port;
    d["launcher"] = comm::to_string(info.launcher);
    d["agent_store"] = info.agent_store;
    d["notes"] = info.notes;
    return d;
  }, "The launcher's view of this process: rank, world_size, local_rank, local_world_size, master_addr, "
     "master_port (0: a single process with none), launcher, agent_store, notes");
  m.def("is_checkpointing", &runtime::is_checkpointing,
        "Whether the current forward runs under activation checkpointing (its first, graph-free pass).");
  m.def("is_recomputing", &runtime::is_recomputing,
        "Whether the current forward is a checkpoint's recomputation in backward.");

  // The tracker the runtime installed on this thread for the micro-batch that runs (else the
  // thread's own): Python skippables stash into it and pop from it.
  m.def("skip_stash", [](const std::string& ns, const std::string& name, py::handle tensor) {
    skip::current_tracker().stash({ns, name}, tensor.is_none() ? torch::Tensor() : tensor.cast<torch::Tensor>());
  });
  m.def("skip_pop", [](const std::string& ns, const std::string& name) -> py::object {
    torch::Tensor t = skip::current_tracker().pop({ns, name});
    if (!t.defined()) return py::none();
    return py::cast(t);
  });
  m.def("skip_contains", [](const std::string& ns, const std::string& name) {
    return skip::current_tracker().contains({ns, name});
  });

  m.def("min_max_partition", [](const std::vector<double>& costs, int64_t parts) {
    return min_max_partition(costs, parts);
  }, py::arg("costs"), py::arg("parts"));
  m.def("time_costs", [](const std::vector<LayerPtr>& layers, py::handle sample, double budget_s, bool training) {
    torch::nn::Sequential seq = sequential_of(layers, training);
    Batch in = to_batch(sample, "the sample");
    TimeProfileOptions options;
    options.budget = std::chrono::milliseconds(static_cast<int64_t>(budget_s * 1000));
    py::gil_scoped_release release;
    return time_costs(seq, in, options);
  }, py::arg("layers"), py::arg("sample"), py::arg("budget_s"), py::arg("training"));
  m.def("size_costs", [](const std::vector<LayerPtr>& layers, py::handle sample, double param_scale, bool training) {
    torch::nn::Sequential seq = sequential_of(layers, training);
    Batch in = to_batch(sample, "the sample");
    py::gil_scoped_release release;
    return size_costs(seq, in, param_scale);
  }, py::arg("layers"), py::arg("sample"), py::arg("param_scale"), py::arg("training"));
}

}  // namespace pipetrain::python
