// A rank of `pipetrain train`, and the example and config both sides derive from the options.
#pragma once

#include "apps/examples/example.h"
#include "apps/train/train_args.h"
#include "pipetrain/engine/config.h"

namespace pipetrain::apps {

examples::Example make_train_example(const TrainArgs& args);
EngineConfig make_train_config(const TrainArgs& args, const examples::Example& example);
int run_train_worker(const TrainArgs& args);

}  // namespace pipetrain::apps
