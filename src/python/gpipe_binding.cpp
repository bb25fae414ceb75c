// pipetrain._C.GPipe: the native GPipe over layers made from a Python nn.Sequential
// (pipetrain/gpipe.py is the torchgpipe-compatible module around it).
#include <torch/extension.h>

#include "batch_convert.h"
#include "interrupt.h"
#include "layer.h"
#include "pipetrain/engine/gpipe.h"
#include "pipetrain/error.h"

namespace pipetrain::python {
namespace {

Checkpoint checkpoint_mode(const std::string& mode) {
  if (mode == "always") return Checkpoint::Always;
  if (mode == "except_last") return Checkpoint::ExceptLast;
  if (mode == "never") return Checkpoint::Never;
  throw ConfigError("checkpoint is '" + mode + "'; expected one of 'always', 'except_last', or 'never'");
}

class NativeGPipe {
 public:
  NativeGPipe(std::vector<LayerPtr> layers, std::vector<int64_t> balance, const std::vector<std::string>& devices,
              int64_t chunks, const std::string& checkpoint, bool training, double task_timeout,
              int64_t intra_op_threads, bool deferred_linear)
      : layers_(std::move(layers)), training_(training) {
    std::vector<torch::Device> devs;
    for (const auto& d : devices) devs.emplace_back(d);
    auto options = GPipeOptions(std::move(balance))
                       .chunks(chunks)
                       .checkpoint(checkpoint_mode(checkpoint))
                       .devices(devs)
                       .task_timeout(task_timeout)
                       .intra_op_threads(intra_op_threads)
                       .deferred_linear(deferred_linear);
    gpipe_ = GPipe(sequential_of(layers_, training), options);
  }

  // Python frees the model under the GIL, and a worker may still be finishing a task that
  // failed or timed out (a Python layer waiting for the GIL): joining it with the GIL held
  // would never return.
  ~NativeGPipe() {
    py::gil_scoped_release release;
    gpipe_ = nullptr;
  }
  NativeGPipe(const NativeGPipe&) = delete;
  NativeGPipe& operator=(const NativeGPipe&) = delete;

  py::object forward(py::handle input, bool training) {
    if (training != training_) {
      // GPipe's own flag decides checkpointing; the layers' flags drive dropout and batch norm.
      gpipe_->train(training);
      training_ = training;
    }
    Batch in = to_batch(input, "the input");
    // The partitions' workers take the GIL for Python layers; Ctrl-C interrupts them (interrupt.h).
    Batch out = interruptible([gpipe = gpipe_, in]() mutable { return gpipe->forward_batch(in); }, nullptr);
    return from_batch(out);
  }

  std::string chrome_trace() const { return gpipe_->chrome_trace(); }
  std::pair<double, double> last_step_bubble() const {
    const auto bubble = gpipe_->last_step_bubble();
    return {bubble.measured, bubble.simulated};
  }
  // (partition, op, micro-batch, start, end) per task of the last step.
  std::vector<std::tuple<int, std::string, int, double, double>> last_step_events() const {
    std::vector<std::tuple<int, std::string, int, double, double>> out;
    for (const auto& e : gpipe_->last_step_events()) {
      out.emplace_back(e.stage, schedule::op_name(e.op), e.micro_batch, e.start, e.end);
    }
    return out;
  }

  std::vector<std::string> devices() const {
    std::vector<std::string> out;
    for (const auto& d : gpipe_->devices()) out.push_back(d.str());
    return out;
  }

 private:
  std::vector<LayerPtr> layers_;
  GPipe gpipe_{nullptr};
  bool training_;
};

}  // namespace

void bind_gpipe(py::module& m) {
  py::class_<NativeGPipe>(m, "GPipe", "The native GPipe runtime over pipetrain layers (see pipetrain.GPipe).")
      .def(py::init<std::vector<LayerPtr>, std::vector<int64_t>, const std::vector<std::string>&, int64_t,
                    const std::string&, bool, double, int64_t, bool>(),
           py::arg("layers"), py::arg("balance"), py::arg("devices"), py::arg("chunks"), py::arg("checkpoint"),
           py::arg("training"), py::arg("task_timeout"), py::arg("intra_op_threads"), py::arg("deferred_linear"))
      .def("forward", &NativeGPipe::forward, py::arg("input"), py::arg("training"))
      .def_property_readonly("devices", &NativeGPipe::devices)
      .def("chrome_trace", &NativeGPipe::chrome_trace)
      .def("last_step_bubble", &NativeGPipe::last_step_bubble)
      .def("last_step_events", &NativeGPipe::last_step_events);
}

}  // namespace pipetrain::python
