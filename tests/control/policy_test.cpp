// Leases, the effective GPU set, the lend/set argument forms and set_config_key
// (launcher/control/policy.hpp, launcher/commands/policy_command.hpp). docs/sharing.md.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "commands/policy_command.hpp"
#include "control/config.hpp"
#include "control/foreign_gpus.hpp"
#include "control/policy.hpp"

using namespace gpurun::control;
using gpurun::commands::set_config_key;

namespace {

const std::vector<int> kFour = {0, 1, 2, 3};

Lease lease(std::vector<int> gpus, std::optional<int64_t> until, std::string note = "") {
  Lease l;
  l.gpus = std::move(gpus);
  l.since_ms = 1000;
  l.until_ms = until;
  l.note = std::move(note);
  return l;
}

}  // namespace

TEST_CASE("leases: rendered and parsed back equal; an empty file is none") {
  const std::vector<Lease> ls = {lease({2, 3}, 5000, "alice"), lease({1}, std::nullopt)};
  CHECK(parse_leases(render_leases(ls), "leases.json") == ls);
  CHECK(parse_leases("", "leases.json").empty());
  CHECK(parse_leases(" \n", "leases.json").empty());
}

TEST_CASE("leases: a malformed file names the file and the lease") {
  CHECK_THROWS_WITH_AS(parse_leases("[1]", "/r/leases.json"),
                       "/r/leases.json: not a leases file (expected {\"leases\": [...]}); fix "
                       "it, or remove it to end every lease",
                       LeaseError);
  CHECK_THROWS_WITH_AS(parse_leases(R"({"leases": [{"gpus": [], "since_ms": 1}]})", "f"),
                       "f: lease 0: field 'gpus' must be a non-empty array of GPU ids", LeaseError);
  CHECK_THROWS_WITH_AS(parse_leases(R"({"leases": [{"gpus": [1], "since_ms": "x"}]})", "f"),
                       "f: lease 0: field 'since_ms' must be an integer", LeaseError);
}

TEST_CASE("leases: running, ended and the next end") {
  const std::vector<Lease> ls = {lease({2}, 5000), lease({3}, 9000), lease({1}, std::nullopt)};
  CHECK(lent_gpus(ls, 4999) == std::vector<int>{1, 2, 3});
  CHECK(lent_gpus(ls, 5000) == std::vector<int>{1, 3});  // an end is exclusive
  std::vector<Lease> ended;
  CHECK(drop_ended(ls, 6000, &ended).size() == 2);
  REQUIRE(ended.size() == 1);
  CHECK(ended[0].gpus == std::vector<int>{2});
  CHECK(next_lease_end(ls, 0) == 5000);
  CHECK(next_lease_end(ls, 5000) == 9000);
  CHECK(next_lease_end(ls, 9000) == std::nullopt);  // the open lease never ends by itself
}

TEST_CASE("effective_set: lent GPUs leave the declared set, with their reason") {
  const EffectiveSet e = effective_set(kFour, {lease({2, 3}, 5000)}, 1000, 0);
  CHECK(e.active == std::vector<int>{0, 1});
  REQUIRE(e.excluded.size() == 2);
  CHECK(e.excluded[0] == std::pair<int, std::string>{2, "lent until 5000 ms"});
  CHECK(e.kept.empty());
  // After the end, the whole declared set again.
  CHECK(effective_set(kFour, {lease({2, 3}, 5000)}, 5000, 0).active == kFour);
  // A lent GPU outside the declared set changes nothing.
  CHECK(effective_set({0, 1}, {lease({3}, std::nullopt)}, 0, 0).active == std::vector<int>{0, 1});
  // Lending every GPU pauses the job when min_gpus allows it.
  CHECK(effective_set(kFour, {lease({0, 1, 2, 3}, std::nullopt)}, 0, 0).active.empty());
}

TEST_CASE("effective_set: min_gpus is never undercut; the lowest lent ids stay") {
  const EffectiveSet e = effective_set(kFour, {lease({1, 2, 3}, std::nullopt)}, 0, 3);
  CHECK(e.active == std::vector<int>{0, 1, 2});
  REQUIRE(e.kept.size() == 2);
  CHECK(e.kept[0] == std::pair<int, std::string>{1,
                                                 "lent until reclaimed, kept: [policy] "
                                                 "min_gpus = 3"});
  CHECK(e.excluded == std::vector<std::pair<int, std::string>>{{3, "lent until reclaimed"}});
  // min_gpus above the declared set: the declared set, not more; a declared pause stays one.
  CHECK(effective_set({0, 1}, {lease({0, 1}, std::nullopt)}, 0, 4).active ==
        std::vector<int>{0, 1});
  CHECK(effective_set({}, {lease({0}, std::nullopt)}, 0, 2).active.empty());
}

TEST_CASE("kept_note: what min_gpus keeps of the GPUs a lend or a yield wants out") {
  // Before, `gpurun lend` and the yield line said the GPUs leave even when min_gpus kept them.
  const EffectiveSet e = effective_set(kFour, {lease({1, 2, 3}, std::nullopt)}, 0, 3);
  CHECK(kept_note(e, {3}, 3).empty());
  CHECK(kept_note(e, {1, 2, 3}, 3) ==
        "; GPUs 1, 2 stay in the job for now ([policy] min_gpus = 3): they leave once the job "
        "has enough GPUs without them");
  CHECK(kept_note(e, {2}, 3) ==
        "; GPU 2 stays in the job for now ([policy] min_gpus = 3): it leaves once the job has "
        "enough GPUs without it");
}

TEST_CASE("effective_set: the floor keeps a GPU the job trains on now, and lent before yielded") {
  // Break-test of issue 27: min_gpus = 2, lend 1-3 kept GPU 1; reclaim 2 swapped it for GPU 2;
  // lend 2 then kept GPU 1 again (the lowest id): a rank started on the GPU the borrower had,
  // and GPU 2 left. With the current set, GPU 2 stays.
  const std::vector<Lease> l = {lease({1, 3}, std::nullopt), lease({2}, std::nullopt)};
  CHECK(effective_set(kFour, l, 0, 2).active == std::vector<int>{0, 1});  // nothing running yet
  const EffectiveSet e = effective_set(kFour, l, 0, 2, nullptr, {}, {0, 2});
  CHECK(e.active == std::vector<int>{0, 2});
  REQUIRE(e.kept.size() == 1);
  CHECK(e.kept[0].first == 2);
  // A yielded GPU (another user's process on it) is kept last: GPU 1 is yielded, GPU 2 lent.
  const std::vector<std::pair<int, std::string>> y = {{1, "yielded to pid 7"}};
  CHECK(effective_set(kFour, {lease({2, 3}, std::nullopt)}, 0, 2, nullptr, y).active ==
        std::vector<int>{0, 2});
  // ... unless the job trains on it now and not on the lent one.
  CHECK(effective_set(kFour, {lease({2, 3}, std::nullopt)}, 0, 2, nullptr, y, {0, 1}).active ==
        std::vector<int>{0, 1});
}

TEST_CASE("lend_effect and reclaim_effect: what the command does to the job, truly") {
  // lend 2,3 while the job trains on [0, 1, 2] (3 not declared or given back): 2 leaves, 3 idle.
  const std::vector<int> cur = {0, 1, 2};
  EffectiveSet after = effective_set(kFour, {lease({2, 3}, std::nullopt)}, 0, 0, nullptr, {}, cur);
  CHECK(lend_effect({2, 3}, cur, after, 0) ==
        "the job stops using [2] at its next boundary; [3] is not in use by the job now");
  after = effective_set(kFour, {lease({0, 1, 2, 3}, std::nullopt)}, 0, 0, nullptr, {}, cur);
  CHECK(lend_effect({0, 1, 2, 3}, cur, after, 0) ==
        "the job pauses at its next boundary; [3] is not in use by the job now");
  // reclaim 2 of lend 1-3 under min_gpus = 2 (GPU 1 kept): 2 comes back, 1 leaves for it.
  after = effective_set(kFour, {lease({1, 3}, std::nullopt)}, 0, 2, nullptr, {}, {0, 1});
  CHECK(reclaim_effect({2}, kFour, {0, 1}, after) ==
        "the job takes back [2] at its next boundary; GPU 1 leaves the job in their place (lent "
        "until reclaimed)");
  // reclaim of a GPU the config no longer names: it stays out, said.
  after = effective_set({0, 1, 2}, {}, 0, 0, nullptr, {}, {0, 1});
  CHECK(reclaim_effect({2, 3}, {0, 1, 2}, {0, 1}, after) ==
        "the job takes back [2] at its next boundary; [3] stays out: config.toml does not name "
        "it");
}

TEST_CASE("parse_gpu_list and parse_duration_ms: the forms and their errors") {
  CHECK(parse_gpu_list("3,1", kFour, "GPU list") == std::vector<int>{1, 3});
  CHECK(parse_gpu_list("0-1,2", kFour, "GPU list") == std::vector<int>{0, 1, 2});
  // A GPU named twice is refused, naming it (issue 44: `gpurun lend 1,1` was accepted).
  CHECK_THROWS_WITH_AS(parse_gpu_list("1,1", kFour, "GPU list"),
                       "invalid GPU list '1,1': GPU 1 is named twice; list each GPU once "
                       "(expected ids like 2,3 or 0-3, or all)",
                       LeaseError);
  CHECK_THROWS_WITH_AS(parse_gpu_list("0-2,2", kFour, "GPU list"),
                       "invalid GPU list '0-2,2': GPU 2 is named twice; list each GPU once "
                       "(expected ids like 2,3 or 0-3, or all)",
                       LeaseError);
  CHECK(parse_gpu_list("all", kFour, "GPU list") == kFour);
  CHECK_THROWS_WITH_AS(parse_gpu_list("3-1", kFour, "GPU list"),
                       "invalid GPU list '3-1': the range '3-1' runs backwards (expected ids "
                       "like 2,3 or 0-3, or all)",
                       LeaseError);
  CHECK_THROWS_WITH_AS(parse_gpu_list("1,,2", kFour, "GPU list"),
                       "invalid GPU list '1,,2': an empty part (expected ids like 2,3 or 0-3, "
                       "or all)",
                       LeaseError);
  CHECK_THROWS_AS(parse_gpu_list("x", kFour, "GPU list"), LeaseError);
  CHECK_THROWS_AS(parse_gpu_list("-1", kFour, "GPU list"), LeaseError);
  CHECK(parse_duration_ms("90", "--for") == 90000);
  CHECK(parse_duration_ms("5s", "--for") == 5000);
  CHECK(parse_duration_ms("1.5h", "--for") == 5'400'000);
  CHECK(parse_duration_ms("2d", "--for") == 172'800'000);
  CHECK_THROWS_WITH_AS(parse_duration_ms("0s", "--for"),
                       "invalid --for '0s': expected a positive duration such as 90s, 30m, 2h "
                       "or 1d",
                       LeaseError);
  CHECK_THROWS_AS(parse_duration_ms("5 s", "--for"), LeaseError);
  // Under a second: it would end before gpurun reads it (announced, never recorded).
  CHECK_THROWS_WITH_AS(parse_duration_ms("0.0001", "--for"),
                       "invalid --for '0.0001': shorter than 1s, the least a lease lasts",
                       LeaseError);
  CHECK(parse_duration_ms("1s", "--for") == 1000);
  CHECK_THROWS_AS(parse_duration_ms("nan", "--for"), LeaseError);
  CHECK_THROWS_AS(parse_duration_ms("1e400", "--for"), LeaseError);
}

TEST_CASE("set_config_key: replaces a key's value, keeps comments, adds what is missing") {
  const std::string text =
      "# my job\nactive_gpus = [0,\n  1]  # two\n\n[park]\n# why hold\nmode = \"release\"  # "
      "warm\n";
  const std::string a = set_config_key(text, "active_gpus", "[0, 1, 2, 3]");
  CHECK(a ==
        "# my job\nactive_gpus = [0, 1, 2, 3]  # two\n\n[park]\n# why hold\nmode = \"release\"  "
        "# warm\n");
  const std::string b = set_config_key(text, "park.mode", "\"hold\"");
  CHECK(
      b ==
      "# my job\nactive_gpus = [0,\n  1]  # two\n\n[park]\n# why hold\nmode = \"hold\"  # warm\n");
  // Keys as TOML allows them: dotted, quoted, in an inline table, a header with spaces.
  CHECK(set_config_key("park.mode = \"hold\"\n", "park.mode", "\"release\"") ==
        "park.mode = \"release\"\n");
  CHECK(set_config_key("park = { mode = \"hold\" }\n", "park.mode", "\"release\"") ==
        "park = { mode = \"release\" }\n");
  CHECK(set_config_key("[park]\n\"mode\" = \"hold\"\n", "park.mode", "\"release\"") ==
        "[park]\n\"mode\" = \"release\"\n");
  CHECK(set_config_key("[ park ]\nmode = \"hold\"\n", "park.standby", "false") ==
        "[ park ]\nstandby = false\nmode = \"hold\"\n");
  // Missing: a top-level key before the first table, a table key after its header, a new table
  // at the end; a key to add to an inline table is refused (edit by hand).
  CHECK(set_config_key("# c\n[park]\nmode = \"hold\"\n", "active_gpus", "[1]") ==
        "# c\nactive_gpus = [1]\n[park]\nmode = \"hold\"\n");
  CHECK(set_config_key("active_gpus = [0]", "batch.global", "256") ==
        "active_gpus = [0]\n\n[batch]\nglobal = 256\n");
  CHECK(set_config_key("active_gpus = [0]", "park.mode", "\"hold\"") ==
        "active_gpus = [0]\n\n[park]\nmode = \"hold\"\n");
  CHECK(set_config_key("[energy]\nmode = 1\n[park]\n", "park.mode", "\"hold\"") ==
        "[energy]\nmode = 1\n[park]\nmode = \"hold\"\n");
  CHECK_THROWS_WITH_AS(set_config_key("park = { standby = true }\n", "park.mode", "\"hold\""),
                       "[park] is written as an inline table or with dotted keys; add 'mode' to "
                       "it by hand",
                       ConfigError);
  CHECK_THROWS_AS(set_config_key("[park\n", "park.mode", "\"hold\""), ConfigError);
  // Every result is a valid config with the value in force.
  CHECK(parse_config(b, "config.toml", {0, 1, 2, 3}).park_mode == ParkMode::kHold);
  CHECK(parse_config(a, "config.toml", {0, 1, 2, 3}).active_gpus == kFour);
}

TEST_CASE("config: [policy] min_gpus and [notify] are read and checked") {
  const Config c =
      parse_config("[policy]\nmin_gpus = 2\n[notify]\ncommand = \"cat >> log\"\ntimeout_s = 2.5\n",
                   "config.toml", kFour);
  CHECK(c.policy.min_gpus == 2);
  CHECK(c.notify.command == "cat >> log");
  CHECK(c.notify.timeout == std::chrono::milliseconds(2500));
  CHECK_THROWS_WITH_AS(parse_config("[policy]\nmin_gpus = 5\n", "config.toml", kFour),
                       "config.toml:2:12: policy.min_gpus: 5 is out of range; allowed: an "
                       "integer from 0 to 4 (the GPUs a config may name)",
                       ConfigError);
  CHECK_THROWS_AS(parse_config("[notify]\ncommand = \"\"\n", "config.toml", kFour), ConfigError);
  CHECK_THROWS_AS(parse_config("[notify]\ntimeout_s = 0\n", "config.toml", kFour), ConfigError);
}

TEST_CASE("ForeignGpus: another's process makes a GPU yielded; back after reclaim_after") {
  ForeignGpus f;
  ForeignGpus::Probe probe;
  probe.owner = [](unsigned pid) {
    return pid == 100   ? ForeignGpus::Owner::kOurs
           : pid == 999 ? ForeignGpus::Owner::kUnknown
                        : ForeignGpus::Owner::kForeign;
  };
  probe.describe = [](unsigned pid) { return "pid " + std::to_string(pid) + " (bob)"; };
  // Ours and an unseen pid are nobody's: nothing yielded.
  CHECK(f.update({{0, {{100, 1 << 30}}}, {1, {{999, 1 << 20}}}}, 0, probe, 1000).empty());
  auto ch = f.update({{0, {{100, 1 << 30}}}, {1, {{4242, 2048ull << 20}}}}, 10, probe, 1000);
  REQUIRE(ch.size() == 1);
  CHECK(ch[0].event == "yield");
  CHECK(ch[0].gpu == 1);
  CHECK(ch[0].who == "pid 4242 (bob), 2048 MiB");
  CHECK(f.yielded() ==
        std::vector<std::pair<int, std::string>>{{1, "yielded to pid 4242 (bob), 2048 MiB"}});
  // Still there: no new change. A listing without GPU 1 (unreadable) keeps it yielded.
  CHECK(f.update({{1, {{4242, 1}}}}, 500, probe, 1000).empty());
  CHECK(f.update({{0, {}}}, 5000, probe, 1000).empty());
  CHECK(f.yielded().size() == 1);
  // Gone at t=6000: still yielded until reclaim_after (1000 ms) of no foreign process.
  CHECK(f.update({{1, {}}}, 6000, probe, 1000).empty());
  CHECK(f.update({{1, {}}}, 6999, probe, 1000).empty());
  CHECK(f.yielded().size() == 1);
  // Back within the window: the clock starts again.
  CHECK(f.update({{1, {{4242, 1}}}}, 6999, probe, 1000).empty());
  CHECK(f.update({{1, {}}}, 7500, probe, 1000).empty());
  ch = f.update({{1, {}}}, 8500, probe, 1000);
  REQUIRE(ch.size() == 1);
  CHECK(ch[0].event == "yield_end");
  CHECK(f.yielded().empty());
}

TEST_CASE("effective_set: yielded GPUs leave too; min_gpus bounds leases and yields together") {
  const std::vector<std::pair<int, std::string>> y = {{1, "yielded to pid 7 (bob), 1 MiB"}};
  CHECK(effective_set(kFour, {}, 0, 0, nullptr, y).active == std::vector<int>{0, 2, 3});
  // The floor keeps a lent GPU before the yielded one (another user's process runs there).
  const EffectiveSet e = effective_set(kFour, {lease({2, 3}, std::nullopt)}, 0, 2, nullptr, y);
  CHECK(e.active == std::vector<int>{0, 2});
  REQUIRE(e.kept.size() == 1);
  CHECK(e.kept[0].first == 2);
  CHECK(parse_config("[policy]\nyield_to_foreign = true\nreclaim_after_s = 2.5\n", "c", kFour)
            .policy.reclaim_after == std::chrono::milliseconds(2500));
  CHECK_THROWS_AS(parse_config("[policy]\nyield_to_foreign = 1\n", "c", kFour), ConfigError);
  CHECK_THROWS_AS(parse_config("[policy]\nreclaim_after_s = 0\n", "c", kFour), ConfigError);
}
