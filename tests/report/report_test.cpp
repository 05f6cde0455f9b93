#include "report/report.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gpurun_process.hpp"

// Runs the real gpurun binary's `report` subcommand on the hand-written event logs of
// tests/report/fixtures and checks its exit status, its stdout table and the PNG it writes.
// The PNG tests need gnuplot (scripts/setup.sh installs gnuplot-nox): without it they fail.

namespace fs = std::filesystem;
using gpurun::testing::ChildProcess;
using gpurun::testing::TempDir;

namespace {

const fs::path kFixtures = GPURUN_REPORT_FIXTURES;

struct Result {
  int code;
  std::string out, err;
};

Result report(const TempDir& dir, std::vector<std::string> args,
              const std::map<std::string, std::string>& env = {}) {
  args.insert(args.begin(), {GPURUN_BINARY, "report"});
  ChildProcess p(args, env, dir.path / "stdout.txt", dir.path / "stderr.txt");
  REQUIRE(p.wait(std::chrono::seconds(90)));
  return {p.code(), p.stdout_text(), p.stderr_text()};
}

std::string fixture(const char* name) {
  return (kFixtures / name).string();
}

struct Png {
  bool signature_ok = false;
  uint32_t width = 0, height = 0;
};

/// The 8-byte PNG signature, then the IHDR chunk (length 13) with big-endian width, height.
Png read_png(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::array<unsigned char, 24> b{};
  in.read(reinterpret_cast<char*>(b.data()), b.size());
  Png png;
  if (in.gcount() != static_cast<std::streamsize>(b.size())) return png;
  const std::array<unsigned char, 8> sig{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  png.signature_ok = std::equal(sig.begin(), sig.end(), b.begin()) && b[12] == 'I' &&
                     b[13] == 'H' && b[14] == 'D' && b[15] == 'R';
  auto be32 = [&](int at) {
    return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) |
           uint32_t{b[at + 3]};
  };
  png.width = be32(16);
  png.height = be32(20);
  return png;
}

/// The stdout line of the table that starts with the row label `label` (after padding).
std::string row(const std::string& out, const std::string& label) {
  size_t pos = 0;
  while (pos < out.size()) {
    const size_t end = out.find('\n', pos);
    const std::string line = out.substr(pos, end == std::string::npos ? end : end - pos);
    const size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos && line.compare(first, label.size() + 1, label + " ") == 0)
      return line;
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return "<no row " + label + ">";
}

}  // namespace

TEST_CASE("report: a shrink from 2 GPUs to 1 and back, with a PNG of the requested size") {
  TempDir dir("gpurun-report");
  const auto png = dir.path / "run.png";
  auto r = report(dir, {fixture("shrink_grow.jsonl"), "-o", png.string(), "--size", "800x600"});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  const Png p = read_png(png);
  CHECK(p.signature_ok);
  CHECK(p.width == 800);
  CHECK(p.height == 600);
  // Header: 3 epochs over slots 0 and 1; 141 s, 43600 J, cost 55100 in total.
  CHECK(r.out.find("3 epochs, GPU slots [0,1], 141.0 s, 43600.0 J, cost 55100.0") !=
        std::string::npos);
  // epoch, time, energy, gpu0, gpu1, active, power, cost, cost total; slot 1 parked in epoch 2.
  CHECK(row(r.out, "1") ==
        "     1      40.0     15600.0     8000.0     7600.0    2.00     390.0     19800.0     "
        "19800.0");
  CHECK(row(r.out, "2") ==
        "     2      60.0     12000.0    12000.0          -    1.00     200.0     15000.0     "
        "34800.0");
  CHECK(row(r.out, "3") ==
        "     3      41.0     16000.0     8200.0     7800.0    2.00     390.2     20300.0     "
        "55100.0");
  // The `energy` windows of kind "epoch" duplicate the energy_epoch rows: not listed twice.
  CHECK(r.out.find("window") == std::string::npos);
  CHECK(r.out.find("early stop") == std::string::npos);
  CHECK(r.out.find("wrote " + png.string()) != std::string::npos);
}

TEST_CASE("report: the default output is EVENTS with .png, and the default size") {
  TempDir dir("gpurun-report");
  const auto events = dir.path / "my-run.jsonl";
  fs::copy_file(fixture("shrink_grow.jsonl"), events);
  auto r = report(dir, {events.string()});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  const Png p = read_png(dir.path / "my-run.png");
  CHECK(p.signature_ok);
  CHECK(p.width == 1200);
  CHECK(p.height == 900);
}

TEST_CASE("report: a power-limit profile and an early stop") {
  TempDir dir("gpurun-report");
  const auto png = dir.path / "p.png";
  auto r = report(dir, {fixture("profile_early_stop.jsonl"), "--output=" + png.string(), "--title",
                        "H200 \"profile\" run", "--size=1000x1100"});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  const Png p = read_png(png);
  CHECK(p.signature_ok);
  CHECK(p.width == 1000);
  CHECK(p.height == 1100);
  CHECK(row(r.out, "3").find("27200.0     82550.0  <- early stop") != std::string::npos);
  CHECK(row(r.out, "2").find("<- early stop") == std::string::npos);
  CHECK(r.out.find("early stop after epoch 3: cost_total + predicted_next_cost 109750 exceeds") !=
        std::string::npos);
  CHECK(r.out.find("cost threshold: 100000.0") != std::string::npos);
  // The profile table: 4 limits, 250 W chosen by the profiler ("profiling" trials and the
  // final "restore" to 300 W do not count as the choice).
  CHECK(r.out.find("power-limit profile (4 limits, chosen 250 W from profile)") !=
        std::string::npos);
  CHECK(row(r.out, "250") == "       250      9.60          490.0          56.77  <- chosen");
  CHECK(row(r.out, "150") == "       150      6.00          298.0          74.83");
}

TEST_CASE("report: scale = \"auto\": the GPU-count profile in the table and a panel more") {
  // A CPU run of energy_worker on 4 fake GPUs (tests/energy), its energy and scale events.
  TempDir dir("gpurun-report");
  const auto png = dir.path / "s.png";
  auto r = report(dir, {fixture("scale_auto.jsonl"), "-o", png.string()});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("GPU-count profile (scale = auto, 4 measurements, chosen 2 GPUs)") !=
        std::string::npos);
  CHECK(row(r.out, "2").find("<- chosen") == std::string::npos);  // epoch 2's row: no mark
  CHECK(r.out.find("    2             0.52              621.6           1036.0  <- chosen") !=
        std::string::npos);
  CHECK(r.out.find("    1             0.97              583.2           1652.4\n") !=
        std::string::npos);
  const Png p = read_png(png);
  CHECK(p.signature_ok);
  CHECK(p.height == 1300);  // 900 + the GPU-count panel
}

TEST_CASE("report: a plain run with only time windows gets one row per window") {
  TempDir dir("gpurun-report");
  const auto png = dir.path / "t.png";
  auto r = report(dir, {fixture("time_windows.jsonl"), "-o", png.string(), "--size", "640x480"});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  const Png p = read_png(png);
  CHECK(p.signature_ok);
  CHECK(p.width == 640);
  CHECK(p.height == 480);
  CHECK(r.out.find("4 energy windows, GPU slots [0,1], 35.0 s, 13950.0 J, cost 17475.0") !=
        std::string::npos);
  CHECK(r.out.find("no energy_epoch events") != std::string::npos);
  // window, start, time, energy, gpu0, gpu1, active, power, cost, cost total.
  CHECK(row(r.out, "2") ==
        "     2       10.0      10.0      4100.0     2100.0     2000.0    2.00     410.0      "
        "5050.0     10000.0");
  CHECK(row(r.out, "4") ==
        "     4       30.0       5.0      1950.0     1000.0      950.0    2.00     390.0      "
        "2475.0     17475.0");
}

TEST_CASE("report: a truncated last line (killed run) is a warning") {
  TempDir dir("gpurun-report");
  auto r = report(dir, {fixture("truncated.jsonl"), "-o", (dir.path / "k.png").string()});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.find("warning: " + fixture("truncated.jsonl") +
                   ":4: ignoring the truncated last "
                   "line") != std::string::npos);
  CHECK(r.out.find("2 epochs") != std::string::npos);
  CHECK(read_png(dir.path / "k.png").signature_ok);
}

TEST_CASE("report: an appended log with two runs reports the last one") {
  TempDir dir("gpurun-report");
  const auto events = dir.path / "both.jsonl";
  {
    std::ofstream f(events);
    f << gpurun::testing::slurp(fixture("shrink_grow.jsonl"))
      << gpurun::testing::slurp(fixture("profile_early_stop.jsonl"));
  }
  auto r = report(dir, {events.string(), "-o", (dir.path / "b.png").string()});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.find("holds 2 runs") != std::string::npos);
  CHECK(r.err.find("from line 15") != std::string::npos);
  CHECK(row(r.out, "1").find("25000.0") != std::string::npos);
  CHECK(row(r.out, "1").find("15600.0") == std::string::npos);
}

TEST_CASE("report: a log without energy events is exit 1 with a message") {
  TempDir dir("gpurun-report");
  const auto png = dir.path / "n.png";
  auto r = report(dir, {fixture("no_energy.jsonl"), "-o", png.string()});
  CHECK(r.code == 1);
  CHECK(r.err.find("gpurun report: error: " + fixture("no_energy.jsonl") +
                   " has no energy events") != std::string::npos);
  CHECK_FALSE(fs::exists(png));
}

TEST_CASE("report: a bad line names file:line:column") {
  TempDir dir("gpurun-report");
  auto r = report(dir, {fixture("bad_line.jsonl"), "-o", (dir.path / "x.png").string()});
  CHECK(r.code == 1);
  // Line 3 is `..."seconds": , ...`: column 84 is the comma where a number should be.
  CHECK(r.err.find("error: " + fixture("bad_line.jsonl") + ":3:84: ") != std::string::npos);
  CHECK(r.err.find("not valid JSON") != std::string::npos);
  CHECK(r.out.empty());  // no table from a half-read log
}

TEST_CASE("report: a field of the wrong type names file:line, the event and the field") {
  TempDir dir("gpurun-report");
  auto r = report(dir, {fixture("bad_field.jsonl"), "-o", (dir.path / "x.png").string()});
  CHECK(r.code == 1);
  CHECK(r.err.find(fixture("bad_field.jsonl") +
                   ":2: `energy_epoch` event: field `seconds` must be a number, got string") !=
        std::string::npos);
}

TEST_CASE("report: a negative `seconds` names file:line, the event and the field") {
  TempDir dir("gpurun-report");
  const std::string start =
      R"({"ts": "2025-03-04T08:00:00.000Z", "event": "start", "run_id": "neg", "nproc": 1})";
  const std::string epoch =
      R"({"ts": "2025-03-04T08:00:40.000Z", "event": "energy_epoch", "epoch": 0, "seconds": -5, )"
      R"("energy_j": 800.0, "gpu_energy_j": {"0": 800.0}, "active_gpus": 1.0, )"
      R"("max_power_w": 300.0, "cost": 1000.0, "cost_total": 1000.0, )"
      R"("predicted_next_cost": 1000.0, "threshold": null})";
  const std::string window =
      R"({"ts": "2025-03-04T08:00:40.000Z", "event": "energy", "kind": "time", "t0": 1.0, )"
      R"("seconds": -0.5, "active": [0], "gpus": [{"slot": 0, "energy_j": 5.0}], )"
      R"("energy_j": 5.0, "cost": 7.0})";
  for (const auto& row : {std::pair{epoch, "energy_epoch"}, std::pair{window, "energy"}}) {
    const auto& line = row.first;  // named: clang 14 cannot capture a binding in CAPTURE's lambda
    const auto& event = row.second;
    CAPTURE(event);
    const fs::path log = dir.path / "neg.jsonl";
    std::ofstream(log) << start << "\n" << line << "\n";
    auto r = report(dir, {log.string(), "-o", (dir.path / "x.png").string()});
    CHECK(r.code == 1);
    CHECK_MESSAGE(
        r.err.find(log.string() + ":2: `" + event +
                   "` event: field `seconds` must be 0 s or more, got -") != std::string::npos,
        r.err);
    CHECK(r.err.find("gnuplot") == std::string::npos);  // found before drawing
  }
}

TEST_CASE("report: an infinite `seconds` (1e400) names the field") {
  TempDir dir("gpurun-report");
  const fs::path log = dir.path / "inf.jsonl";
  std::ofstream(log)
      << R"({"ts": "2025-03-04T08:00:00.000Z", "event": "start", "run_id": "inf", "nproc": 1})"
      << "\n"
      << R"({"ts": "2025-03-04T08:00:40.000Z", "event": "energy_epoch", "epoch": 0, )"
      << R"("seconds": 1e400, "energy_j": 800.0, "gpu_energy_j": {"0": 800.0}, )"
      << R"("active_gpus": 1.0, "max_power_w": 300.0, "cost": 1000.0, "cost_total": 1000.0, )"
      << R"("predicted_next_cost": 1000.0, "threshold": null})"
      << "\n";
  auto r = report(dir, {log.string(), "-o", (dir.path / "x.png").string()});
  CHECK(r.code == 1);
  CHECK_MESSAGE(
      r.err.find("field `seconds` must be a finite number of seconds") != std::string::npos, r.err);
}

TEST_CASE("report: a missing file is a clear error") {
  TempDir dir("gpurun-report");
  const std::string missing = (dir.path / "nope.jsonl").string();
  auto r = report(dir, {missing});
  CHECK(r.code == 1);
  CHECK(r.err.find("cannot read the event log " + missing + ": it does not exist") !=
        std::string::npos);
}

TEST_CASE("report: gnuplot missing from PATH is exit 1 naming the package") {
  TempDir dir("gpurun-report");
  const auto png = dir.path / "g.png";
  auto r = report(dir, {fixture("shrink_grow.jsonl"), "-o", png.string()}, {{"PATH", dir.str()}});
  CHECK(r.code == 1);
  CHECK(r.err.find("gnuplot not found: install gnuplot-nox (scripts/setup.sh does)") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(png));
}

TEST_CASE("report: gnuplot starts with no signal ignored (gpurun ignores SIGPIPE, SIGXFSZ)") {
  // A stand-in for gnuplot first on PATH writes what a program it runs sees.
  TempDir dir("gpurun-report");
  const fs::path gnuplot = dir.path / "gnuplot";
  std::ofstream(gnuplot) << "#!/bin/sh\ngrep -E '^Sig(Blk|Ign):' /proc/self/status > "
                         << (dir.path / "signals").string() << "\n";
  fs::permissions(gnuplot, fs::perms::owner_all);
  report(dir, {fixture("shrink_grow.jsonl"), "-o", (dir.path / "g.png").string()},
         {{"PATH", dir.str() + ":/usr/bin:/bin"}});
  std::ifstream in(dir.path / "signals");
  const std::string text(std::istreambuf_iterator<char>(in), {});
  INFO("the /proc status of a program gnuplot runs: ", text);
  // Without glibc's internal signals 32 and 33 (posix_spawn's child ignores them).
  constexpr unsigned long long kGlibcInternal = (1ULL << 31) | (1ULL << 32);
  for (const char* field : {"SigBlk:", "SigIgn:"}) {
    const auto at = text.find(field);
    REQUIRE(at != std::string::npos);
    CHECK((std::stoull(text.substr(at + 7), nullptr, 16) & ~kGlibcInternal) == 0);
  }
}

TEST_CASE("report: bad command lines are exit 2") {
  TempDir dir("gpurun-report");
  const std::string log = fixture("shrink_grow.jsonl");
  const std::vector<std::vector<std::string>> bad = {
      {},                                    // no event log
      {log, "--bogus"},                      // unknown option
      {log, "-o"},                           // missing value
      {log, "--size", "800"},                // not WxH
      {log, "--size", "10x10"},              // too small
      {log, "--size", "800x-6"},             // not a number
      {log, "--title"},                      // missing value
      {log, fixture("time_windows.jsonl")},  // two logs
  };
  for (const auto& args : bad) {
    auto r = report(dir, args);
    INFO("args: " << (args.empty() ? std::string("(none)") : args.back()) << " stderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find("gpurun report: error: ") == 0);
  }
  auto help = report(dir, {"--help"});
  CHECK(help.code == 0);
  CHECK(help.out.find("usage: gpurun report EVENTS.jsonl [-o OUT.png]") == 0);
}

TEST_CASE("report: after a restart the epochs of the new attempt are rows of their own") {
  TempDir dir("gpurun-report");
  const auto png = dir.path / "restart.png";
  auto r = report(dir, {fixture("restart.jsonl"), "-o", png.string()});
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(read_png(png).signature_ok);
  // Epoch 0 of the first attempt, then the restarted attempt's epochs 0 and 1.
  CHECK(row(r.out, "0").find("10.0      3000.0") != std::string::npos);
  CHECK(row(r.out, "r1:0").find("12000.0") != std::string::npos);
  CHECK(row(r.out, "r1:1").find("17000.0") != std::string::npos);
}
