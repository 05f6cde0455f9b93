// gpurun — torchrun-compatible launcher that hosts the TCPStore and supervises
// one node's workers. Reference: docs/cli.md; error policy: docs/errors.md.
#include <signal.h>

#include <chrono>
#include <optional>
#include <variant>

#include "app/job.hpp"
#include "app/launch_plan.hpp"
#include "commands/subcommands.hpp"
#include "supervisor/console_writer.hpp"

using namespace gpurun::app;

namespace {

namespace sv = gpurun::supervisor;

int run(int argc, char** argv) {
  // A vanished console reader must not kill the supervisor (workers reset this), nor a file
  // size limit (RLIMIT_FSIZE): a log write then fails with EFBIG, which gpurun reports.
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGXFSZ, SIG_IGN);

  if (const std::optional<int> code = gpurun::commands::run_subcommand(argc, argv)) return *code;

  // gpurun's own output goes through writer threads: a console nobody reads (a paused pager,
  // Ctrl-S) never stalls supervision, heartbeats or signal handling (docs/cli.md#console).
  sv::ConsoleWriter console_writer({});
  sv::ConsoleWriter::install(&console_writer);

  const std::variant<Launch, int> prepared = prepare_launch(argc, argv);
  if (const int* code = std::get_if<int>(&prepared)) return *code;
  int code = 0;
  {
    Job job(std::get<Launch>(prepared), console_writer);
    code = job.run();
  }
  // The console's last lines: as long as its reader takes, or 2 s after a stop signal.
  console_writer.drain_at_exit(std::chrono::seconds(2));
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  return run(argc, argv);
}
