// pipetrain._C.Engine: the native PipelineEngine over layer specs made from Python
// (pipetrain/pipe/ is the DeepSpeed-compatible front end around it).
#include <torch/extension.h>

#include <torch/csrc/autograd/python_variable.h>

#include <fmt/format.h>

#include <filesystem>
#include <mutex>

#include "batch_convert.h"
#include "data_iterator.h"
#include "interrupt.h"
#include "layer.h"
#include "pipetrain/comm/rank_info.h"
#include "pipetrain/engine/layer_checkpoint.h"
#include "pipetrain/engine/deepspeed_import.h"
#include "pipetrain/engine/pipeline_engine.h"
#include "pipetrain/error.h"
#include "pipetrain/util/tensorboard.h"

namespace pipetrain::python {
namespace {

// A layer's spec as the Python front end describes it: (name, type, tied key, layer, forward
// function, stash keys, pop keys[, tied parameter names]). `layer` is a Layer (built on this rank), a callable that
// builds one (for partitioning by parameter counts), or None (another rank's layer).
LayerSpec to_spec(py::handle item, size_t index) {
  auto t = item.cast<py::tuple>();
  if (t.size() != 7 && t.size() != 8) throw UsageError("pipetrain._C: a layer spec is a 7- or 8-tuple (internal)");
  LayerSpec spec;
  spec.name = t[0].cast<std::string>();
  spec.type = t[1].cast<std::string>();
  spec.tied_key = t[2].cast<std::string>();
  // The 8th item: the tied key's parameter names (tied_weight_attr); None ties them all.
  if (t.size() == 8 && !t[7].is_none()) spec.tied_params = t[7].cast<std::vector<std::string>>();
  PyRef layer(py::reinterpret_borrow<py::object>(t[3]));
  const std::string where = fmt::format("layer {} ({})", index, spec.name);
  spec.build = [layer, where]() -> torch::nn::AnyModule {
    return with_gil(where + " build", [&]() -> torch::nn::AnyModule {
      py::object value = layer.get();
      if (value.is_none()) {
        throw UsageError(where + " is not built on this rank; the Python PipelineModule and the engine disagree "
                                 "about the partition (internal)");
      }
      if (!py::isinstance<Layer>(value)) value = value();
      return value.cast<LayerPtr>()->module;
    });
  };
  if (!t[4].is_none()) {
    PyRef forward(py::reinterpret_borrow<py::object>(t[4]));
    spec.forward = [forward, layer, where](torch::nn::AnyModule&, const Batch& input) {
      return with_gil(where, [&] {
        py::object module = layer.get();
        if (!py::isinstance<Layer>(module)) throw UsageError(where + ": a tied forward on a layer not built here");
        py::object out = forward.get()(module.cast<LayerPtr>()->source.get(), from_batch(input));
        return to_batch(out, "the output of " + where);
      });
    };
  }
  for (auto key : t[5]) {
    auto p = key.cast<std::pair<std::string, std::string>>();
    spec.skips.stash.push_back({p.first, p.second});
  }
  for (auto key : t[6]) {
    auto p = key.cast<std::pair<std::string, std::string>>();
    spec.skips.pop.push_back({p.first, p.second});
  }
  return spec;
}

std::vector<LayerSpec> to_specs(const py::list& items) {
  std::vector<LayerSpec> specs;
  for (size_t i = 0; i < items.size(); ++i) specs.push_back(to_spec(items[i], i));
  return specs;
}

LossFn make_loss(const std::string& kind, py::object fn) {
  if (kind == "mse") return [](const Batch& out, const Batch& labels) { return torch::mse_loss(out.tensor(), labels.tensor()); };
  if (kind == "cross_entropy") {
    return [](const Batch& out, const Batch& labels) {
      return torch::nn::functional::cross_entropy(out.tensor(), labels.tensor());
    };
  }
  if (kind == "output") return [](const Batch& out, const Batch&) { return out.tensor(); };
  if (kind != "python") throw UsageError("pipetrain._C: unknown loss kind " + kind + " (internal)");
  PyRef loss(std::move(fn));
  return [loss](const Batch& out, const Batch& labels) {
    return with_gil("the loss function", [&] {
      py::object value = loss.get()(from_batch(out), from_batch(labels));
      if (!THPVariable_Check(value.ptr())) {
        throw BatchError("the loss function returned a " + type_name(value) + "; it must return a scalar tensor");
      }
      return value.cast<torch::Tensor>();
    });
  };
}

// Python reads DeepSpeed configs as DeepSpeed does (unknown top-level keys are a warning, which
// check_config hands to Python once; the parses here keep theirs quiet).
EngineConfig read_config(const std::string& config_json) {
  return EngineConfig::from_json_text(config_json, "the DeepSpeed config", ConfigWarnings::DeepSpeed);
}

EngineConfig engine_config(const std::string& config_json, const std::vector<int64_t>& balance, int64_t stages,
                           int64_t checkpoint_interval, bool external_optimizer) {
  EngineConfig config = read_config(config_json);
  config.optimizer.external = external_optimizer;
  config.pipeline.partition_method = "balance";
  config.pipeline.balance = balance;
  config.pipeline.stages = stages;
  if (checkpoint_interval > 0) config.pipeline.activation_checkpoint_interval = checkpoint_interval;
  return config;
}

// One communicator per process: a second engine in the same job reuses the rendezvous.
// The process's connection to its peers, made by its first engine and kept until Python exits
// (release_communicator, from atexit): a later engine of the same process reuses it. Connecting
// again instead would race the peers' old rendezvous on the same port.
std::mutex communicator_mutex;
std::shared_ptr<comm::Communicator> communicator;

std::shared_ptr<comm::Communicator> process_communicator(const EngineConfig& config) {
  std::lock_guard<std::mutex> lock(communicator_mutex);
  if (!communicator) communicator = PipelineEngine::connect_from_env(config);
  return communicator;
}

void release_communicator() {
  std::shared_ptr<comm::Communicator> last;
  {
    std::lock_guard<std::mutex> lock(communicator_mutex);
    last = std::move(communicator);
  }
  py::gil_scoped_release release;  // saying goodbye waits for the sends still in flight
  last.reset();
}

class NativeEngine {
 public:
  NativeEngine(const py::list& specs, const std::string& loss_kind, py::object loss, const std::string& config_json,
               const std::vector<int64_t>& balance, int64_t stages, int64_t checkpoint_interval,
               bool external_optimizer) {
    EngineConfig config = engine_config(config_json, balance, stages, checkpoint_interval, external_optimizer);
    PipelineModule module;
    module.layers = to_specs(specs);
    module.loss = make_loss(loss_kind, std::move(loss));
    module.num_stages = stages;
    py::gil_scoped_release release;  // the rendezvous waits for the other ranks; builds call back
    comm_ = process_communicator(config);
    engine_ = std::make_unique<PipelineEngine>(std::move(module), std::move(config), comm_);
  }

  ~NativeEngine() {
    py::gil_scoped_release release;  // groups may wait for their peers on the way out
    engine_.reset();
  }

  double train_batch(py::object iterator) {
    auto data = std::make_shared<PyDataIterator>(std::move(iterator));
    return interruptible([this, data] { return engine_->train_batch(*data); }, interrupter());  // Ctrl-C
  }

  py::tuple eval_batch(py::object iterator, bool return_outputs, int micro_batches) {
    auto data = std::make_shared<PyDataIterator>(std::move(iterator));
    EvalResult result = interruptible(
        [this, data, return_outputs, micro_batches] { return engine_->eval_batch(*data, return_outputs, micro_batches); },
        interrupter());
    py::list outputs;
    for (const auto& b : result.outputs) outputs.append(from_batch(b));
    py::list labels;  // for the per-micro-batch losses of eval_batch(reduce_output=None)
    for (const auto& b : result.labels) labels.append(from_batch(b));
    return py::make_tuple(result.loss, outputs, labels);
  }

  // Returns the tag written; without `save_latest` the `latest` pointer stays where it was.
  std::string save(const std::string& dir, const std::string& tag, const std::string& extra, bool save_latest) {
    py::gil_scoped_release release;
    if (save_latest) return save_tagged_checkpoint(*engine_, dir, tag, extra);
    const std::string name = tag.empty() ? fmt::format("global_step{}", engine_->global_steps()) : tag;
    if (name == "." || name == ".." || name.find('/') != std::string::npos) {
      throw CheckpointError("checkpoint tag \"" + name + "\" must be a plain directory name (no '/', not '.' or '..')");
    }
    std::filesystem::create_directories(dir);
    save_checkpoint(*engine_, (std::filesystem::path(dir) / name).string(), extra);  // collective
    return name;
  }

  // (directory read, step, manifest "extra" as JSON text or ""): the native side alone reads
  // the manifest, including when it fell back to <tag>.old.
  py::tuple load(const std::string& dir, const std::string& tag, bool strict, bool optimizer_states,
                 bool module_only) {
    CheckpointLoadOptions options;
    options.strict = strict;
    options.optimizer_states = optimizer_states;
    options.module_only = module_only;
    LoadedCheckpoint loaded;
    {
      py::gil_scoped_release release;
      loaded = load_tagged_checkpoint(*engine_, dir, tag, options);
    }
    return py::make_tuple(loaded.dir, loaded.step, loaded.extra);
  }

  // A checkpoint DeepSpeed wrote (layer_XX-model_states.pt): this rank's layers; returns the tag
  // directory read.
  std::string load_deepspeed(const std::string& dir) {
    py::gil_scoped_release release;
    return load_deepspeed_checkpoint(*engine_, dir);
  }

  py::dict last_step() const {
    const StepStats& s = engine_->last_step();
    py::dict d;
    d["step"] = s.step;
    d["loss"] = s.loss;
    d["grad_norm"] = s.grad_norm;
    d["lr"] = s.lr;
    d["seconds"] = s.seconds;
    d["samples_per_s"] = s.samples_per_s;
    d["skipped"] = s.skipped;
    d["loss_scale"] = s.loss_scale;
    d["bytes_sent"] = s.bytes_sent;
    return d;
  }

  PipelineEngine& engine() { return *engine_; }

  // What Ctrl-C does to a running step: this rank's waits fail and the peers are told (interrupt.h).
  std::function<void()> interrupter() {
    return [comm = comm_] { comm->interrupt("it was interrupted (KeyboardInterrupt)"); };
  }

 private:
  std::shared_ptr<comm::Communicator> comm_;
  std::unique_ptr<PipelineEngine> engine_;
};

}  // namespace

void bind_engine(py::module& m) {
  m.def("rank_info", [] {
    const auto info = comm::rank_info_from_env();
    return py::make_tuple(info.rank, info.world_size, info.local_rank, info.local_world_size);
  }, "(rank, world_size, local_rank, local_world_size) as the launcher's environment gives them");
  m.def("partition_layers", [](const py::list& specs, const std::string& method, std::vector<int64_t> balance,
                               int64_t parts) {
    PipelineConfig pipeline;
    pipeline.partition_method = method;
    pipeline.balance = std::move(balance);
    return partition_layers(to_specs(specs), pipeline, parts);
  }, py::arg("specs"), py::arg("method"), py::arg("balance"), py::arg("parts"));
  m.def("train_layout", [](const std::string& config_json, int stages, int64_t replicas) {
    EngineConfig config = read_config(config_json);
    // The schedule depends on the micro-batch count, which DeepSpeed derives from the others.
    config.resolve_batch_sizes(replicas);
    const auto layout = train_schedule_for(config, stages).layout;
    std::vector<std::vector<int>> virtual_stages(static_cast<size_t>(stages));
    for (int s = 0; s < stages; ++s) {
      for (int c = 0; c < layout.num_chunks(); ++c) virtual_stages[static_cast<size_t>(s)].push_back(layout.virtual_stage(s, c));
    }
    return virtual_stages;
  }, "For each stage, the virtual stages (parts of the layer list) it holds under the config's schedule");
  m.def("release_communicator", &release_communicator,
        "Drops the process's connection to its peers (at exit; a later engine connects again)");
  m.def("latest_tag", &latest_tag, "The tag <save_dir>/latest names, or \"\" when there is none");
  m.def("check_config", [](const std::string& config_json) { return read_config(config_json).warnings; },
        "The warnings of a DeepSpeed config (ConfigError when it cannot run)");
  m.def("is_deepspeed_checkpoint", [](const std::string& dir) {
    try {
      deepspeed_tag_dir(dir);
      return true;
    } catch (const CheckpointError&) {
      return false;
    }
  }, "Whether `dir` (a tag directory, or its parent with `latest`) holds DeepSpeed layer files");

  py::class_<util::TensorBoardWriter>(m, "TensorBoardWriter", "TensorBoard event files (the config's tensorboard)")
      .def(py::init<const std::string&>(), py::arg("dir"))
      .def("add_scalar", py::overload_cast<const std::string&, double, int64_t>(&util::TensorBoardWriter::add_scalar))
      .def("flush", &util::TensorBoardWriter::flush)
      .def_property_readonly("path", [](const util::TensorBoardWriter& w) { return w.path().string(); });

  py::class_<NativeEngine>(m, "Engine", "The native PipelineEngine (see pipetrain.initialize).")
      .def(py::init<const py::list&, const std::string&, py::object, const std::string&, const std::vector<int64_t>&,
                    int64_t, int64_t, bool>(),
           py::arg("specs"), py::arg("loss_kind"), py::arg("loss"), py::arg("config"), py::arg("balance"),
           py::arg("stages"), py::arg("checkpoint_interval"), py::arg("external_optimizer") = false)
      .def("train_batch", &NativeEngine::train_batch)
      .def("eval_batch", &NativeEngine::eval_batch, py::arg("iterator"), py::arg("return_outputs"),
           py::arg("micro_batches"))
      .def("save", &NativeEngine::save)
      .def("load", &NativeEngine::load, py::arg("dir"), py::arg("tag"), py::arg("strict") = true,
           py::arg("optimizer_states") = true, py::arg("module_only") = false)
      .def("load_deepspeed", &NativeEngine::load_deepspeed)
      .def("last_step", &NativeEngine::last_step)
      .def_property_readonly("stage", [](NativeEngine& e) { return e.engine().stage(); })
      .def_property_readonly("num_stages", [](NativeEngine& e) { return e.engine().num_stages(); })
      .def_property_readonly("device", [](NativeEngine& e) { return e.engine().device().str(); })
      .def_property_readonly("local_rank", [](NativeEngine& e) { return e.engine().communicator().local_rank(); })
      .def_property_readonly("replica", [](NativeEngine& e) { return e.engine().replica(); })
      .def_property_readonly("num_replicas", [](NativeEngine& e) { return e.engine().num_replicas(); })
      .def_property_readonly("rank", [](NativeEngine& e) { return e.engine().communicator().rank(); })
      .def_property_readonly("world_size", [](NativeEngine& e) { return e.engine().communicator().world_size(); })
      .def_property_readonly("micro_batches", [](NativeEngine& e) { return e.engine().micro_batches(); })
      .def_property_readonly("global_steps", [](NativeEngine& e) { return e.engine().global_steps(); })
      .def("set_global_steps", [](NativeEngine& e, int64_t s) { e.engine().set_global_steps(s); })
      .def("set_scheduler_start", [](NativeEngine& e, int64_t s) { e.engine().set_scheduler_start(s); })
      .def_property_readonly("next_lr", [](NativeEngine& e) { return e.engine().next_lr(); })
      .def("set_gradient_accumulation_steps",
           [](NativeEngine& e, int64_t s) { e.engine().set_gradient_accumulation_steps(s); })
      .def_property_readonly("balance", [](NativeEngine& e) { return e.engine().balance(); })
      .def_property_readonly("config", [](NativeEngine& e) { return e.engine().config().to_json_text(); })
      .def_property_readonly("train_micro_batch_size",
                             [](NativeEngine& e) { return e.engine().config().train_micro_batch_size_per_gpu; })
      .def_property_readonly("train_batch_size", [](NativeEngine& e) { return e.engine().config().train_batch_size; })
      .def_property_readonly("schedule", [](NativeEngine& e) { return e.engine().config().pipeline.schedule; })
      .def_property_readonly("precision", [](NativeEngine& e) { return e.engine().config().precision(); })
      .def_property_readonly("loss_scale", [](NativeEngine& e) { return e.engine().loss_scale(); })
      .def("parameters", [](NativeEngine& e) { return e.engine().parameters(); })
      .def("parameters_changed", [](NativeEngine& e) { e.engine().parameters_changed(); })
      .def("local_layer_indices", [](NativeEngine& e) {
        std::vector<int64_t> out;
        for (const auto& [index, module] : e.engine().local_layers()) out.push_back(index);
        return out;
      });
}

}  // namespace pipetrain::python
