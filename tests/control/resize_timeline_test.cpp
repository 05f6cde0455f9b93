#include "control/resize_timeline.hpp"

#include <doctest/doctest.h>

#include <boost/json.hpp>

using gpurun::control::Decision;
using gpurun::control::ResizeTimeline;
namespace json = boost::json;

namespace {

Decision grow() {  // [0] -> [0, 1], the state from gpu 0
  Decision d;
  d.kind = Decision::Kind::kResize;
  d.generation = 1;
  d.prev_generation = 0;
  d.active = {0, 1};
  d.joiners = {1};
  return d;
}

json::object event_of(ResizeTimeline& t) {
  auto ready = t.take_ready();
  REQUIRE(ready.size() == 1);
  return json::parse(ready[0].str()).as_object();
}

}  // namespace

TEST_CASE("a grow's event: gpurun's moments and every rank's marks on one critical path") {
  double now = 1000;
  ResizeTimeline t([&] { return now; });
  t.config_seen();  // 1000
  now = 1500;
  t.decision_written(grow());  // 1500: waited 500 ms for the boundary
  t.decision_written(grow());  // the start record of the same generation: ignored
  now = 1510;
  t.spawned(1, 42);
  CHECK(t.on_record(
      1, 0,
      R"({"v":1,"gpu":0,"pid":7,"role":"source","bytes":64,"marks":)"
      R"({"seen":1501,"ready":1501,"comm":1900,"state":1905,"checksum":1906,"resumed":1907}})"));
  CHECK(t.take_ready().empty());  // gpu 1 not yet
  CHECK(t.on_record(
      1, 1,
      R"({"v":1,"gpu":1,"pid":42,"role":"joiner","bytes":64,"marks":)"
      R"({"seen":1700,"ready":1890,"comm":1900,"state":1905,"checksum":1906,"resumed":1908}})"));
  const json::object e = event_of(t);
  CHECK(e.at("kind").as_string() == "grow");
  CHECK(e.at("origin").as_string() == "config seen");
  CHECK(e.at("total_ms").to_number<double>() == doctest::Approx(908));
  const json::object& p = e.at("phases_ms").as_object();
  CHECK(p.at("decision").to_number<double>() == doctest::Approx(500));
  CHECK(p.at("spawned").to_number<double>() == doctest::Approx(10));
  CHECK(p.at("ready").to_number<double>() == doctest::Approx(380));  // the joiner's start-up
  CHECK(p.at("comm").to_number<double>() == doctest::Approx(10));
  CHECK(p.at("resumed").to_number<double>() == doctest::Approx(2));
  CHECK(e.at("complete").as_bool());
  CHECK(e.at("ranks").as_array().size() == 2);
  CHECK(e.at("ranks").as_array()[1].at("ms").at("spawned").to_number<double>() ==
        doctest::Approx(510));
  CHECK(json::parse(t.last()) == json::value(e));
  const auto lines = ResizeTimeline::describe(t.last());
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].rfind("last resize: generation 1 grow [0] -> [0, 1]: 908 ms", 0) == 0);
  CHECK(lines[2].rfind("  gpu 1 joiner: spawned 510, seen 700", 0) == 0);
}

TEST_CASE("a participant that dies without its record: the event says which one is missing") {
  double now = 0;
  ResizeTimeline t([&] { return now; });
  t.decision_written(grow());
  t.spawned(1, 42);
  CHECK(t.on_record(1, 0, R"({"role":"source","marks":{"ready":1,"resumed":5}})"));
  t.slot_gone(1, 41);  // an older process of the slot: the spawned one is still awaited
  CHECK(t.take_ready().empty());
  t.slot_gone(1, 42);
  const json::object e = event_of(t);
  CHECK(e.at("origin").as_string() == "decision");  // no config asked for it
  CHECK(!e.at("complete").as_bool());
  CHECK(json::serialize(e.at("missing")) == "[1]");
}

TEST_CASE("timing: bad records") {  // the keys: keys_test.cpp
  ResizeTimeline t([] { return 0.0; });
  CHECK(!t.on_record(1, 0, R"({"marks":{}})"));  // no open generation
  t.decision_written(grow());
  CHECK(!t.on_record(1, 0, "not json"));
  CHECK(!t.on_record(1, 0, R"({"marks":{"ready":"soon"}})"));
  t.flush();
  CHECK(json::serialize(event_of(t).at("missing")) == "[0,1]");
}

TEST_CASE("a hold-mode rank woken by a resume: its launch's spawn is no phase of the resume") {
  double now = 100;
  ResizeTimeline t([&] { return now; });
  t.spawned(0, 7);  // the launch: no resize open
  now = 9000;
  t.config_seen();  // active_gpus = [0] after a pause to []
  Decision resume;
  resume.kind = Decision::Kind::kResize;
  resume.generation = 2;
  resume.prev_generation = 1;
  resume.active = {0};
  resume.joiners = {0};
  now = 9001;
  t.decision_written(resume);
  CHECK(t.on_record(2, 0,
                    R"({"v":1,"gpu":0,"pid":7,"role":"joiner","bytes":64,"marks":)"
                    R"({"seen":9002,"ready":9002,"state":9003,"comm":9005,"resumed":9010}})"));
  const json::object e = event_of(t);
  CHECK(e.at("total_ms").to_number<double>() == doctest::Approx(10));
  const json::object& p = e.at("phases_ms").as_object();
  CHECK_FALSE(p.contains("spawned"));
  CHECK(p.at("decision").to_number<double>() == doctest::Approx(1));  // the first phase
  CHECK_FALSE(e.at("ranks").as_array()[0].at("ms").as_object().contains("spawned"));
}

TEST_CASE(
    "gpurun status's resize lines: fractional ms as 1630.2, lists as [0, 1], a pause ends paused") {
  double now = 1000.25;
  ResizeTimeline t([&] { return now; });
  t.config_seen();
  Decision pause;
  pause.kind = Decision::Kind::kResize;
  pause.generation = 1;
  pause.prev_generation = 0;
  pause.leavers = {0, 1};
  now = 2630.45;
  t.decision_written(pause);
  for (int gpu : {0, 1})
    CHECK(t.on_record(
        1, gpu,
        R"({"v":1,"gpu":)" + std::to_string(gpu) +
            R"(,"pid":7,"role":"leaver","bytes":0,"marks":{"seen":2630.62,"left":4918.902}})"));
  (void)t.take_ready();
  const auto lines = ResizeTimeline::describe(t.last());
  REQUIRE(lines.size() == 3);
  INFO(lines[0]);
  CHECK(
      lines[0].rfind("last resize: generation 1 pause [0, 1] -> []: 3918.7 ms from the config seen "
                     "to paused (phases, ms: decision 1630.2, left 2288.5)",
                     0) == 0);
  CHECK(lines[0].find("E3") == std::string::npos);
  CHECK(lines[1] == "  gpu 0 leaver: seen 1630.4, left 3918.7");
}

TEST_CASE("another node's record is moved onto node 0's clock by its offset") {
  // Node 1's host clock reads 1,000,000 ms less than node 0's (NodeHub::clock_offset_ms).
  double now = 1000;
  ResizeTimeline t([&] { return now; });
  t.config_seen();
  now = 1500;
  t.decision_written(grow());
  CHECK(t.on_record(1, 0, R"({"role":"source","marks":{"comm":1900,"resumed":1907}})"));
  CHECK(t.on_record(1, 1, R"({"role":"joiner","marks":{"ready":890,"comm":900,"resumed":908}})",
                    1000.0));
  const json::object e = event_of(t);
  CHECK(e.at("total_ms").to_number<double>() == doctest::Approx(908));  // not -92
  const json::object& p = e.at("phases_ms").as_object();
  CHECK(p.at("ready").to_number<double>() == doctest::Approx(390));
  CHECK(e.at("ranks").as_array()[1].at("ms").at("ready").to_number<double>() ==
        doctest::Approx(890));
}
