// Reading the pickle that torch.save writes for a state dict, strictly and without Python.
//
// LibTorch's own unpickler trusts its input: a damaged pickle (one opcode changed) can make it
// pop an empty stack and crash the process. This reader knows only what a state dict needs and
// checks every step, so a damaged or hostile file is a CheckpointError naming it:
//
//   OrderedDict(name -> _rebuild_tensor_v2(persistent storage, offset, size, stride, ...))
//
// Opcodes: protocols 2 to 5 as torch.save uses them (MARK, GLOBAL, REDUCE, BUILD, BINPERSID, the
// memo, ints, floats, strings, tuples, lists and dicts). Callables: collections.OrderedDict,
// torch._utils._rebuild_tensor_v2 and _rebuild_parameter(_with_state); a dict's BUILD state
// (state_dict()'s _metadata) is read and dropped. Storages: torch.<Type>Storage of the dtypes
// pipetrain sends, read from the archive's record data/<key>, on the CPU whatever their location.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace pipetrain::detail {

// The bytes of the archive's storage record `key`; throws when there is none.
using StorageRecords = std::function<std::pair<at::DataPtr, size_t>(const std::string& key)>;

// The state dict in `pickle` (data.pkl of a torch.save archive), its entries in file order.
// `path` names the file in errors (CheckpointError).
std::vector<std::pair<std::string, torch::Tensor>> read_pickled_state_dict(const std::string& pickle,
                                                                           const StorageRecords& records,
                                                                           const std::string& path);

}  // namespace pipetrain::detail
