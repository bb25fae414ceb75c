// Micro-batches: scatter a mini-batch into chunks along dim 0 and gather them back.
#include "pipetrain/batch/microbatch.h"

#include "pipetrain/error.h"

namespace pipetrain {

std::vector<Batch> scatter(const Batch& input, int64_t chunks) {
  if (chunks <= 0) {
    throw BatchError("cannot scatter into " + std::to_string(chunks) +
                     " chunks; the number of chunks must be positive");
  }
  if (input.empty()) throw BatchError("cannot scatter an empty tuple; pass at least one tensor");
  const auto& values = input.tensors();
  for (size_t k = 0; k < values.size(); ++k) {
    if (values[k].dim() == 0) {
      throw BatchError("cannot scatter " + input.describe() + ": value " + std::to_string(k) +
                       " is a 0-dimensional tensor; micro-batches split dim 0, so every value "
                       "needs a batch dimension");
    }
    if (values[k].size(0) != values[0].size(0)) {
      throw BatchError("cannot scatter " + input.describe() + ": value " + std::to_string(k) +
                       " has " + std::to_string(values[k].size(0)) + " rows but value 0 has " +
                       std::to_string(values[0].size(0)) +
                       "; every value of a tuple needs the same batch size");
    }
  }
  std::vector<std::vector<torch::Tensor>> split;
  for (const auto& t : values) split.push_back(t.chunk(chunks, 0));
  const size_t count = split.front().size();
  std::vector<Batch> parts;
  parts.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    std::vector<torch::Tensor> part;
    part.reserve(split.size());
    for (auto& s : split) part.push_back(s[i]);
    parts.push_back(input.with(std::move(part)));
  }
  return parts;
}

Batch gather(const std::vector<Batch>& parts) {
  if (parts.empty()) throw BatchError("cannot gather zero micro-batches");
  const Batch& first = parts.front();
  std::vector<std::vector<torch::Tensor>> columns(first.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].atomic() != first.atomic() || parts[i].size() != first.size()) {
      throw BatchError("cannot gather micro-batch " + std::to_string(i) + " " +
                       parts[i].describe() + " with micro-batch 0 " + first.describe() +
                       "; every micro-batch must have the same kind and number of values");
    }
    for (size_t k = 0; k < first.size(); ++k) columns[k].push_back(parts[i][k]);
  }
  std::vector<torch::Tensor> out;
  out.reserve(columns.size());
  for (auto& column : columns) {
    out.push_back(column.size() == 1 ? column.front() : torch::cat(column, 0));
  }
  return first.with(std::move(out));
}

}  // namespace pipetrain
