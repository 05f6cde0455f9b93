#include "commands/subcommands.hpp"

#include <string>
#include <string_view>
#include <vector>

#include "commands/policy_command.hpp"
#include "commands/status_command.hpp"
#include "energy/power_guard.hpp"
#include "report/report.hpp"

namespace gpurun::commands {

std::optional<int> run_subcommand(int argc, char** argv) {
  if (argc < 2) return std::nullopt;
  const std::string_view name = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (name == "status") return status_command(args);
  if (name == "lend") return lend_command(args);
  if (name == "reclaim") return reclaim_command(args);
  if (name == "set") return set_command(args);
  if (name == "report") return report::report_command(args);
  // The power-limit guard helper gpurun starts for itself (docs/energy.md#power-limits).
  if (name == "__power-guard") return energy::power_guard_main();
  return std::nullopt;
}

}  // namespace gpurun::commands
