// EnergyMonitor (energy/monitor.hpp) on a FakeClock and the fake NVML: its windows follow the
// injected clock, so a test advances time by a window's length instead of waiting for it.
#include "energy/monitor.hpp"

#include <doctest/doctest.h>

#include <stdlib.h>

#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "energy/simulated_nvml/simulated_nvml_state.hpp"
#include "gpurun/clock.hpp"
#include "gpurun_process.hpp"
#include "supervisor/event_log.hpp"

namespace fake = gpurun::energy::simulated_nvml;
using namespace std::chrono_literals;
using gpurun::energy::EnergyMonitor;
using gpurun::energy::MonitorOptions;

namespace {

/// One fake H200 and the monitor's view of it.
struct MonitoredFakeGpu {
  gpurun::testing::TempDir dir{"gpurun-monitor"};
  std::string path = (dir.path / "state").string();
  std::unique_ptr<gpurun::energy::Nvml> nvml;
  std::vector<gpurun::energy::MonitoredGpu> gpus;
  MonitoredFakeGpu() {
    fake::write_state(path, fake::h200s(1, fake::unix_now()));
    ::setenv("GPURUN_NVML_LIBRARY", GPURUN_FAKE_NVML, 1);
    ::setenv("GPURUN_FAKE_NVML_STATE", path.c_str(), 1);
    std::string why_not;
    nvml = gpurun::energy::Nvml::open(why_not);
    REQUIRE_MESSAGE(nvml != nullptr, why_not);
    gpurun::energy::MonitoredGpu g;
    g.slot = 0;
    g.device = nvml->device_by_index(0);
    g.uuid = nvml->uuid(g.device);
    g.name = nvml->name(g.device);
    std::tie(g.min_limit_mw, g.max_limit_mw) = nvml->power_limit_constraints_mw(g.device);
    gpus.push_back(g);
  }
};

bool has(const std::string& record, const std::string& part) {
  return record.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("energy monitor: a window ends every `window` of its clock unless a boundary did") {
  MonitoredFakeGpu gpu;
  gpurun::FakeClock clock;
  std::vector<std::string> windows;  // the "energy" records, in order
  gpurun::supervisor::EventLog events;
  events.set_observer([&windows](std::string_view event, const std::string& record) {
    if (event == "energy") windows.push_back(record);
  });
  boost::asio::io_context io;  // never run: the timers are the FakeClock's
  MonitorOptions mo;
  mo.window = 60s;
  mo.clock = &clock;
  EnergyMonitor monitor(
      io, events, [](const std::string&) {}, std::move(gpu.nvml), gpu.gpus, mo, nullptr);
  monitor.set_active({0}, 0);
  clock.advance(60s - 1ms);
  CHECK(windows.empty());
  clock.advance(1ms);
  REQUIRE(windows.size() == 1);
  CHECK_MESSAGE(has(windows[0], R"("kind": "time")"), windows[0]);
  CHECK_MESSAGE(has(windows[0], R"("seconds": 60,)"), windows[0]);
  // A boundary at 90 s ends the next window; the timer at 120 s finds a window 30 s old and
  // leaves it open; the one at 180 s ends it, 90 s old.
  clock.advance(30s);
  monitor.close_window(clock.unix_seconds(), "epoch", 0, 0, 0);
  REQUIRE(windows.size() == 2);
  CHECK_MESSAGE(has(windows[1], R"("kind": "epoch")"), windows[1]);
  CHECK_MESSAGE(has(windows[1], R"("seconds": 30,)"), windows[1]);
  clock.advance(89s);
  CHECK(windows.size() == 2);
  clock.advance(1s);
  REQUIRE(windows.size() == 3);
  CHECK_MESSAGE(has(windows[2], R"("kind": "time")"), windows[2]);
  CHECK_MESSAGE(has(windows[2], R"("seconds": 90,)"), windows[2]);
  // Once finished, no timer is left and time ends no window.
  monitor.finish(0);
  const size_t after_finish = windows.size();
  CHECK(clock.pending() == 0);
  clock.advance(10min);
  CHECK(windows.size() == after_finish);
}
