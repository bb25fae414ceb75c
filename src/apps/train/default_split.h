// The split `pipetrain train` runs with when the user gives none: the example's layers profiled
// once, in the launching process before any rank starts (so every rank gets the same split on
// its command line), then choose_split over the candidate micro-batch counts.
#pragma once

#include <string>

#include "apps/examples/example.h"
#include "apps/train/train_args.h"
#include "pipetrain/engine/config.h"

namespace pipetrain::apps {

// Sets args.balance and (unless given) args.micro_batches / micro_batch_size to the chosen
// split, keeping the step's rows; returns the summary's one line saying which split and why.
// Leaves the arguments as they are where the user chose (--balance, --plan, a config that names
// partition_method or batch sizes) or where layers cannot be profiled (tensor-parallel), and
// says so in the line. `config` is make_train_config's for the arguments as given.
std::string choose_train_split(TrainArgs& args, const examples::Example& ex, const EngineConfig& config, int processes);

}  // namespace pipetrain::apps
