#include "app/subcommands.hpp"

#include <string>
#include <string_view>
#include <vector>

#include "control/policy_command.hpp"
#include "control/status.hpp"
#include "energy/power_guard.hpp"
#include "report/report.hpp"

namespace gpurun::app {

std::optional<int> run_subcommand(int argc, char** argv) {
  if (argc < 2) return std::nullopt;
  const std::string_view name = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (name == "status") return control::status_command(args);
  if (name == "lend") return control::lend_command(args);
  if (name == "reclaim") return control::reclaim_command(args);
  if (name == "set") return control::set_command(args);
  if (name == "report") return report::report_command(args);
  // The power-limit guard helper gpurun starts for itself (docs/energy.md#power-limits).
  if (name == "__power-guard") return energy::power_guard_main();
  return std::nullopt;
}

}  // namespace gpurun::app
