#include "control/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "gpurun_process.hpp"

namespace gpurun::control {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::vector<int> kFourGpus{0, 1, 2, 3};

Config with(void (*edit)(Config&)) {
  Config c;
  edit(c);
  return c;
}

struct ValidCase {
  std::string name;
  std::string text;
  Config expected;
};

struct InvalidCase {
  std::string name;
  std::string text;
  std::string error;
};

std::string error_of(const std::string& text, const std::vector<int>& ids = kFourGpus) {
  try {
    parse_config(text, "config.toml", ids);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

using gpurun::testing::TempDir;

TEST_CASE("parse_config: eta_knob = -0.0 is 0, printed as 0 (not -0)") {
  const Config c = parse_config("[energy]\neta_knob = -0.0\n", "config.toml", kFourGpus);
  CHECK(c.energy.eta == 0.0);
  CHECK_FALSE(std::signbit(c.energy.eta));
  CHECK(fmt::format("η = {}", c.energy.eta) == "η = 0");  // the monitor's start line
}

TEST_CASE("parse_config: valid files give the expected settings") {
  const std::vector<ValidCase> cases = {
      {"empty file: defaults", "", Config{}},
      {"comments only", "# nothing to see\n\n   # here\n", Config{}},
      {"active_gpus is sorted", "active_gpus = [3, 1, 0]\n", with([](Config& c) {
         c.active_gpus = std::vector<int>{0, 1, 3};
       })},
      {"empty active_gpus = pause", "active_gpus = []\n",
       with([](Config& c) { c.active_gpus = std::vector<int>{}; })},
      {"multi-line array with trailing comma", "active_gpus = [\n  2,  # third\n  0,\n]\n",
       with([](Config& c) {
         c.active_gpus = std::vector<int>{0, 2};
       })},
      {"park hold", "[park]\nmode = \"hold\"\n",
       with([](Config& c) { c.park_mode = ParkMode::kHold; })},
      {"park release as inline table", "park = { mode = \"release\" }\n", Config{}},
      {"park as dotted key", "park.mode = \"hold\"\n",
       with([](Config& c) { c.park_mode = ParkMode::kHold; })},
      {"standbys off", "[park]\nstandby = false\n", with([](Config& c) { c.standby = false; })},
      {"boundary every N steps", "[boundary]\nevery = 50\n",
       with([](Config& c) { c.boundary = BoundarySpec{.every_epoch = false, .every_steps = 50}; })},
      {"boundary every epoch", "[boundary]\nevery = \"epoch\"\n", Config{}},
      {"integer deadline", "[boundary]\ndeadline_s = 30\n",
       with([](Config& c) { c.boundary_deadline = 30s; })},
      {"fractional deadline", "[boundary]\ndeadline_s = 2.5\n",
       with([](Config& c) { c.boundary_deadline = 2500ms; })},
      {"tiny deadline rounds up to 1 ms", "[boundary]\ndeadline_s = 0.0001\n",
       with([](Config& c) { c.boundary_deadline = 1ms; })},
      {"global batch", "[batch]\nglobal = 256\n", with([](Config& c) { c.global_batch = 256; })},
      {"the largest global batch", "[batch]\nglobal = 2147483647\n",
       with([](Config& c) { c.global_batch = 2147483647; })},
      {"everything", R"(active_gpus = [0, 2]
[park]
mode = "hold"
[boundary]
every = 100
deadline_s = 60
[batch]
global = 512
)",
       with([](Config& c) {
         c.active_gpus = std::vector<int>{0, 2};
         c.park_mode = ParkMode::kHold;
         c.boundary = BoundarySpec{.every_epoch = false, .every_steps = 100};
         c.boundary_deadline = 60s;
         c.global_batch = 512;
       })},
      {"a quoted key with a newline is named on one line",
       "\"x\\ny\" = 1\n[park]\n\"mo\\nde\" = 2\n\"a\\u2028b\\u009bc\" = 3\n", with([](Config& c) {
         c.warnings = {"config.toml:1:1: unknown key 'x?y' (ignored)",
                       "config.toml:3:1: unknown key 'park.mo?de' (ignored); did you mean "
                       "'park.mode'?",
                       "config.toml:4:1: unknown key 'park.a?b?c' (ignored)"};
       })},
      {"restart section is accepted with a warning; unknown energy keys warn",
       "[energy]\ncost = \"zeus\"\n[restart]\nmax = 3\n", with([](Config& c) {
         c.energy.present = true;
         c.warnings = {"config.toml:2:1: unknown key 'energy.cost' (ignored)",
                       "config.toml:3:2: [restart] is not yet used (ignored)"};
       })},
      {"energy: beta_knob is Zeus' name of cost_threshold_factor", "[energy]\nbeta_knob = 3",
       with([](Config& c) {
         c.energy.present = true;
         c.energy.cost_threshold_factor = 3;
       })},
      {"energy: every key", R"([energy]
monitor = true
period_s = 0.2
window_s = 30
eta_knob = 0.25
cost_threshold = 5e4
cost_threshold_factor = 1.5
history = "hist.jsonl"
job = "vit-b"
power_limit_watts = 300
profile_warmup_steps = 5
profile_measure_steps = 20
profile_cooldown_s = 0
profile_settle_s = 2.5
profile_cache = "cache.json"
)",
       with([](Config& c) {
         c.energy.present = true;
         c.energy.period = 200ms;
         c.energy.window = 30s;
         c.energy.eta = 0.25;
         c.energy.cost_threshold_j = 5e4;
         c.energy.cost_threshold_factor = 1.5;
         c.energy.history = "hist.jsonl";
         c.energy.job = "vit-b";
         c.energy.power_limit_w = 300;
         c.energy.profile_warmup_steps = 5;
         c.energy.profile_measure_steps = 20;
         c.energy.profile_cooldown_s = 0;
         c.energy.profile_settle_s = 2.5;
         c.energy.profile_cache = "cache.json";
       })},
      {"energy: scale auto with its keys",
       "[energy]\nscale = \"auto\"\nallowed_gpus = [3, 1]\nscale_warmup_epochs = 0\n"
       "scale_measure_epochs = 2\nscale_recheck_epochs = 10\n",
       with([](Config& c) {
         c.energy.present = true;
         c.energy.auto_scale = true;
         c.energy.allowed_gpus = std::vector<int>{1, 3};
         c.energy.scale_warmup_epochs = 0;
         c.energy.scale_measure_epochs = 2;
         c.energy.scale_recheck_epochs = 10;
       })},
      {"energy: locked clocks, a range and one number",
       "[energy]\nlocked_clocks_mhz = [1200, 1500]\n", with([](Config& c) {
         c.energy.present = true;
         c.energy.locked_clocks_mhz = std::make_pair(1200u, 1500u);
       })},
      {"energy: locked clocks at one frequency", "[energy]\nlocked_clocks_mhz = 1410\n",
       with([](Config& c) {
         c.energy.present = true;
         c.energy.locked_clocks_mhz = std::make_pair(1410u, 1410u);
       })},
      {"energy: automatic power limit, monitor off",
       "[energy]\npower_limit_watts = \"auto\"\nmonitor = false\n", with([](Config& c) {
         c.energy.present = true;
         c.energy.auto_limit = true;
         c.energy.monitor = false;
       })},
      {"energy: a settle window longer than the cool-down's cap warns",
       "[energy]\nprofile_cooldown_s = 5\nprofile_settle_s = 10\n", with([](Config& c) {
         c.energy.present = true;
         c.energy.profile_cooldown_s = 5;
         c.energy.profile_settle_s = 10;
         c.warnings = {
             "config.toml:3:20: energy.profile_settle_s = 10.0 s is longer than "
             "profile_cooldown_s = 5.0 s: no temperature can settle in time, so every cool-down "
             "waits the whole 5.0 s"};
       })},
      {"energy: a typo gets a suggestion", "[energy]\neta_knb = 0.5\n", with([](Config& c) {
         c.energy.present = true;
         c.warnings = {
             "config.toml:2:1: unknown key 'energy.eta_knb' (ignored); did you mean "
             "'energy.eta_knob'?"};
       })},
      {"unknown keys warn in document order, with suggestions",
       "active_gpus = [1]\nzeta = 1\nactve_gpus = [0]\n[park]\nmod = \"hold\"\n[bogus]\nx = 1\n",
       with([](Config& c) {
         c.active_gpus = std::vector<int>{1};
         c.warnings = {"config.toml:2:1: unknown key 'zeta' (ignored)",
                       "config.toml:3:1: unknown key 'actve_gpus' (ignored); did you mean "
                       "'active_gpus'?",
                       "config.toml:5:1: unknown key 'park.mod' (ignored); did you mean "
                       "'park.mode'?",
                       "config.toml:6:2: unknown key 'bogus' (ignored)"};
       })},
      {"a nested key at top level gets a hint", "deadline = 5\n", with([](Config& c) {
         c.warnings = {
             "config.toml:1:1: unknown key 'deadline' (ignored); did you mean 'deadline_s' "
             "under [boundary]?"};
       })},
      {"active_gpus below a table header belongs to that table",
       "active_gpus = [0]\n[park]\nmode = \"hold\"\nactive_gpus = [1]\n", with([](Config& c) {
         c.active_gpus = std::vector<int>{0};
         c.park_mode = ParkMode::kHold;
         c.warnings = {
             "config.toml:4:1: unknown key 'park.active_gpus' (ignored); active_gpus is a "
             "top-level key: move it above the first [table] header (here it belongs to "
             "[park])"};
       })},
  };
  for (const ValidCase& c : cases) {
    CAPTURE(c.name);
    const Config got = parse_config(c.text, "config.toml", kFourGpus);
    CHECK(got.active_gpus == c.expected.active_gpus);
    CHECK(got.park_mode == c.expected.park_mode);
    CHECK(got.boundary == c.expected.boundary);
    CHECK(got.global_batch == c.expected.global_batch);
    CHECK(got.boundary_deadline == c.expected.boundary_deadline);
    CHECK(got.warnings == c.expected.warnings);
    CHECK(got == c.expected);
  }
}

TEST_CASE("parse_config: invalid files give exact, actionable errors") {
  const std::vector<InvalidCase> cases = {
      // Without a top-level active_gpus the file means every slot: a misspelt or misplaced
      // one would train on everything (a fresh user's edit of actve_gpus = [0] did).
      {"a misspelt active_gpus where none is set", "actve_gpus = [0]\n",
       "config.toml:1:1: actve_gpus: unknown key; did you mean 'active_gpus'? (this file sets no "
       "top-level active_gpus, which would mean every slot); allowed: active_gpus = [ids] at the "
       "top level"},
      {"active_gpus below a table header where none is set above it",
       "[park]\nmode = \"hold\"\nactive_gpus = [1]\n",
       "config.toml:3:1: park.active_gpus: active_gpus is a top-level key but belongs to [park] "
       "here (this file sets no top-level active_gpus, which would mean every slot); allowed: "
       "active_gpus = [ids] above the first [table] header"},
      {"id out of range", "active_gpus = [0, 1, 7]",
       "config.toml:1:22: active_gpus: GPU id 7 is not available on this node; allowed: 0, 1, "
       "2, 3"},
      {"negative id", "active_gpus = [0, -1]",
       "config.toml:1:19: active_gpus: GPU id -1 is negative; allowed: 0, 1, 2, 3"},
      {"duplicate id", "active_gpus = [1, 2, 1]",
       "config.toml:1:22: active_gpus: GPU id 1 is listed twice (first at line 1, column 16); "
       "allowed: distinct ids from 0, 1, 2, 3"},
      {"huge id", "active_gpus = [4294967296]",
       "config.toml:1:16: active_gpus: GPU id 4294967296 is not available on this node; "
       "allowed: 0, 1, 2, 3"},
      {"active_gpus as a string", "active_gpus = \"0,1\"",
       "config.toml:1:15: active_gpus: expected an array of GPU ids, found a string (\"0,1\"); "
       "allowed: [] or a list of ids from 0, 1, 2, 3"},
      {"active_gpus as an integer", "active_gpus = 2",
       "config.toml:1:15: active_gpus: expected an array of GPU ids, found an integer (2); "
       "allowed: [] or a list of ids from 0, 1, 2, 3"},
      {"string element", "active_gpus = [0, \"1\"]",
       "config.toml:1:19: active_gpus: expected integer GPU ids, found a string (\"1\"); "
       "allowed: 0, 1, 2, 3"},
      {"float element", "active_gpus = [0, 1.0]",
       "config.toml:1:19: active_gpus: expected integer GPU ids, found a floating-point number "
       "(1.0); allowed: 0, 1, 2, 3"},
      {"nested array element", "active_gpus = [[0, 1]]",
       "config.toml:1:16: active_gpus: expected integer GPU ids, found an array; allowed: 0, 1, "
       "2, 3"},
      {"unknown park mode", "[park]\nmode = \"hld\"",
       "config.toml:2:8: park.mode: unknown park mode \"hld\"; allowed: \"release\", \"hold\""},
      {"park mode is case-sensitive", "[park]\nmode = \"Hold\"",
       "config.toml:2:8: park.mode: unknown park mode \"Hold\"; allowed: \"release\", \"hold\""},
      {"park mode of the wrong type", "[park]\nmode = true",
       "config.toml:2:8: park.mode: expected a string, found a boolean (true); allowed: "
       "\"release\", \"hold\""},
      {"park not a table", "park = \"hold\"",
       "config.toml:1:8: park: expected a table, found a string (\"hold\"); allowed: [park] "
       "with mode = \"release\" or \"hold\", and standby = true or false"},
      {"park standby not a boolean", "[park]\nstandby = \"no\"",
       "config.toml:2:11: park.standby: expected a boolean, found a string (\"no\"); allowed: "
       "true, false"},
      {"zero steps", "[boundary]\nevery = 0",
       "config.toml:2:9: boundary.every: step count 0 is not positive; allowed: \"epoch\" or a "
       "positive integer number of steps"},
      {"unknown every word", "[boundary]\nevery = \"epochs\"",
       "config.toml:2:9: boundary.every: unknown value \"epochs\"; allowed: \"epoch\" or a "
       "positive integer number of steps"},
      {"fractional every", "[boundary]\nevery = 2.5",
       "config.toml:2:9: boundary.every: expected \"epoch\" or an integer, found a "
       "floating-point number (2.5); allowed: \"epoch\" or a positive integer number of steps"},
      {"boundary not a table", "boundary = 10",
       "config.toml:1:12: boundary: expected a table, found an integer (10); allowed: "
       "[boundary] with every = \"epoch\" or a positive integer, and deadline_s = a positive "
       "number of seconds"},
      {"zero deadline", "[boundary]\ndeadline_s = 0",
       "config.toml:2:14: boundary.deadline_s: 0 is not positive; allowed: a positive number of "
       "seconds (default 300)"},
      {"negative deadline", "[boundary]\ndeadline_s = -1.5",
       "config.toml:2:14: boundary.deadline_s: -1.5 is not positive; allowed: a positive number "
       "of seconds (default 300)"},
      {"nan deadline", "[boundary]\ndeadline_s = nan",
       "config.toml:2:14: boundary.deadline_s: nan is not positive; allowed: a positive number "
       "of seconds (default 300)"},
      {"infinite deadline", "[boundary]\ndeadline_s = inf",
       "config.toml:2:14: boundary.deadline_s: inf is larger than 1000000000 seconds; allowed: "
       "a positive number of seconds (default 300)"},
      {"deadline as text", "[boundary]\ndeadline_s = \"5m\"",
       "config.toml:2:14: boundary.deadline_s: expected a number, found a string (\"5m\"); "
       "allowed: a positive number of seconds (default 300)"},
      {"zero global batch", "[batch]\nglobal = 0",
       "config.toml:2:10: batch.global: 0 is not positive; allowed: a positive integer (samples "
       "per optimizer step, summed over the active GPUs)"},
      {"global batch larger than any dataset needs", "[batch]\nglobal = 100000000000",
       "config.toml:2:10: batch.global: 100000000000 is larger than 2147483647 samples per "
       "optimizer step; allowed: a positive integer (samples per optimizer step, summed over the "
       "active GPUs)"},
      {"global batch of 2^31", "[batch]\nglobal = 2147483648",
       "config.toml:2:10: batch.global: 2147483648 is larger than 2147483647 samples per "
       "optimizer step; allowed: a positive integer (samples per optimizer step, summed over the "
       "active GPUs)"},
      {"float global batch", "[batch]\nglobal = 64.0",
       "config.toml:2:10: batch.global: expected an integer, found a floating-point number "
       "(64.0); allowed: a positive integer (samples per optimizer step, summed over the active "
       "GPUs)"},
      {"eta outside [0, 1]", "[energy]\neta_knob = 1.5",
       "config.toml:2:12: energy.eta_knob: 1.5 is outside [0, 1]; allowed: a number from 0 to 1"},
      {"reversed clock range", "[energy]\nlocked_clocks_mhz = [1500, 1200]",
       "config.toml:2:21: energy.locked_clocks_mhz: the minimum 1500 MHz is above the maximum "
       "1200 MHz; allowed: [min, max] or one number of MHz from 1 to 10000"},
      {"three clocks", "[energy]\nlocked_clocks_mhz = [1, 2, 3]",
       "config.toml:2:21: energy.locked_clocks_mhz: expected 2 numbers, found 3; allowed: [min, "
       "max] or one number of MHz from 1 to 10000"},
      {"unknown scale word", "[energy]\nscale = \"max\"",
       "config.toml:2:9: energy.scale: unknown value \"max\"; allowed: \"auto\", \"off\""},
      {"scale not a string", "[energy]\nscale = true",
       "config.toml:2:9: energy.scale: expected a string, found a boolean (true); allowed: "
       "\"auto\", \"off\""},
      {"empty allowed_gpus", "[energy]\nallowed_gpus = []",
       "config.toml:2:16: energy.allowed_gpus: is empty; allowed: a list of ids from 0, 1, 2, 3"},
      {"allowed_gpus of no id here: that error alone (not also 'is empty')",
       "[energy]\nallowed_gpus = [7]",
       "config.toml:2:17: energy.allowed_gpus: GPU id 7 is not available on this node; allowed: "
       "0, 1, 2, 3"},
      {"allowed_gpus off this node", "[energy]\nallowed_gpus = [0, 99]",
       "config.toml:2:20: energy.allowed_gpus: GPU id 99 is not available on this node; allowed: "
       "0, 1, 2, 3"},
      {"negative scale warm-up", "[energy]\nscale_warmup_epochs = -1",
       "config.toml:2:23: energy.scale_warmup_epochs: -1 is negative; allowed: an integer >= 0"},
      {"zero scale measurement", "[energy]\nscale_measure_epochs = 0",
       "config.toml:2:24: energy.scale_measure_epochs: 0 is not positive; allowed: a positive "
       "integer"},
      {"unknown power limit word", "[energy]\npower_limit_watts = \"max\"",
       "config.toml:2:21: energy.power_limit_watts: unknown value \"max\"; allowed: \"auto\" or a "
       "number of watts from 1 to 10000"},
      {"negative cost threshold", "[energy]\ncost_threshold = -3",
       "config.toml:2:18: energy.cost_threshold: -3.0 is not positive; allowed: a positive number "
       "of joules"},
      {"factor below 1", "[energy]\ncost_threshold_factor = 0.5",
       "config.toml:2:25: energy.cost_threshold_factor: 0.5 is smaller than 1; allowed: a number "
       ">= 1"},
      {"beta_knob below 1", "[energy]\nbeta_knob = 0.5",
       "config.toml:2:13: energy.beta_knob: 0.5 is smaller than 1; allowed: a number >= 1"},
      {"beta_knob beside its other name", "[energy]\ncost_threshold_factor = 2\nbeta_knob = 3",
       "config.toml:3:13: energy.beta_knob: is given beside cost_threshold_factor, its other name "
       "(Zeus' β); allowed: one of beta_knob and cost_threshold_factor"},
      {"period too short", "[energy]\nperiod_s = 0.001",
       "config.toml:2:12: energy.period_s: 0.001 is out of range; allowed: a number of seconds "
       "from 0.01 to 5"},
      {"period too long", "[energy]\nperiod_s = 60",
       "config.toml:2:12: energy.period_s: 60.0 is out of range; allowed: a number of seconds "
       "from 0.01 to 5"},
      {"zero warmup steps", "[energy]\nprofile_warmup_steps = 0",
       "config.toml:2:24: energy.profile_warmup_steps: 0 is not positive; allowed: a positive "
       "integer"},
      {"negative cool-down", "[energy]\nprofile_cooldown_s = -1",
       "config.toml:2:22: energy.profile_cooldown_s: -1.0 is out of range; allowed: a number of "
       "seconds from 0 (off) to 3600"},
      {"settle window zero", "[energy]\nprofile_settle_s = 0",
       "config.toml:2:20: energy.profile_settle_s: 0.0 is out of range; allowed: a number of "
       "seconds from 0.1 to 600"},
      {"monitor not a boolean", "[energy]\nmonitor = \"yes\"",
       "config.toml:2:11: energy.monitor: expected true or false, found a string (\"yes\"); "
       "allowed: true, false"},
      {"batch not a table", "batch = 64",
       "config.toml:1:9: batch: expected a table, found an integer (64); allowed: [batch] with "
       "global = a positive integer"},
      {"array of tables instead of a table", "[[park]]\nmode = \"hold\"",
       "config.toml:1:1: park: expected a table, found an array; allowed: [park] with mode = "
       "\"release\" or \"hold\", and standby = true or false"},
      {"every problem is listed, in document order", "[batch]\nglobal = -4\n[park]\nmode = \"x\"\n",
       "config.toml:2:10: batch.global: -4 is not positive; allowed: a positive integer (samples "
       "per optimizer step, summed over the active GPUs)\n"
       "config.toml:4:8: park.mode: unknown park mode \"x\"; allowed: \"release\", \"hold\""},
      {"two bad ids in one array", "active_gpus = [9, 0, 0]",
       "config.toml:1:16: active_gpus: GPU id 9 is not available on this node; allowed: 0, 1, "
       "2, 3\n"
       "config.toml:1:22: active_gpus: GPU id 0 is listed twice (first at line 1, column 19); "
       "allowed: distinct ids from 0, 1, 2, 3"},
      {"unterminated array", "active_gpus = [0, 1\n",
       "config.toml:1:21: syntax error: Error while parsing array: encountered end-of-file"},
      {"duplicate key", "active_gpus = [0]\nactive_gpus = [1]\n",
       "config.toml:2:15: syntax error: Error while parsing key-value pair: cannot redefine "
       "existing array 'active_gpus'"},
      {"bare word value", "[park]\nmode = hold\n",
       "config.toml:2:8: syntax error: Error while parsing value: could not determine value "
       "type"},
  };
  for (const InvalidCase& c : cases) {
    CAPTURE(c.name);
    CHECK(error_of(c.text) == c.error);
  }
}

TEST_CASE("parse_config: the allowed ids are the ones the caller passes") {
  // CUDA_VISIBLE_DEVICES=5,6 style: gpurun sees ids 5 and 6 only.
  CHECK(error_of("active_gpus = [0]", {6, 5}) ==
        std::string("config.toml:1:16: active_gpus: GPU id 0 is not available on this node; "
                    "allowed: 5, 6"));
  CHECK(parse_config("active_gpus = [6, 5]", "c", {5, 6}).active_gpus == std::vector<int>{5, 6});
  CHECK(error_of("active_gpus = [0]", {}) ==
        std::string("config.toml:1:16: active_gpus: GPU id 0 is not available on this node; "
                    "allowed: none (this node has no GPU slots)"));
}

TEST_CASE("parse_config: the source name appears in every message") {
  CHECK(error_of("active_gpus = [0, 1, 7]").rfind("config.toml:", 0) == 0);
  try {
    parse_config("[park]\nmode = 3\n", "/etc/gpurun/job.toml", kFourGpus);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).rfind("/etc/gpurun/job.toml:2:8: park.mode: ", 0) == 0);
  }
}

TEST_CASE("load_config reads files, follows symlinks and reports unreadable ones") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  std::ofstream(file) << "active_gpus = [2]\n[park]\nmode = \"hold\"\n";

  const Config direct = load_config(file, kFourGpus);
  CHECK(direct.active_gpus == std::vector<int>{2});
  CHECK(direct.park_mode == ParkMode::kHold);

  fs::create_symlink("config.toml", dir.path / "link.toml");
  CHECK(load_config(dir.path / "link.toml", kFourGpus) == direct);

  const auto message_for = [&](const fs::path& path) -> std::string {
    try {
      load_config(path, kFourGpus);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  };
  const fs::path missing = dir.path / "missing.toml";
  CHECK(message_for(missing) ==
        "cannot read the config file " + missing.string() + ": it does not exist");
  CHECK(message_for(dir.path) == "cannot read the config file " + dir.path.string() +
                                     ": it is a directory, not a regular file");

  const fs::path big = dir.path / "big.toml";
  std::ofstream(big) << std::string(kMaxConfigBytes + 1, '#');
  CHECK(message_for(big) == "cannot read the config file " + big.string() +
                                ": it is 1048577 bytes, more than the limit of 1 MiB (1048576 "
                                "bytes)");

  const fs::path bad = dir.path / "bad.toml";
  std::ofstream(bad) << "active_gpus = [5]\n";
  CHECK(message_for(bad) == bad.string() +
                                ":1:16: active_gpus: GPU id 5 is not available on this node; "
                                "allowed: 0, 1, 2, 3");
}

TEST_CASE("the repository's config.toml is valid, and so are its commented-out examples") {
  const Config shipped = load_config(GPURUN_REPO_CONFIG, kFourGpus);
  CHECK(shipped == Config{});  // as shipped it changes nothing: all slots, defaults, no warnings

  std::ifstream in(GPURUN_REPO_CONFIG);
  std::ostringstream uncommented;
  const std::regex example_line(R"(^# ((\[[a-z]+\])|([a-z_]+ = .+))$)");
  int examples = 0;
  for (std::string line; std::getline(in, line);) {
    std::smatch match;
    if (std::regex_match(line, match, example_line)) {
      line = match[1];
      ++examples;
    }
    uncommented << line << "\n";
  }
  CHECK(examples == 21);
  const Config all = parse_config(uncommented.str(), "config.toml", kFourGpus);
  CHECK(all.active_gpus == std::vector<int>{0, 1, 2, 3});
  CHECK(all.global_batch == 256);
  CHECK(all.energy.present);
  CHECK(all.energy.eta == 0.5);
  CHECK(all.energy.cost_threshold_j == 5e6);
  CHECK(all.energy.history == "runs.jsonl");
  CHECK(all.energy.cost_threshold_factor == 2.0);
  CHECK(all.energy.auto_limit);
  CHECK(all.energy.job == "vit-b-bs256");
  CHECK(all.policy.min_gpus == 1);
  CHECK(all.policy.yield_to_foreign);
  CHECK(all.policy.reclaim_after == std::chrono::seconds(60));
  CHECK(all.notify.command.rfind("curl ", 0) == 0);
  CHECK(all.notify.timeout == std::chrono::seconds(10));
  CHECK(all.warnings.empty());
}

TEST_CASE("describe() shows the effective settings") {
  CHECK(describe(Config{}) ==
        "active_gpus=all park=release boundary=epoch deadline_s=300 batch.global=none");
  Config c;
  c.active_gpus = std::vector<int>{0, 1};
  c.park_mode = ParkMode::kHold;
  c.boundary = BoundarySpec{.every_epoch = false, .every_steps = 20};
  c.boundary_deadline = 2500ms;
  c.global_batch = 256;
  CHECK(describe(c) ==
        "active_gpus=[0, 1] park=hold boundary=20 steps deadline_s=2.5 batch.global=256");
  c.setup_deadline = 7500ms;  // shown once it differs from the default
  CHECK(describe(c) ==
        "active_gpus=[0, 1] park=hold boundary=20 steps deadline_s=2.5 "
        "setup_deadline_s=7.5 batch.global=256");
  // [policy] once set (before, a reload of min_gpus said nothing of it).
  c.policy.min_gpus = 2;
  c.policy.yield_to_foreign = true;
  c.policy.reclaim_after = 2500ms;
  CHECK(describe(c) ==
        "active_gpus=[0, 1] park=hold boundary=20 steps deadline_s=2.5 "
        "setup_deadline_s=7.5 batch.global=256 policy.min_gpus=2 policy.yield_to_foreign=true "
        "reclaim_after_s=2.5");
  c.active_gpus = std::vector<int>{};
  CHECK(describe(c).rfind("active_gpus=[] ", 0) == 0);
}

TEST_CASE("a file with 200000 errors reports the first 20 and how many more, in kilobytes") {
  // A generated 600 KB file: active_gpus with 200,000 copies of GPU 0 (199,999 duplicates).
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  {
    std::ofstream out(file);
    out << "active_gpus = [0";
    for (int i = 1; i < 200'000; ++i) out << ", 0";
    out << "]\n";
  }
  REQUIRE(fs::file_size(file) > 500'000);
  std::string error;
  try {
    load_config(file, kFourGpus);
  } catch (const ConfigError& e) {
    error = e.what();
  }
  std::vector<std::string> lines;
  std::istringstream in(error);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 21u);
  CHECK(lines[0] == file.string() +
                        ":1:19: active_gpus: GPU id 0 is listed twice (first at line 1, column "
                        "16); allowed: distinct ids from 0, 1, 2, 3");
  CHECK(lines.back() ==
        "and 199979 more errors in " + file.string() + " (only the first 20 are reported)");
  CHECK(error.size() < 4096);

  // Warnings too: the first 20, then one line saying how many more.
  std::string many_unknown;
  for (int i = 0; i < 1000; ++i) many_unknown += "zeta" + std::to_string(i) + " = 1\n";
  const Config c = parse_config(many_unknown, "config.toml", kFourGpus);
  REQUIRE(c.warnings.size() == 21u);
  CHECK(c.warnings[0] == "config.toml:1:1: unknown key 'zeta0' (ignored)");
  CHECK(c.warnings.back() ==
        "and 980 more warnings in config.toml (only the first 20 are reported)");

  // At the cap exactly: no summary line.
  std::string twenty = "active_gpus = [";
  for (int i = 0; i < 20; ++i) twenty += (i ? ", " : "") + std::string("9");
  twenty += "]\n";
  const std::string e20 = error_of(twenty);
  CHECK(std::count(e20.begin(), e20.end(), '\n') == 19);
  CHECK(e20.find("more errors") == std::string::npos);
}

}  // namespace
}  // namespace gpurun::control
