// Files of a training run directory that are drawn from its metrics.
#pragma once

#include <filesystem>
#include <string>

namespace pipetrain::apps {

// Reads metrics.jsonl and writes an SVG with the loss per step (and the evaluation metric
// where it was measured) as polylines.
void write_loss_curve(const std::filesystem::path& metrics, const std::filesystem::path& svg,
                      const std::string& title, const std::string& metric);

}  // namespace pipetrain::apps
