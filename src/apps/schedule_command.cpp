// `pipetrain schedule`: print a generated schedule's action lists as text or JSON.
#include <iostream>
#include <memory>

#include "apps/schedule_commands.h"
#include "pipetrain/error.h"
#include "pipetrain/schedule/format.h"
#include "pipetrain/schedule/torch_csv.h"

namespace pipetrain::apps {

void add_schedule_command(CLI::App& app, int& exit_code) {
  auto* command = app.add_subcommand(
      "schedule", "print the per-stage action lists of a pipeline schedule (validated)");
  auto args = std::make_shared<ScheduleArgs>();
  args->add_to(*command);
  command->callback([command, args, &exit_code] {
    exit_code = run_command("schedule", kScheduleUsage, [&] {
      reject_extras(*command);
      const schedule::Schedule s = args->generate();
      const int only = args->only_stage(s.num_stages()).value_or(-1);
      if (args->csv() && only >= 0)
        throw ConfigError("--format csv writes every rank's row; drop --stage");
      if (args->csv())
        std::cout << schedule::to_torch_csv(s, args->with_comm);
      else if (args->json())
        std::cout << schedule::to_json(s, only) << "\n";
      else
        std::cout << schedule::format_text(s, only);
    });
  });
}

}  // namespace pipetrain::apps
