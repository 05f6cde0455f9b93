// `gpurun report EVENTS.jsonl [-o OUT.png] [--title T]`: reads a gpurun event log and draws,
// per epoch, time, energy per GPU and in total, active GPUs, Zeus' cost and — when the run
// profiled power limits — the power-limit profile, with gnuplot (Debian's gnuplot-nox).
// Event schema: docs/energy.md#events.
#pragma once

#include <string>
#include <vector>

namespace gpurun::report {

/// The subcommand (args after "report"). Prints errors as "gpurun report: error: ..." on
/// stderr. Returns 0 on success, 1 when the log has no energy events or gnuplot fails (the
/// message says which), 2 for a bad command line. Blocks while gnuplot runs.
int report_command(const std::vector<std::string>& args);

}  // namespace gpurun::report
