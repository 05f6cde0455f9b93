// One elastic job over several nodes, node 0's side (launcher/control/node_hub.cpp): joins,
// offers, leaving, lost nodes, commands and events through node 0's store; and the scheduler
// over another node's slots (docs/cli.md#elastic-nodes).
#include "control/node_hub.hpp"

#include <chrono>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "gpurun/clock.hpp"
#include "gpurun/control/heartbeat.hpp"

#include "gpurun/control/keys.hpp"
#include "gpurun/control/node_messages.hpp"
#include "scheduler_fixture.hpp"
#include "store/backend.hpp"

using namespace gpurun::control;
using gpurun::store::Backend;

namespace {

NodeJoin join_record(int node, std::vector<int> offer = {0, 1}) {
  NodeJoin j;
  j.node = node;
  j.host = "host" + std::to_string(node);
  j.pid = 4000 + node;
  j.slots = {0, 1};
  j.offer = std::move(offer);
  j.run_id = "job";
  j.device = "cpu";
  return j;
}

// Node `node` writes its join record; the hub handles it.
NodeHub::Changes join(Backend& b, NodeHub& hub, int node, std::vector<int> offer = {0, 1}) {
  b.set(keys::node_join(node), join_record(node, std::move(offer)).to_json());
  const auto ch = hub.on_key(keys::node_join(node));
  REQUIRE(ch.has_value());
  return *ch;
}

NodeHub::Changes event(Backend& b, NodeHub& hub, int node, int64_t n, const NodeEvent& e) {
  b.set(keys::node_event(node, n), e.to_json());
  const auto ch = hub.on_key(keys::node_event(node, n));
  REQUIRE(ch.has_value());
  return *ch;
}

NodeCommand command(Backend& b, int node, int64_t n) {
  REQUIRE(b.check({keys::node_command(node, n)}));
  return NodeCommand::from_json(b.get(keys::node_command(node, n)));
}

Decision provisional() {
  Decision d;
  d.kind = Decision::Kind::kResize;
  d.generation = 1;
  d.active = {0, 1, 1000, 1001};
  d.joiners = {1000, 1001};
  return d;
}

}  // namespace

TEST_CASE("node ids: node k's slot i is k*1000+i; names say the node") {
  CHECK(job_slot(2, 3) == 2003);
  CHECK(slot_node(2003) == 2);
  CHECK(slot_local(2003) == 3);
  CHECK(slot_node(7) == 0);
  CHECK(slot_name(7) == "gpu 7");
  CHECK(slot_name(1001) == "node 1 gpu 1");
}

TEST_CASE("node keys: the hub's parser takes only node writes") {
  CHECK(keys::parse_node_write(keys::node_join(1))->kind == keys::NodeWrite::Kind::kJoin);
  CHECK(keys::parse_node_write(keys::node_offer(2))->node == 2);
  CHECK(keys::parse_node_write(keys::node_leave(3))->kind == keys::NodeWrite::Kind::kLeave);
  const auto e = keys::parse_node_write(keys::node_event(1, 7));
  REQUIRE(e);
  CHECK(e->kind == keys::NodeWrite::Kind::kEvent);
  CHECK(e->n == 7);
  CHECK(keys::parse_node_write(keys::node_lost(4))->kind == keys::NodeWrite::Kind::kLost);
  // node 0 writes its commands itself, and node 0 is never a joining node
  CHECK_FALSE(keys::parse_node_write(keys::node_command(1, 0)));
  CHECK_FALSE(keys::parse_node_write(keys::node_join(0)));
  CHECK_FALSE(keys::parse_node_write("gpurun/node/1/join/x"));
  CHECK_FALSE(keys::parse_node_write(keys::start(0)));
  CHECK_FALSE(keys::parse_node_write("gpurun/lost/node1x"));
}

TEST_CASE("node messages: every record decodes to itself; a bad one names what is wrong") {
  const NodeJoin j = join_record(1);
  CHECK(NodeJoin::from_json(j.to_json()) == j);
  NodeCommand c;
  c.kind = NodeCommand::Kind::kSpawn;
  c.slot = 1001;
  c.warm = 3;
  c.decision = provisional();
  CHECK(NodeCommand::from_json(c.to_json()) == c);
  NodeEvent e;
  e.kind = NodeEvent::Kind::kExited;
  e.slot = 1001;
  e.pid = 77;
  e.signal = 9;
  e.how = "signal SIGKILL (9)";
  CHECK(NodeEvent::from_json(e.to_json()) == e);
  CHECK_THROWS_WITH_AS(NodeJoin::from_json("{\"v\":1,\"node\":1}"),
                       doctest::Contains("lacks the string field 'host'"), ProtocolError);
  CHECK_THROWS_WITH_AS(NodeEvent::from_json("{\"v\":2}"), doctest::Contains("version 1"),
                       ProtocolError);
  NodeJoin bad = join_record(1);
  bad.offer = {-1};
  CHECK_THROWS_WITH_AS(NodeJoin::from_json(bad.to_json()),
                       doctest::Contains("names local slot -1 (local slots are 0 to 999)"),
                       ProtocolError);
  CHECK_THROWS_WITH_AS(NodeCommand::from_json("{\"v\":1,\"kind\":\"dance\"}"),
                       doctest::Contains("unknown kind 'dance'"), ProtocolError);
}

TEST_CASE("node hub: a join adds the node's slots and its offer; spawns go to it as commands") {
  Backend b;
  NodeHub hub(b, NodeHubOptions{"job", 0});
  CHECK(b.get(keys::node_job()) == "job");
  const NodeHub::Changes ch = join(b, hub, 1);
  CHECK(ch.new_slots == std::vector<int>{1000, 1001});
  CHECK(ch.offers_changed);
  CHECK(hub.offered() == std::vector<int>{1000, 1001});
  REQUIRE(ch.lines.size() == 1);
  CHECK(ch.lines[0].find("node 1 (host1, gpurun pid 4001) joined") != std::string::npos);

  const int pid = hub.spawn(1001, -1, 5, false, provisional());
  CHECK(pid > 0);
  CHECK(hub.remote_pid(pid));
  CHECK(hub.remote_processes());
  const NodeCommand c = command(b, 1, 0);
  CHECK(c.kind == NodeCommand::Kind::kSpawn);
  CHECK(c.slot == 1001);
  CHECK(c.warm == 5);
  CHECK(c.decision == provisional());

  NodeEvent started;
  started.kind = NodeEvent::Kind::kSpawned;
  started.slot = 1001;
  started.pid = 321;
  NodeHub::Changes s = event(b, hub, 1, 0, started);
  CHECK(s.started == std::vector<std::pair<int, int>>{{1001, 321}});
  CHECK_FALSE(b.check({keys::node_event(1, 0)}));  // read once
  CHECK(hub.remote_pid(321));

  hub.kill(1001);
  CHECK(command(b, 1, 1).kind == NodeCommand::Kind::kKill);

  NodeEvent ended;
  ended.kind = NodeEvent::Kind::kExited;
  ended.slot = 1001;
  ended.pid = 321;
  ended.signal = 9;
  ended.how = "signal SIGKILL (9)";
  s = event(b, hub, 1, 1, ended);
  REQUIRE(s.exits.size() == 1);
  CHECK(s.exits[0].slot == 1001);
  CHECK_FALSE(s.exits[0].clean);
  CHECK(s.exits[0].how == "signal SIGKILL (9)");
  CHECK_FALSE(hub.remote_processes());
}

TEST_CASE("node hub: a leaving node loses its offer and is released once nothing of it runs") {
  Backend b;
  NodeHub hub(b, NodeHubOptions{"job", 0});
  join(b, hub, 1);
  hub.spawn(1000, 1, -1, false, provisional());
  b.set(keys::node_leave(1), "SIGTERM");
  const NodeHub::Changes ch = *hub.on_key(keys::node_leave(1));
  CHECK(ch.offers_changed);
  CHECK(hub.offered().empty());
  REQUIRE(ch.lines.size() == 1);
  CHECK(ch.lines[0].find("is leaving the job (SIGTERM)") != std::string::npos);
  hub.release_idle([](int) { return false; });
  CHECK_FALSE(b.check({keys::node_command(1, 1)}));  // its process still runs
  NodeEvent ended;
  ended.kind = NodeEvent::Kind::kExited;
  ended.slot = 1000;
  ended.pid = 5;
  event(b, hub, 1, 0, ended);
  hub.release_idle([](int) { return true; });  // the scheduler still counts a process
  CHECK_FALSE(b.check({keys::node_command(1, 1)}));
  hub.release_idle([](int) { return false; });
  CHECK(command(b, 1, 1).kind == NodeCommand::Kind::kRelease);
  CHECK(hub.live_nodes() == 0);
  // its disconnect afterwards is no loss: status.json keeps it released
  b.set(keys::node_lost(1), "1");
  CHECK(hub.on_key(keys::node_lost(1))->lines.empty());
  CHECK(hub.status_json().find("\"state\": \"released\"") != std::string::npos);
}

TEST_CASE("node hub: a leaving node the controller keeps (its pause snapshot) is released later") {
  Backend b;
  NodeHub hub(b, NodeHubOptions{"job", 0});
  join(b, hub, 1);
  b.set(keys::node_leave(1), "SIGTERM");
  hub.on_key(keys::node_leave(1));
  std::vector<int> asked;
  bool keep = true;
  const auto keeps = [&](int node) {
    asked.push_back(node);
    return keep;
  };
  hub.release_idle([](int) { return false; }, keeps);
  CHECK(asked == std::vector<int>{1});
  CHECK_FALSE(b.check({keys::node_command(1, 0)}));  // kept: no release yet
  CHECK(hub.live(1));
  keep = false;  // node 0 has its copy now
  hub.release_idle([](int) { return false; }, keeps);
  CHECK(command(b, 1, 0).kind == NodeCommand::Kind::kRelease);
  CHECK_FALSE(hub.live(1));
}

TEST_CASE("node hub: a node whose config offers nothing stays in the job (no release)") {
  Backend b;
  NodeHub hub(b, NodeHubOptions{"job", 0});
  join(b, hub, 1, {});
  CHECK(hub.offered().empty());
  hub.release_idle([](int) { return false; });
  CHECK_FALSE(b.check({keys::node_command(1, 0)}));
  b.set(keys::node_offer(1), "1");
  CHECK(hub.on_key(keys::node_offer(1))->offers_changed);
  CHECK(hub.offered() == std::vector<int>{1001});
  b.set(keys::node_offer(1), "1,7");  // a slot it does not have is not offered
  hub.on_key(keys::node_offer(1));
  CHECK(hub.offered() == std::vector<int>{1001});
}

TEST_CASE(
    "node hub: a lost node's live processes end with the loss named; later events are "
    "no second end") {
  Backend b;
  NodeHub hub(b, NodeHubOptions{"job", 0});
  join(b, hub, 1);
  join(b, hub, 2);
  hub.spawn(1000, 1, -1, false, provisional());
  hub.spawn(1001, 1, -1, false, provisional());
  hub.spawn(2000, 1, -1, false, provisional());
  b.set(keys::node_lost(1), "123");
  const NodeHub::Changes ch = *hub.on_key(keys::node_lost(1));
  REQUIRE(ch.exits.size() == 2);
  CHECK(ch.exits[0].slot == 1000);
  CHECK(ch.exits[1].slot == 1001);
  CHECK_FALSE(ch.exits[0].clean);
  CHECK(ch.exits[0].how.find("the loss of node 1 (host1") != std::string::npos);
  CHECK(ch.offers_changed);
  CHECK(hub.offered() == std::vector<int>{2000, 2001});
  CHECK(hub.remote_processes());                              // node 2's
  CHECK(hub.spawn(1000, 2, -1, false, provisional()) == -1);  // nobody to start it
  NodeEvent late;
  late.kind = NodeEvent::Kind::kExited;
  late.slot = 1000;
  late.pid = 9;
  CHECK(event(b, hub, 1, 0, late).exits.empty());
}

TEST_CASE("node hub: a node beyond --nnodes MAX is refused with an exit command") {
  Backend b;
  NodeHub hub(b, NodeHubOptions{"job", 2});  // node 0 and one more
  CHECK_FALSE(join(b, hub, 1).new_slots.empty());
  const NodeHub::Changes ch = join(b, hub, 2);
  CHECK(ch.new_slots.empty());
  REQUIRE(ch.lines.size() == 1);
  CHECK(ch.lines[0].find("is refused: the job already has 2 nodes, the most --nnodes allows (2)") !=
        std::string::npos);
  const NodeCommand c = command(b, 2, 0);
  CHECK(c.kind == NodeCommand::Kind::kExit);
  CHECK(c.code == 1);
  // The joining node waits for this answer before it says anything (join_elastic_job).
  CHECK(b.get(keys::node_answer(1)) == "admitted");
  CHECK(b.get(keys::node_answer(2)) ==
        "refused: the job already has 2 nodes, the most --nnodes allows (2)");
  CHECK(hub.status_json().find("\"node\": 2, \"host\": \"host2\", \"pid\": 4002, "
                               "\"state\": \"refused\"") != std::string::npos);
}

TEST_CASE("node hub: every live node is told each generation (its workers' console names)") {
  Backend b;
  NodeHub hub(b, NodeHubOptions{"job", 0});
  join(b, hub, 1);
  join(b, hub, 2);
  b.set(keys::node_lost(2), "1");
  hub.on_key(keys::node_lost(2));
  hub.generation(4, {0, 1, 1000, 1001});
  const NodeCommand c = command(b, 1, 0);
  CHECK(c.kind == NodeCommand::Kind::kGeneration);
  CHECK(c.generation == 4);
  REQUIRE(c.decision);
  CHECK(c.decision->active == std::vector<int>{0, 1, 1000, 1001});
  CHECK(NodeCommand::from_json(c.to_json()) == c);
  CHECK_FALSE(b.check({keys::node_command(2, 0)}));  // lost: told nothing
}

TEST_CASE("node hub: the job's end tells every live node to exit, once") {
  Backend b;
  NodeHub hub(b, NodeHubOptions{"job", 0});
  join(b, hub, 1);
  join(b, hub, 2);
  b.set(keys::node_lost(2), "1");
  hub.on_key(keys::node_lost(2));
  hub.job_ended(0, "the job finished");
  const NodeCommand c = command(b, 1, 0);
  CHECK(c.kind == NodeCommand::Kind::kExit);
  CHECK(c.code == 0);
  CHECK_FALSE(b.check({keys::node_command(2, 0)}));
  hub.job_ended(0, "again");
  CHECK_FALSE(b.check({keys::node_command(1, 1)}));
}

TEST_CASE("scheduler: another node's slots join as warm joiners once a config names them") {
  gpurun::control::testing::Harness h(gpurun::control::testing::cfg(std::nullopt), 2);
  h.join_all();
  h.s.add_slots({1000, 1001});
  CHECK(h.state(1000) == SlotState::kParked);
  h.s.config_loaded(gpurun::control::testing::cfg(std::vector<int>{0, 1, 1000, 1001}), "c");
  h.drain();
  CHECK(h.state(1000) == SlotState::kWarming);
  CHECK(h.state(1001) == SlotState::kWarming);
  const Decision d = h.boundary(0);
  CHECK(d.kind == Decision::Kind::kResize);
  CHECK(d.active == std::vector<int>{0, 1, 1000, 1001});
  CHECK(d.joiners == std::vector<int>{1000, 1001});
  CHECK(d.rank_of(1000) == 2);
}

TEST_CASE("scheduler: messages name another node's slot by its node and GPU") {
  gpurun::control::testing::Harness h(gpurun::control::testing::cfg(std::nullopt), 2);
  h.join_all();
  h.s.add_slots({1000, 1001});
  h.s.config_loaded(gpurun::control::testing::cfg(std::vector<int>{0, 1, 1000, 1001}), "c");
  h.drain();
  h.boundary(0);
  h.join_all();
  h.log.clear();
  CHECK(h.s.on_process_exit(1001, false, "signal SIGKILL (9)", false));
  h.drain();
  bool said = false;
  for (const Effect& e : h.log)
    if (e.kind == Effect::Kind::kSay &&
        e.value.find("node 1 gpu 1 (rank 3 of generation 1, pid") != std::string::npos)
      said = true;
  CHECK(said);
}

TEST_CASE("scheduler: a resume onto another node waits for its copy of the pause snapshot") {
  using gpurun::control::testing::cfg;
  gpurun::control::testing::Harness h(cfg(std::nullopt), 2);
  h.join_all();
  h.s.add_slots({1000, 1001});
  std::vector<std::vector<int>> asked;
  bool copied = false;
  h.s.resume_gate = [&](const std::vector<int>& target) {
    asked.push_back(target);
    return copied;
  };
  CHECK(h.s.snapshot_node() == -1);
  h.s.config_loaded(cfg(std::vector<int>{}), "c");  // pause: gpu 0 writes the snapshot
  h.drain();
  h.boundary(0);
  for (int gpu : {0, 1}) CHECK(h.s.on_process_exit(gpu, true, "exit code 0", false));
  h.drain();
  REQUIRE(h.s.holds_job_open());
  CHECK(h.s.snapshot_node() == 0);
  CHECK(h.s.snapshot_serial() == 1);
  const size_t decisions = h.decisions.size();
  h.s.config_loaded(cfg(std::vector<int>{1000, 1001}), "c");  // resume on node 1
  h.drain();
  REQUIRE_FALSE(asked.empty());
  CHECK(asked.back() == std::vector<int>{1000, 1001});
  CHECK(h.s.holds_job_open());  // no resume before the copy
  CHECK(h.decisions.size() == decisions);
  copied = true;
  h.s.try_resume();
  h.drain();
  CHECK_FALSE(h.s.holds_job_open());
  CHECK(h.decisions.back().active == std::vector<int>{1000, 1001});
  CHECK(h.decisions.back().state_source.is_snapshot());
}

TEST_CASE("node hub: a snapshot copy is a command to the node; its answer comes back") {
  Backend b;
  NodeHub hub(b, NodeHubOptions{"job", 0});
  NodeJoin j = join_record(1);
  j.snapshot_endpoint = "10.0.0.2:4567";
  b.set(keys::node_join(1), j.to_json());
  hub.on_key(keys::node_join(1));
  CHECK(hub.snapshot_endpoint(1) == "10.0.0.2:4567");
  CHECK(hub.fetch_snapshot(1, "10.0.0.1:999", 3));
  const NodeCommand c = command(b, 1, 0);
  CHECK(c.kind == NodeCommand::Kind::kFetchSnapshot);
  CHECK(c.endpoint == "10.0.0.1:999");
  CHECK(c.serial == 3);
  NodeEvent done;
  done.kind = NodeEvent::Kind::kSnapshotFetched;
  done.serial = 3;
  done.bytes = 1000;
  done.ms = 5;
  const NodeHub::Changes ch = event(b, hub, 1, 0, done);
  REQUIRE(ch.fetched.size() == 1);
  CHECK(ch.fetched[0].first == 1);
  CHECK(ch.fetched[0].second == done);
  CHECK(ch.lines.empty());
  CHECK_FALSE(hub.fetch_snapshot(2, "x", 3));  // no such node
}

TEST_CASE("scheduler: a leaving node's released slots get no standby; a running one is ended") {
  using gpurun::control::testing::standby;
  gpurun::control::testing::Harness h(standby(std::nullopt), 2);
  h.join_all();
  h.s.add_slots({1000, 1001});
  h.s.config_loaded(standby(std::vector<int>{0, 1, 1000, 1001}), "c");
  h.drain();
  h.boundary(0);
  h.join_all();
  // Node 1 is leaving: its offer is gone and its slots are withdrawn.
  h.s.withdraw_slots({1000, 1001});
  h.s.config_loaded(standby(std::vector<int>{0, 1}), "c");
  h.drain();
  const Decision d = h.boundary(1);
  CHECK(d.leavers == std::vector<int>{1000, 1001});
  CHECK(h.s.on_process_exit(1000, true, "exit code 0", false));
  CHECK(h.s.on_process_exit(1001, true, "exit code 0", false));
  h.drain();
  CHECK(h.standbys.empty());  // before: a standby each, on the node that is going
  CHECK(h.s.slots().at(1000).pid == -1);

  // A slot of node 0 that leaves still gets its standby (one-node behaviour unchanged).
  h.s.config_loaded(standby(std::vector<int>{0}), "c");
  h.drain();
  h.boundary(2);
  CHECK(h.s.on_process_exit(1, true, "exit code 0", false));
  h.drain();
  CHECK(h.standbys == std::vector<int>{1});
  // Withdrawing a slot whose standby runs ends it.
  h.killed.clear();
  h.s.withdraw_slots({1});
  h.drain();
  CHECK(h.killed == std::vector<int>{1});
}

TEST_CASE("scheduler: a leaving node's rank ended by KeyboardInterrupt is a lost rank") {
  using gpurun::control::testing::cfg;
  gpurun::control::testing::Harness h(cfg(std::nullopt), 2);
  h.join_all();
  h.s.add_slots({1000, 1001});
  h.s.config_loaded(cfg(std::vector<int>{0, 1, 1000, 1001}), "c");
  h.drain();
  h.boundary(0);
  h.join_all();
  // Ctrl-C twice on node 1: it left (withdrawn), then its ranks were stopped at once.
  h.s.withdraw_slots({1000, 1001});
  h.s.on_program_error(1000, h.s.slots().at(1000).pid, "KeyboardInterrupt");
  h.log.clear();
  CHECK(h.s.on_process_exit(1000, false, "signal SIGINT (2)", false));  // absorbed
  h.drain();
  std::string said;
  for (const Effect& e : h.log)
    if (e.kind == Effect::Kind::kSay) said += e.value + "\n";
  INFO(said);
  CHECK(said.find("the job fails") == std::string::npos);
  CHECK(said.find("node 1 gpu 0 (rank 2 of generation 1, pid") != std::string::npos);
  // Another error of such a rank is still the program's.
  h.s.on_program_error(1001, h.s.slots().at(1001).pid, "ValueError: bad batch");
  CHECK_FALSE(h.s.on_process_exit(1001, false, "exit code 1", false));
}

TEST_CASE("scheduler: programs of different lengths: the end names both sides, once") {
  using gpurun::control::testing::cfg;
  using gpurun::control::testing::said;
  for (const bool report_first : {false, true}) {
    CAPTURE(report_first);
    gpurun::control::testing::Harness h(cfg(std::nullopt), 2);
    h.join_all();
    h.s.add_slots({1000, 1001});
    h.s.config_loaded(cfg(std::vector<int>{0, 1, 1000, 1001}), "c");
    h.drain();
    h.boundary(0);
    h.join_all();
    h.boundary(1);
    // Node 1's program ends after epoch 3 (--epochs 3); node 0's reaches the boundary after
    // epoch 3 to go on (--epochs 8), before or after node 1's exits.
    if (report_first) {
      h.report(0, 2);
      h.report(1, 2);
    }
    h.s.on_process_exit(1000, true, "exit code 0", false);
    h.s.on_process_exit(1001, true, "exit code 0", false);
    if (!report_first) {
      h.report(0, 2);
      h.report(1, 2);
    }
    h.drain();
    // Said at the first report after the exit (the others' may never come).
    const std::string want =
        std::string(
            "the ranks' programs disagree on how long to train: node 1 gpu 0 (rank 2) "
            "finished training where gpu 0 (rank 0)") +
        (report_first ? ", gpu 1 (rank 1)" : "") +
        " reached the boundary after epoch 3 to go on (their program has more epochs or steps: "
        "compare the program's arguments, e.g. --epochs, on every node)";
    CHECK(said(h, want));
    CHECK(h.s.disagreement().find(want) == 0);
    size_t n = 0;
    for (const Effect& e : h.log)
      n += e.kind == Effect::Kind::kSay && e.value.find("disagree") != std::string::npos;
    CHECK(n == 1);
  }
  // The same program everywhere: nobody reports after the last epoch, nothing is said.
  gpurun::control::testing::Harness h(cfg(std::nullopt), 2);
  h.join_all();
  h.boundary(0);
  h.s.on_process_exit(0, true, "exit code 0", false);
  h.s.on_process_exit(1, true, "exit code 0", false);
  h.drain();
  CHECK(h.s.disagreement().empty());
  CHECK_FALSE(said(h, "disagree"));
}

TEST_CASE("scheduler: the job's end is said once, with the warm joiners it ends") {
  using gpurun::control::testing::cfg;
  gpurun::control::testing::Harness h(cfg(std::nullopt), 2);
  h.join_all();
  h.boundary(0);
  // Node 1 joined late: its slots are still warming when gpu 0's program ends.
  h.s.add_slots({1000, 1001});
  h.s.config_loaded(cfg(std::vector<int>{0, 1, 1000, 1001}), "c");
  h.drain();
  REQUIRE(h.state(1000) == SlotState::kWarming);
  h.log.clear();
  h.s.on_process_exit(0, true, "exit code 0", false);
  h.drain();
  std::vector<std::string> lines;
  for (const Effect& e : h.log)
    if (e.kind == Effect::Kind::kSay) lines.push_back(e.value);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("gpu 0 (rank 0) finished training (exit code 0): the job is finishing; "
                      "workers at boundary round 1 of generation 0 are told to exit; ending "
                      "warming node 1 gpu 0 (pid ") == 0);
  CHECK(lines[0].find("), warming node 1 gpu 1 (pid ") != std::string::npos);
  CHECK(h.killed == std::vector<int>{1000, 1001});
}

TEST_CASE("node hub: a node's clock offset from its join record, for its resize timings") {
  Backend b;
  NodeHub hub(b, NodeHubOptions{"job", 0}, [] { return 5000.0; });
  NodeJoin j = join_record(1);
  j.monotonic_ms = 1200.5;
  b.set(keys::node_join(1), j.to_json());
  hub.on_key(keys::node_join(1));
  CHECK(hub.clock_offset_ms(1) == doctest::Approx(3799.5));
  CHECK(hub.clock_offset_ms(0) == 0);
  CHECK(hub.clock_offset_ms(7) == 0);
  CHECK(NodeJoin::from_json(j.to_json()).monotonic_ms == doctest::Approx(1200.5));
}

namespace {

// Node 0's hub with --node-timeout 3 s on a fake clock (ms since its start), generation 5, node
// 0 at 10.0.0.1; node k joins from 10.0.0.<k+1> unless `address` says otherwise.
struct BeatingHub {
  Backend b;
  gpurun::FakeClock clock;
  const gpurun::Clock::TimePoint t0 = clock.now();
  NodeHub hub{b, options(), [this] {
                return std::chrono::duration<double, std::milli>(clock.now() - t0).count();
              }};
  static NodeHubOptions options() {
    NodeHubOptions o{"job", 0};
    o.node_timeout = std::chrono::seconds(3);
    o.own_addresses = {"10.0.0.1", "fe80::1"};
    o.generation = [] { return int64_t{5}; };
    return o;
  }
  void join_from(int node, const std::string& address) {
    NodeJoin j = join_record(node);
    j.address = address;
    b.set(keys::node_join(node), j.to_json());
    REQUIRE(hub.on_key(keys::node_join(node)).has_value());
  }
  // Node `node` writes heartbeat `value`.
  void beat(int node, int value) {
    b.set(keys::node_beat(node), std::to_string(value));
    REQUIRE(hub.on_key(keys::node_beat(node)).has_value());
  }
  void advance(int ms) { clock.advance(std::chrono::milliseconds(ms)); }
};

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("heartbeat: a node beats every min(1 s, --node-timeout / 5)") {
  using std::chrono::milliseconds;
  CHECK(heartbeat_interval(std::chrono::seconds(30)) == milliseconds(1000));
  CHECK(heartbeat_interval(std::chrono::seconds(3)) == milliseconds(600));
  CHECK(heartbeat_interval(milliseconds(20)) == milliseconds(10));
  CHECK(heartbeat_interval(milliseconds(0)) == milliseconds(1000));
  CHECK(keys::parse_node_write(keys::node_beat(2))->kind == keys::NodeWrite::Kind::kBeat);
  CHECK(keys::parse_sever(keys::sever_value({7, "10.0.0.2"})) == keys::Sever{7, "10.0.0.2"});
  CHECK(keys::parse_sever("7 fe80::1") == keys::Sever{7, "fe80::1"});
  CHECK_FALSE(keys::parse_sever("7"));
  CHECK_FALSE(keys::parse_sever("x 10.0.0.2"));
  CHECK_FALSE(keys::parse_sever("7 10.0.0.2 more"));
}

TEST_CASE("node hub: a node whose heartbeat stops is lost after --node-timeout, as if it closed") {
  BeatingHub h;
  h.join_from(1, "10.0.0.2");
  h.join_from(2, "10.0.0.3");
  h.hub.spawn(1000, 5, -1, false, provisional());
  h.hub.spawn(1001, 5, -1, false, provisional());
  // Both beat every second for 10 s: nobody is lost.
  for (int i = 1; i <= 10; ++i) {
    h.advance(1000);
    h.beat(1, i);
    h.beat(2, i);
    CHECK_FALSE(h.hub.check_heartbeats().any());
  }
  // Node 1's link is cut at 10 s: its counter stops (a repeat of the same value is no beat).
  for (int i = 1; i <= 2; ++i) {
    h.advance(1000);
    h.beat(1, 10);
    h.beat(2, 10 + i);
    CHECK_FALSE(h.hub.check_heartbeats().any());
  }
  h.advance(999);  // 2.999 s silent
  CHECK_FALSE(h.hub.check_heartbeats().any());
  h.advance(1);  // 3 s: lost, as a closed connection is (the same changes)
  const NodeHub::Changes ch = h.hub.check_heartbeats();
  CHECK(ch.withdrawn == std::vector<int>{1000, 1001});
  CHECK(ch.offers_changed);
  REQUIRE(ch.exits.size() == 2);
  CHECK(ch.exits[0].slot == 1000);
  CHECK_FALSE(ch.exits[0].clean);
  CHECK(has(ch.exits[0].how,
            "the loss of node 1 (host1, gpurun pid 4001) (its gpurun sent no "
            "heartbeat for 3 s (--node-timeout 3 s)"));
  REQUIRE_FALSE(ch.lines.empty());
  CHECK(has(ch.lines[0],
            "node 1 (host1, gpurun pid 4001) was lost: its gpurun sent no heartbeat for 3 s "
            "(--node-timeout 3 s): its link to node 0 is cut, or its host stopped or hung; the "
            "job goes on without its slots"));
  CHECK_FALSE(h.hub.live(1));
  CHECK(h.hub.live(2));
  CHECK(h.hub.offered() == std::vector<int>{2000, 2001});
  CHECK(has(h.hub.status_json(),
            "\"state\": \"lost\", \"slots\": [1000,1001], \"offer\": [], \"lost\": \"its gpurun "
            "sent no heartbeat for 3 s"));
  // Its address is severed for the generation in force; should its link come back, it exits.
  CHECK(h.b.get(keys::sever(0)) == "5 10.0.0.2");
  CHECK(has(ch.lines.back(), "shut down their connections to 10.0.0.2"));
  const NodeCommand c = command(h.b, 1, 2);      // after its two spawns
  CHECK(c.kind == NodeCommand::Kind::kGivenUp);  // not "the job ended": it goes on
  CHECK(has(c.reason, "its gpurun sent no heartbeat for 3 s"));
  CHECK(NodeCommand::from_json(c.to_json()) == c);
  // Its connection closing later, a late heartbeat, another check: nothing more.
  h.b.set(keys::node_lost(1), "1");
  CHECK_FALSE(h.hub.on_key(keys::node_lost(1))->any());
  h.beat(1, 11);
  h.advance(1000);
  h.beat(2, 20);
  CHECK_FALSE(h.hub.check_heartbeats().any());
  CHECK_FALSE(h.b.check({keys::sever(1)}));
}

TEST_CASE("node hub: a node that never beats has one --node-timeout from its join") {
  BeatingHub h;
  h.advance(60000);
  h.join_from(1, "10.0.0.2");
  h.advance(2999);
  CHECK_FALSE(h.hub.check_heartbeats().any());
  h.advance(1);
  CHECK(h.hub.check_heartbeats().withdrawn == std::vector<int>{1000, 1001});
}

TEST_CASE("node hub: no address is severed that another live node, node 0 or loopback shares") {
  BeatingHub h;
  h.join_from(1, "10.0.0.2");
  h.join_from(2, "10.0.0.2");  // the same host as node 1
  h.join_from(3, "10.0.0.1");  // node 0's host
  h.join_from(4, "127.0.0.1");
  h.join_from(5, "");  // it did not say
  h.advance(1000);
  h.beat(2, 1);
  h.advance(2500);  // nodes 1, 3, 4, 5 silent for 3.5 s, node 2 for 2.5 s
  const NodeHub::Changes ch = h.hub.check_heartbeats();
  CHECK(ch.withdrawn.size() == 8);
  CHECK_FALSE(h.b.check({keys::sever(0)}));
  // Silent, not dead: their workers' connections stay open, and node 0 says what that costs.
  std::string said;
  for (const std::string& l : ch.lines) said += l + "\n";
  CHECK(has(said,
            "node 1 (host1, gpurun pid 4001)'s workers share the address 10.0.0.2 with "
            "this host or another node: their connections cannot be cut from here"));
  CHECK(has(said, "share the address 127.0.0.1"));
  CHECK(has(said, "share the address 10.0.0.1"));
  h.advance(1000);  // node 2 too: now nobody live has 10.0.0.2
  CHECK(h.hub.check_heartbeats().withdrawn == std::vector<int>{2000, 2001});
  CHECK(h.b.get(keys::sever(0)) == "5 10.0.0.2");
  CHECK_FALSE(h.b.check({keys::sever(1)}));
}

TEST_CASE("node hub: node 0 itself stopped gives no node up for the silence it missed") {
  BeatingHub h;
  h.join_from(1, "10.0.0.2");
  for (int i = 1; i <= 3; ++i) {
    h.advance(600);
    h.beat(1, i);
    CHECK_FALSE(h.hub.check_heartbeats().any());
  }
  // Node 0's gpurun is stopped for 5 s (SIGSTOP): no check, and node 1's beats wait unread.
  h.advance(5000);
  const NodeHub::Changes away = h.hub.check_heartbeats();
  CHECK(away.withdrawn.empty());
  REQUIRE(away.lines.size() == 1);
  CHECK(has(away.lines[0],
            "node 0's gpurun did not run for 5 s (stopped, or its host stalled): "
            "no node is given up for that"));
  CHECK(h.hub.live(1));
  // Node 1 beats again: it is watched as before; silent for a whole timeout after, it is lost.
  h.beat(1, 4);
  h.advance(600);
  CHECK_FALSE(h.hub.check_heartbeats().any());
  for (int i = 0; i < 3; ++i) {  // 2.4 s silent
    h.advance(600);
    CHECK_FALSE(h.hub.check_heartbeats().any());
  }
  h.advance(600);  // 3 s
  CHECK(h.hub.check_heartbeats().withdrawn == std::vector<int>{1000, 1001});
}

TEST_CASE("node hub: --node-timeout 0 never gives a silent node up") {
  Backend b;
  gpurun::FakeClock clock;
  NodeHubOptions o{"job", 0};
  NodeHub hub(b, o, [&clock] {
    return std::chrono::duration<double, std::milli>(clock.now().time_since_epoch()).count();
  });
  join(b, hub, 1);
  clock.advance(std::chrono::hours(1));
  CHECK_FALSE(hub.check_heartbeats().any());
  CHECK(hub.live(1));
}
