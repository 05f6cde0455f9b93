#include "gpurun/control/keys.hpp"

#include <doctest/doctest.h>

using namespace gpurun::control;

TEST_CASE("control keys carry the generation") {
  CHECK(keys::report(3, 1, 0) == "gpurun/gen/3/round/1/report/0");
  CHECK(keys::decision(3, 1) == "gpurun/gen/3/round/1/decision");
  CHECK(keys::start(4) == "gpurun/gen/4/start");
  CHECK(keys::wake(2, 5) == "gpurun/slot/2/wake/5");
  CHECK(keys::timing(12, 3) == "gpurun/gen/12/timing/3");
  CHECK(keys::static_comm(2) == "gpurun/static/2/comm/train");
}

TEST_CASE("a worker's writes parse back, typed") {
  Report r;
  r.rank = 2;
  r.gpu = 5;
  r.generation = 3;
  r.round = 1;
  r.epoch = 4;
  r.pid = 77;
  const std::vector<std::pair<keys::WorkerWrite, std::string>> writes = {
      {keys::Joined{7, 1, 4242}, "4242"},
      {keys::Reported{r}, r.to_json()},
      {keys::Parked{1, 6}, "4242"},
      {keys::Ready{2, 9}, "4242"},
      {keys::ProgramError{1, 4242, "ValueError: bad batch"}, "ValueError: bad batch"},
      {keys::Timing{12, 3, R"({"marks":{}})"}, R"({"marks":{}})"},
  };
  for (const auto& written : writes) {  // no structured binding: CAPTURE makes a lambda
    const std::string key = keys::key_of(written.first);
    CAPTURE(key);
    CHECK(keys::parse_worker_write(key, written.second) == written.first);
  }
  CHECK(keys::key_of(keys::Reported{r}) == "gpurun/gen/3/round/1/report/2");
  CHECK(keys::key_of(keys::Parked{1, 6}) == "gpurun/slot/1/parked/6");
  CHECK(keys::key_of(keys::Ready{2, 9}) == "gpurun/slot/2/ready/9");
  CHECK(keys::key_of(keys::ProgramError{1, 4242, ""}) == "gpurun/slot/1/error/4242");
  // A joined value that is no number: the pid is unknown.
  CHECK(keys::parse_worker_write("gpurun/gen/7/joined/1", "x") ==
        keys::WorkerWrite(keys::Joined{7, 1, -1}));
}

TEST_CASE("gpurun's own keys and malformed ones are no worker write") {
  for (const char* other :
       {"gpurun/gen/3/round/1/decision", "gpurun/gen/3/start", "gpurun/gen/3/abort",
        "gpurun/gen/x/joined/1", "gpurun/gen/3/joined/1x", "gpurun/gen/-3/joined/1",
        "gpurun/gen/12/timing/3x", "gpurun/gen/12/timing/-3", "gpurun/gen/3/round/1/report/",
        "gpurun/slot/2/wake/5", "gpurun/slot/2/admit/5", "gpurun/slot/2/go/5",
        "gpurun/slot/2/ready/5x", "gpurun/slot/x/ready/5", "gpurun/gen/3/comm/train/joined/1",
        "gpurun/generation", "foo"}) {
    CAPTURE(other);
    CHECK_FALSE(keys::parse_worker_write(other, "1").has_value());
  }
}

TEST_CASE("a bad boundary report is refused with its key") {
  CHECK_THROWS_WITH_AS(keys::parse_worker_write("gpurun/gen/3/round/1/report/2", "not json"),
                       "report is not a JSON object: 'not json'", ProtocolError);
  Report r;
  r.rank = 1;  // the key says rank 2
  r.generation = 3;
  r.round = 1;
  CHECK_THROWS_WITH_AS(
      keys::parse_worker_write("gpurun/gen/3/round/1/report/2", r.to_json()),
      "report under 'gpurun/gen/3/round/1/report/2' names generation 3, round 1, rank 1",
      ProtocolError);
}

TEST_CASE("an energy question's key names the slot, the pid and the question's number") {
  CHECK(keys::energy_ask(1, 4242, 7) == "gpurun/energy/1/4242/7");
  CHECK(keys::energy_answer(1, 4242, 7) == "gpurun/energy/1/4242/7/answer");
  CHECK(keys::parse_energy_ask(keys::energy_ask(1, 4242, 7)) == keys::EnergyAsk{1, 4242, 7});
  // Its answer, gpurun's own write, is not a question (the observer sees it too).
  CHECK_FALSE(keys::parse_energy_ask(keys::energy_answer(1, 4242, 7)));
  CHECK_FALSE(keys::parse_energy_ask("gpurun/energy/1/4242"));
  CHECK_FALSE(keys::parse_energy_ask("gpurun/energy/-1/4242/0"));
  CHECK_FALSE(keys::parse_energy_ask("gpurun/energy/1/x/0"));
  CHECK_FALSE(keys::parse_worker_write(keys::energy_ask(1, 4242, 7), "{}"));
}
