// The executor refuses what it cannot interpret before running any action.
#include "pipetrain/runtime/stage_executor.h"

#include <gtest/gtest.h>

#include "pipetrain/error.h"

namespace pipetrain::runtime {
namespace {

using schedule::Action;
using schedule::Op;

TEST(StageExecutor, AnUnknownOpIsAScheduleErrorNamingTheAction) {
  schedule::Schedule sched;
  sched.num_micro_batches = 1;
  Action load;
  load.op = Op::load_micro_batch;
  load.micro_batch = 0;
  Action bad = load;
  bad.op = static_cast<Op>(200);  // as a list read from a newer version or corrupt data would hold
  sched.stages = {{load, bad}};
  StageStep step;
  step.schedule = &sched;
  step.clock = [] { return 0.0; };
  try {
    run_stage_step(step);
    FAIL() << "an unknown op must not be skipped";
  } catch (const ScheduleError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("action 1 (0?0)"), std::string::npos) << what;
    EXPECT_NE(what.find("unknown op index 200"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace pipetrain::runtime
