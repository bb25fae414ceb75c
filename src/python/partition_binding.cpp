// pipetrain._C's partitioners for the Python front end: DeepSpeed's, over weights Python counted.
#include <torch/extension.h>

#include "pipetrain/partition/deepspeed_partition.h"

namespace pipetrain::python {

void bind_partition(py::module& m) {
  m.def("deepspeed_partition_uniform", &deepspeed_partition_uniform, py::arg("items"), py::arg("parts"),
        "Layers per stage as DeepSpeed's partition_uniform cuts `items` layers");
  m.def("deepspeed_partition_balanced", &deepspeed_partition_balanced, py::arg("weights"), py::arg("parts"),
        "Layers per stage as DeepSpeed's partition_balanced cuts layers of these weights");
}

}  // namespace pipetrain::python
