// A layer made from a Python module, as the runtime runs it: native torch::nn modules around the
// Python module's tensors, or the Python module itself (py_layer.h).
#include "layer.h"

#include <torch/csrc/autograd/python_variable.h>

#include <optional>

#include "pipetrain/runtime/checkpoint.h"
#include "pipetrain/runtime/dropout.h"
#include "pipetrain/runtime/rng.h"
#include "py_layer.h"

namespace pipetrain::python {
namespace {

// A torch::nn module whose registered parameters are replaced by tensors that already exist.
// Module::parameters_ is protected, so only a subclass can point an entry elsewhere.
template <typename Impl>
class Adopting : public Impl {
 public:
  using Impl::Impl;
  void adopt(const std::string& name, const torch::Tensor& tensor) { this->parameters_[name] = tensor; }
  // An optional parameter the Python module does not have (Linear(bias=False)): the constructor
  // registers it undefined, and an undefined parameter breaks every loop over parameters().
  void drop(const std::string& name) {
    if (this->parameters_.contains(name)) this->parameters_.erase(name);
  }
};

// A layer that may work in place on its input (a Python module, ReLU or Dropout with
// inplace=True), at the start of a stage or of a checkpointed group. There its input can be a
// leaf that requires grad (a received activation, a recomputed group's input), on which autograd
// refuses in-place ops, or the input a checkpoint saves for recomputation, which an in-place op
// would corrupt. Such an input is copied first; DeepSpeed copies every received activation,
// this only those, and only for such layers. The tensors are the inner module's, under its names.
class InputGuardImpl : public torch::nn::Module, public BatchLayer {
 public:
  explicit InputGuardImpl(torch::nn::AnyModule inner)
      : torch::nn::Module(inner.ptr()->name()), inner_(std::move(inner)) {
    auto& m = *inner_.ptr();
    for (const auto& p : m.named_parameters(false)) register_parameter(p.key(), p.value(), p.value().requires_grad());
    for (const auto& b : m.named_buffers(false)) register_buffer(b.key(), b.value());
    for (const auto& c : m.named_children()) register_module(c.key(), c.value());
  }

  Batch forward_batch(const Batch& input) override {
    const bool checkpoint = runtime::is_checkpointing() || runtime::is_recomputing();
    std::vector<torch::Tensor> values;
    bool copied = false;
    for (const auto& t : input.tensors()) {
      const bool guard = t.defined() && ((t.is_leaf() && t.requires_grad()) || checkpoint);
      values.push_back(guard ? t.clone() : t);
      copied = copied || guard;
    }
    return call_layer(inner_, copied ? input.with(std::move(values)) : input);
  }
  torch::Tensor forward(const torch::Tensor& input) { return forward_batch(Batch(input)).tensor(); }
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    inner_.ptr()->train(on);
  }

 private:
  torch::nn::AnyModule inner_;
};
TORCH_MODULE(InputGuard);

torch::Tensor tensor_of(py::handle value) { return THPVariable_Unpack(value.ptr()); }

LayerPtr make_layer(torch::nn::AnyModule module, py::object source, std::string name, bool native) {
  auto layer = std::make_shared<Layer>();
  layer->module = std::move(module);
  layer->source = PyRef(std::move(source));
  layer->name = std::move(name);
  layer->native = native;
  return layer;
}

LayerPtr linear_layer(py::object source, const std::string& name, py::handle weight, py::handle bias) {
  const torch::Tensor w = tensor_of(weight);
  const std::optional<torch::Tensor> b = bias.is_none() ? std::nullopt : std::optional(tensor_of(bias));
  TORCH_CHECK_VALUE(w.dim() == 2, name, ": a Linear weight must have 2 dimensions, got ", w.sizes());
  std::shared_ptr<Adopting<torch::nn::LinearImpl>> impl;
  {
    // The constructor initialises weights of its own: from a generator put back afterwards, so the
    // caller's random stream does not move.
    runtime::SeededScope untouched(0);
    impl = std::make_shared<Adopting<torch::nn::LinearImpl>>(
        torch::nn::LinearOptions(w.size(1), w.size(0)).bias(b.has_value()));
  }
  impl->weight = w;
  impl->adopt("weight", w);
  if (b) {
    impl->bias = *b;
    impl->adopt("bias", *b);
  } else {
    impl->bias = torch::Tensor();
    impl->drop("bias");
  }
  return make_layer(torch::nn::AnyModule(torch::nn::Linear(std::static_pointer_cast<torch::nn::LinearImpl>(impl))),
                    std::move(source), name, true);
}

template <typename Holder>
LayerPtr stateless_layer(py::object source, const std::string& name, Holder holder) {
  return make_layer(torch::nn::AnyModule(std::move(holder)), std::move(source), name, true);
}

}  // namespace

torch::nn::Sequential sequential_of(const std::vector<LayerPtr>& layers, bool training) {
  torch::nn::Sequential seq;
  for (const auto& layer : layers) seq->push_back(layer->module);
  // Module::train, not PyLayer's override: the Python modules keep the mode they have.
  seq->torch::nn::Module::train(training);
  for (const auto& layer : layers) layer->module.ptr()->torch::nn::Module::train(training);
  return seq;
}

void bind_layers(py::module& m) {
  py::class_<Layer, LayerPtr>(m, "Layer", "A layer as pipetrain's runtime runs it (made by pipetrain._layers).")
      .def_readonly("name", &Layer::name)
      .def_readonly("native", &Layer::native)
      .def_property_readonly("source", [](const Layer& l) { return l.source.get(); })
      .def("__repr__", [](const Layer& l) {
        return "<pipetrain layer " + l.name + (l.native ? " (native)>" : " (Python)>");
      });
  m.def("python_layer", [](py::object module, const std::string& name) {
    auto impl = std::make_shared<PyLayerImpl>(module, name);
    return make_layer(torch::nn::AnyModule(PyLayer(impl)), module, name, false);
  });
  m.def("python_skippable_layer",
        [](py::object module, const std::vector<std::pair<std::string, std::string>>& stash,
           const std::vector<std::pair<std::string, std::string>>& pop, const std::string& name) {
          skip::SkipDeclaration declaration;
          for (const auto& [ns, key] : stash) declaration.stash.push_back({ns, key});
          for (const auto& [ns, key] : pop) declaration.pop.push_back({ns, key});
          auto impl = std::make_shared<PySkippableImpl>(module, std::move(declaration), name);
          return make_layer(torch::nn::AnyModule(PySkippable(impl)), module, name, false);
        });
  m.def("linear_layer", &linear_layer);
  m.def("input_guarded_layer", [](const LayerPtr& layer) {
    auto guarded = std::make_shared<Layer>(*layer);
    guarded->module = torch::nn::AnyModule(InputGuard(layer->module));
    return guarded;
  }, "The layer, copying an input it could not work on in place first (see InputGuardImpl)");
  m.def("relu_layer", [](py::object source, const std::string& name, bool inplace) {
    return stateless_layer(source, name, torch::nn::ReLU(torch::nn::ReLUOptions().inplace(inplace)));
  });
  m.def("gelu_layer", [](py::object source, const std::string& name, const std::string& approximate) {
    return stateless_layer(source, name, torch::nn::GELU(torch::nn::GELUOptions().approximate(approximate)));
  });
  m.def("tanh_layer", [](py::object source, const std::string& name) {
    return stateless_layer(source, name, torch::nn::Tanh());
  });
  m.def("sigmoid_layer", [](py::object source, const std::string& name) {
    return stateless_layer(source, name, torch::nn::Sigmoid());
  });
  m.def("identity_layer", [](py::object source, const std::string& name) {
    return stateless_layer(source, name, torch::nn::Identity());
  });
  m.def("flatten_layer", [](py::object source, const std::string& name, int64_t start, int64_t end) {
    return stateless_layer(source, name, torch::nn::Flatten(torch::nn::FlattenOptions().start_dim(start).end_dim(end)));
  });
  m.def("dropout_layer", [](py::object source, const std::string& name, double p, bool inplace) {
    return stateless_layer(source, name, runtime::Dropout(torch::nn::DropoutOptions(p).inplace(inplace)));
  });
}

}  // namespace pipetrain::python
