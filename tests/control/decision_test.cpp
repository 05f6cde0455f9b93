#include "gpurun/control/decision.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

using namespace gpurun::control;

TEST_CASE("decision: canonical JSON, documented example, round trip") {
  Decision d;
  d.kind = Decision::Kind::kResize;
  d.generation = 1;
  d.prev_generation = 0;
  d.round = 2;
  d.epoch = 2;
  d.step = 0;
  d.active = {0, 1};
  d.leavers = {2, 3};
  d.state_source = StateSource::peer(0, 0);
  const std::string want =
      R"({"v":1,"kind":"resize","generation":1,"prev_generation":0,"round":2,"epoch":2,"step":0,)"
      R"("active":[0,1],"joiners":[],"leavers":[2,3],"failed":[],"state_source":0,)"
      R"("state_source_gpu":0,"park_mode":"release","every_steps":0,"global_batch":0})";
  CHECK(d.to_json() == want);
  CHECK(Decision::from_json(want) == d);
  CHECK(d.rank_of(1) == 1);
  CHECK(d.rank_of(2) == -1);
  CHECK(d.is_leaver(3));
  Decision e;
  e.kind = Decision::Kind::kExit;
  e.generation = 4;
  CHECK(e.to_json() == R"({"v":1,"kind":"exit","generation":4})");
  CHECK(Decision::from_json(e.to_json()).kind == Decision::Kind::kExit);
  CHECK(Decision::from_json(e.to_json()).reason.empty());  // absent: unknown
}

TEST_CASE("decision: members behind the state source are on the wire only when there are any") {
  Decision d;
  d.kind = Decision::Kind::kResize;
  d.generation = 1;
  d.prev_generation = 0;
  d.epoch = 2;
  d.step = 18;
  d.active = {0, 1};
  d.failed = {2};
  d.state_source = StateSource::peer(1, 1);
  d.behind = {0};
  const std::string json = d.to_json();
  CHECK(json.size() > 13);
  CHECK(json.substr(json.size() - 14) == R"(,"behind":[0]})");
  CHECK(Decision::from_json(json) == d);
  // A decision without the field (none behind, or an older supervisor's): nobody is behind.
  d.behind.clear();
  CHECK(d.to_json().find("behind") == std::string::npos);
  CHECK(Decision::from_json(d.to_json()).behind.empty());
  std::string bad = json;
  bad.replace(bad.find("[0]}"), 4, "3}");
  CHECK_THROWS_WITH_AS(Decision::from_json(bad), doctest::Contains("array field 'behind'"),
                       ProtocolError);
}

TEST_CASE("decision: an exit carries its reason code, absent when unknown") {
  for (const char* code : {"stop", "early_stop", "finished", "state_lost", "failed"}) {
    CAPTURE(code);
    Decision e;
    e.kind = Decision::Kind::kExit;
    e.generation = 7;
    e.reason = code;
    const std::string json = e.to_json();
    CHECK(json == fmt::format(R"({{"v":1,"kind":"exit","generation":7,"reason":"{}"}})", code));
    CHECK(Decision::from_json(json) == e);
  }
  // A worker reading an exit written before reasons existed sees "unknown" (empty).
  CHECK(Decision::from_json(R"({"v":1,"kind":"exit","generation":2})").reason.empty());
  CHECK_THROWS_WITH_AS(Decision::from_json(R"({"v":1,"kind":"exit","generation":2,"reason":3})"),
                       doctest::Contains("string field 'reason'"), ProtocolError);
}

TEST_CASE("decision: state_source is a kind on the API and two integers on the wire") {
  // The wire keeps the documented sentinels (docs/control-protocol.md): rank, -1, -2.
  const std::string base =
      R"({"v":1,"kind":"resize","generation":1,"prev_generation":0,"round":0,"epoch":0,"step":0,)"
      R"("active":[0],"joiners":[0],"leavers":[],"failed":[],)";
  const std::string tail = R"(,"park_mode":"release","every_steps":0,"global_batch":0})";
  auto parse = [&](int code, int gpu) {
    return Decision::from_json(fmt::format("{}\"state_source\":{},\"state_source_gpu\":{}{}", base,
                                           code, gpu, tail))
        .state_source;
  };
  CHECK(parse(-2, -1) == StateSource::none());
  CHECK(parse(-1, -1) == StateSource::snapshot());
  CHECK(parse(3, 5) == StateSource::peer(3, 5));
  for (const StateSource& s :
       {StateSource::none(), StateSource::snapshot(), StateSource::peer(1, 4)})
    CHECK(parse(s.wire_code(), s.gpu) == s);
  CHECK(describe(StateSource::peer(1, 4)) == "gpu 4");
  CHECK(describe(StateSource::snapshot()) == "the pause snapshot");
  CHECK(describe(StateSource::none()) == "a fresh start");
  // Codes outside the protocol are refused with the numbers, not taken as some rank.
  CHECK_THROWS_WITH_AS(parse(-3, -1), doctest::Contains("state_source -3: expected a rank >= 0"),
                       ProtocolError);
  CHECK_THROWS_WITH_AS(parse(2, -1), doctest::Contains("state_source_gpu -1: expected a slot"),
                       ProtocolError);
  CHECK_THROWS_AS(StateSource::peer(-1, 0), gpurun::InvariantError);
}

TEST_CASE("decision and report parse errors name the field") {
  CHECK_THROWS_WITH_AS(Decision::from_json("nope"), "decision is not a JSON object: 'nope'",
                       ProtocolError);
  CHECK_THROWS_WITH_AS(Decision::from_json(R"({"kind":"resize"})"),
                       R"(decision lacks the integer field 'generation': '{"kind":"resize"}')",
                       ProtocolError);
  CHECK_THROWS_AS(Decision::from_json(R"({"kind":"bogus","generation":1})"), ProtocolError);
  Report r{1, 3, 2, 5, 7, 0, 4242, 1'764'000'000'123, /*has_state=*/false, /*snapshot=*/"ok"};
  CHECK(Report::from_json(r.to_json()) == r);
  // A report without time_ms (an older worker) parses, with time 0 = unknown.
  const Report old = Report::from_json(
      R"({"v":1,"rank":1,"gpu":3,"generation":2,"round":5,"epoch":7,"step":0,"pid":4242})");
  CHECK(old.time_ms == 0);
  CHECK(old.pid == 4242);
  CHECK_THROWS_WITH_AS(Report::from_json(R"({"rank":1})"),
                       R"(report lacks the integer field 'gpu': '{"rank":1}')", ProtocolError);
}

TEST_CASE("id lists parse back") {
  CHECK(parse_ids("0,2,3") == std::vector<int>{0, 2, 3});
  CHECK(parse_ids("").empty());
  CHECK_THROWS_AS(parse_ids("0,,1"), ProtocolError);
}

TEST_CASE("boundary_text: epochs counted from 1, as training programs print them") {
  CHECK(boundary_text(0, 0) == "after epoch 1");
  CHECK(boundary_text(4, 0) == "after epoch 5");
  CHECK(boundary_text(4, 120) == "in epoch 5 after step 120");
  CHECK(boundary_text(-1, -1) == "before the first epoch");
}

namespace {
/// generation_env(d, slot) as a map-like list, for a decision of `active`.
std::vector<EnvVar> env_of(std::vector<int> active, int slot) {
  Decision d;
  d.kind = Decision::Kind::kResize;
  d.generation = 4;
  d.active = std::move(active);
  return generation_env(d, slot);
}
std::vector<EnvVar> want(int rank, int world, int local_rank, int local_world, int group_rank,
                         int group_world) {
  const auto s = [](int x) { return std::to_string(x); };
  return {{"RANK", s(rank)},
          {"WORLD_SIZE", s(world)},
          {"LOCAL_RANK", s(local_rank)},
          {"LOCAL_WORLD_SIZE", s(local_world)},
          {"GROUP_RANK", s(group_rank)},
          {"GROUP_WORLD_SIZE", s(group_world)},
          {"ROLE_RANK", s(rank)},
          {"ROLE_WORLD_SIZE", s(world)}};
}
}  // namespace

TEST_CASE("generation_env: one node: LOCAL_* are the generation's rank and world, one group") {
  CHECK(env_of({0, 2, 3}, 2) == want(1, 3, 1, 3, 0, 1));
  CHECK(env_of({0, 2, 3}, 1).empty());  // not a member
}

TEST_CASE("generation_env: several nodes: GROUP_* over the active set's nodes, LOCAL_* per node") {
  // Node 0's slots 0,1 and node 1's 1000,1001 (its local 0,1).
  CHECK(env_of({0, 1, 1000, 1001}, 1) == want(1, 4, 1, 2, 0, 2));
  CHECK(env_of({0, 1, 1000, 1001}, 1000) == want(2, 4, 0, 2, 1, 2));
  CHECK(env_of({0, 1, 1000, 1001}, 1001) == want(3, 4, 1, 2, 1, 2));
  // Node 1 left and node 2 joined with three slots: node 2 is the second group, not the third.
  CHECK(env_of({1, 2000, 2001, 2002}, 1) == want(0, 4, 0, 1, 0, 2));
  CHECK(env_of({1, 2000, 2001, 2002}, 2001) == want(2, 4, 1, 3, 1, 2));
  // Node 0 (the decider) trains none of its own slots: node 1 is the only group.
  CHECK(env_of({1000, 1001}, 1001) == want(1, 2, 1, 2, 0, 1));
  CHECK(env_of({0, 1, 1000, 1001}, 1002).empty());
}
