// The slot agent of node k > 0 in an elastic job over several nodes (docs/cli.md#elastic-nodes):
// its join of node 0's store, and node 0's commands in, processes and events out, over the
// in-memory store with fake processes. The real gpurun over loopback: tests/python.
#include "nodes/node_agent.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>

#include "gpurun/control/keys.hpp"
#include "gpurun/control/node_messages.hpp"
#include "gpurun/error.hpp"
#include "nodes/node_sync.hpp"
#include "supervisor/event_log.hpp"
#include "supervisor/supervisor.hpp"
#include "testing/capture_console.hpp"
#include "testing/fake_spawner.hpp"
#include "testing/faulty_store.hpp"
#include "testing/memory_store.hpp"

namespace gpurun::supervisor {
namespace {

using namespace std::chrono_literals;
using store::testing::MemoryStore;
namespace keys = control::keys;
using control::NodeCommand;
using control::NodeEvent;

/// One connection to node 0's store (the shared MemoryStore): every request fails with a
/// StoreError once `gone` is set, as a client's does when node 0's gpurun died.
std::unique_ptr<store::Store> connection(MemoryStore& store,
                                         std::shared_ptr<std::atomic<bool>> gone) {
  return std::make_unique<store::testing::FaultyStore>(store, [gone] {
    if (*gone) throw StoreError("node0:29500: connection reset by peer");
  });
}

/// Node 1 with two slots: its supervisor on fake processes, its agent on node 0's store.
struct Node1 {
  boost::asio::io_context io;
  FakeSpawner spawner{io};
  CaptureConsole console;
  EventLog events;
  MemoryStore node0;  // node 0's store
  std::shared_ptr<std::atomic<bool>> gone = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<Supervisor> sup;
  std::unique_ptr<NodeAgent> agent;
  std::vector<std::string> said;
  std::vector<int> offer = {0, 1};
  std::vector<std::string> snapshot_paths;  // NodeAgentOptions::snapshot_files
  int64_t commands = 0;

  /// `fetch`: NodeAgentOptions::fetch_snapshot (empty: this node cannot fetch).
  explicit Node1(decltype(NodeAgentOptions::fetch_snapshot) fetch = {}) {
    SupervisorOptions o;
    o.plan.nproc = 2;
    o.plan.world_size = 2;
    o.plan.nnodes = 2;
    o.plan.node_rank = 1;
    o.plan.device = Device::kCpu;
    o.plan.run_id = "job";
    o.plan.master_addr = "node0";
    o.plan.master_port = 29500;
    // Never created: no file is written there (fake processes), a paused job's line would say
    // that it has no snapshot.
    o.plan.run_dir = "/nonexistent/gpurun-node-agent-test";
    o.argv = {"/bin/true"};
    o.grace_period = 100ms;
    o.kill_timeout = 200ms;
    o.drain_timeout = 100ms;
    o.poll_interval = 5ms;
    sup = std::make_unique<Supervisor>(io, o, spawner, console, events);
    NodeAgentOptions ao;
    ao.node = 1;
    ao.where = "node0:29500";
    ao.slots = {0, 1};
    ao.config_path = "/etc/job.toml";
    ao.joined_offer = {0, 1};
    ao.wait_slice = 20ms;
    ao.offer = [this] { return offer; };
    ao.say = [this](const std::string& line) { said.push_back(line); };
    ao.fetch_snapshot = std::move(fetch);
    ao.snapshot_files = [this] { return snapshot_paths; };
    agent =
        std::make_unique<NodeAgent>(io, *sup, connection(node0, gone), connection(node0, gone), ao);
    sup->set_controller(agent.get());
    sup->final_status = [this](int) { return agent->final_status(); };
    sup->start();
  }
  ~Node1() { agent->close(); }

  /// Node 0 sends its next command.
  void command(const NodeCommand& c) { node0.set(keys::node_command(1, commands++), c.to_json()); }
  static NodeCommand spawn(int slot) {
    NodeCommand c;
    c.kind = NodeCommand::Kind::kSpawn;
    c.slot = slot;
    c.warm = 7;
    control::Decision d;
    d.generation = 3;
    d.active = {0, 1, slot};
    c.decision = d;
    return c;
  }
  static NodeCommand simple(NodeCommand::Kind kind, int code = 0) {
    NodeCommand c;
    c.kind = kind;
    c.code = code;
    c.reason = kind == NodeCommand::Kind::kExit ? "the job finished" : "node 1 left";
    return c;
  }
  /// Runs io until `until()` holds (a safety bound of 3 s, not a check).
  void run_until(const std::function<bool()>& until) {
    const auto end = std::chrono::steady_clock::now() + 3s;
    while (!until() && std::chrono::steady_clock::now() < end) {
      io.restart();
      io.run_for(5ms);
    }
  }
  std::optional<NodeEvent> event(int64_t n) {
    const auto v = node0.try_get(keys::node_event(1, n));
    if (!v) return std::nullopt;
    return NodeEvent::from_json(*v);
  }
  bool has_event(int64_t n) { return node0.try_get(keys::node_event(1, n)).has_value(); }
  bool said_line(const std::string& part) const {
    for (const auto& l : said)
      if (l.find(part) != std::string::npos) return true;
    return false;
  }
};

ElasticJoinRequest request() {
  ElasticJoinRequest r;
  r.where = "node0:29500";
  r.host = "hostb";
  r.pid = 4242;
  r.slots = {0, 1};
  r.offer = {1};
  r.device = "cpu";
  r.job_wait = 10ms;
  r.answer_wait = 10ms;
  return r;
}

}  // namespace

TEST_CASE("node agent: a node joins node 0's elastic job: node id, live key, join record") {
  MemoryStore node0;
  SUBCASE("node 0 runs no elastic job: refused, naming the store and what to do") {
    try {
      join_elastic_job(node0, request());
      FAIL("joined a store without an elastic job");
    } catch (const JoinError& e) {
      CHECK(e.code == 1);
      CHECK(std::string(e.what()).find("node 0 at node0:29500 does not run an elastic job") !=
            std::string::npos);
      CHECK(std::string(e.what()).find("--config") != std::string::npos);
    }
    CHECK_FALSE(node0.try_get(keys::node_next()));  // no node id taken
  }
  SUBCASE("ids in join order; the live key and the join record") {
    node0.set(keys::node_job(), "job");
    node0.set(keys::node_answer(1), "admitted");  // node 0's hub admits them
    node0.set(keys::node_answer(2), "admitted");
    const ElasticJoin a = join_elastic_job(node0, request());
    const ElasticJoin b = join_elastic_job(node0, request());
    CHECK(a.node == 1);
    CHECK(b.node == 2);
    CHECK(a.run_id == "job");
    CHECK(node0.try_get(keys::node_live(1)) == std::optional<std::string>("hostb 4242"));
    const control::NodeJoin j = control::NodeJoin::from_json(*node0.try_get(keys::node_join(2)));
    CHECK(j.node == 2);
    CHECK(j.host == "hostb");
    CHECK(j.pid == 4242);
    CHECK(j.slots == std::vector<int>{0, 1});
    CHECK(j.offer == std::vector<int>{1});
    CHECK(j.device == "cpu");
  }
  SUBCASE("another run id than --rdzv-id: refused") {
    node0.set(keys::node_job(), "other");
    ElasticJoinRequest r = request();
    r.run_id = "mine";
    try {
      join_elastic_job(node0, r);
      FAIL("joined another job");
    } catch (const JoinError& e) {
      CHECK(std::string(e.what()).find("runs job 'other'") != std::string::npos);
    }
    CHECK_FALSE(node0.try_get(keys::node_join(1)));
  }
  SUBCASE("node 0 refuses it (beyond --nnodes MAX): the join fails with why, never 'joined'") {
    node0.set(keys::node_job(), "job");
    node0.set(keys::node_answer(1),
              "refused: the job already has 3 nodes, the most --nnodes allows (3)");
    try {
      join_elastic_job(node0, request());
      FAIL("a refused node joined");
    } catch (const JoinError& e) {
      CHECK(e.code == 1);
      CHECK(std::string(e.what()) ==
            "node 0 at node0:29500 refused this node (node 1): the job already has 3 nodes, the "
            "most --nnodes allows (3)");
    }
  }
  SUBCASE("node 0 does not answer: the join fails, naming the key and the wait") {
    node0.set(keys::node_job(), "job");
    try {
      join_elastic_job(node0, request());
      FAIL("joined without node 0's answer");
    } catch (const JoinError& e) {
      CHECK(std::string(e.what()).find("did not answer this node's join (node 1, "
                                       "gpurun/node/1/answer) within 10 ms") != std::string::npos);
    }
  }
}

TEST_CASE("node agent: spawn, exit and kill commands become processes and events") {
  Node1 n;
  n.command(Node1::spawn(1001));
  n.run_until([&] { return n.has_event(0); });
  REQUIRE(n.spawner.procs.size() == 1);
  const auto& env = n.spawner.procs[0]->request.env;
  CHECK(n.spawner.procs[0]->request.local_rank == 1);
  CHECK(env.at("GPURUN_SLOT") == "1001");  // the job slot id
  CHECK(env.at("GPURUN_WARM") == "7");     // a warm joiner
  CHECK(env.at("GPURUN_CONFIG") == "/etc/job.toml");
  CHECK(env.at("WORLD_SIZE") == "3");
  const NodeEvent spawned = *n.event(0);
  CHECK(spawned.kind == NodeEvent::Kind::kSpawned);
  CHECK(spawned.slot == 1001);
  CHECK(spawned.pid == n.spawner.procs[0]->pid);
  CHECK_FALSE(n.node0.try_get(keys::node_command(1, 0)));  // read once, deleted

  n.spawner.exit(0, ExitStatus{3, 0});
  n.run_until([&] { return n.has_event(1); });
  const NodeEvent ex = *n.event(1);
  CHECK(ex.kind == NodeEvent::Kind::kExited);
  CHECK(ex.slot == 1001);
  CHECK(ex.pid == spawned.pid);
  CHECK(ex.code == 3);
  CHECK(ex.how == "exit code 3");
  CHECK_FALSE(n.sup->done());  // absorbed: node 0 decides

  n.command(Node1::spawn(1000));
  n.run_until([&] { return n.has_event(2); });
  REQUIRE(n.spawner.procs.size() == 2);
  NodeCommand kill;
  kill.kind = NodeCommand::Kind::kKill;
  kill.slot = 1000;
  n.command(kill);
  n.run_until([&] { return n.has_event(3); });
  CHECK(n.spawner.procs[1]->signals == std::vector<int>{SIGKILL});
  CHECK(n.event(3)->signal == SIGKILL);
  CHECK_FALSE(n.sup->done());
}

TEST_CASE("node agent: a spawn for a slot whose process still runs is refused by an event") {
  Node1 n;
  n.command(Node1::spawn(1000));
  n.command(Node1::spawn(1000));
  n.run_until([&] { return n.has_event(1); });
  CHECK(n.spawner.procs.size() == 1);
  const NodeEvent e = *n.event(1);
  CHECK(e.kind == NodeEvent::Kind::kExited);
  CHECK(e.slot == 1000);
  CHECK(e.how == "node 1: slot busy: node 1 gpu 0's process " +
                     std::to_string(n.spawner.procs[0]->pid) + " still runs; not started again");
  // Another node's slot, or one this node does not have: refused the same way.
  n.command(Node1::spawn(2000));
  n.command(Node1::spawn(1005));
  n.run_until([&] { return n.has_event(3); });
  CHECK(n.event(2)->how.find("no ") != std::string::npos);
  CHECK(n.event(3)->how.find("its slots: gpu 0, gpu 1") != std::string::npos);
  CHECK(n.spawner.procs.size() == 1);
  CHECK_FALSE(n.sup->done());
}

TEST_CASE("node agent: release ends the node with status 0; exit with node 0's status") {
  SUBCASE("release, no process left") {
    Node1 n;
    n.command(Node1::simple(NodeCommand::Kind::kRelease));
    n.run_until([&] { return n.sup->done(); });
    REQUIRE(n.sup->done());
    CHECK(n.sup->exit_code() == 0);
    CHECK(n.said_line("node 1: node 0 released this node (node 1 left)"));
  }
  SUBCASE("exit 3 while a process runs: it is stopped, then the node exits 3") {
    Node1 n;
    n.command(Node1::spawn(1000));
    n.run_until([&] { return n.has_event(0); });
    n.command(Node1::simple(NodeCommand::Kind::kExit, 3));
    n.run_until([&] { return n.sup->done(); });
    REQUIRE(n.sup->done());
    CHECK(n.spawner.procs[0]->signals.at(0) == SIGTERM);
    CHECK(n.sup->exit_code() == 3);
    CHECK(n.console.err.find("node 1: node 0 ended the job (the job finished): exit status 3") !=
          std::string::npos);
  }
}

TEST_CASE("node agent: node 0 gone: the workers are stopped and the node exits 1") {
  Node1 n;
  n.command(Node1::spawn(1000));
  n.run_until([&] { return n.has_event(0); });
  const int pid = n.spawner.procs[0]->pid;
  *n.gone = true;  // node 0's gpurun died: every request fails
  n.run_until([&] { return n.sup->done(); });
  REQUIRE(n.sup->done());
  CHECK(n.sup->exit_code() == 1);
  CHECK(n.spawner.procs[0]->signals.at(0) == SIGTERM);
  // One line: who is gone, that the job cannot go on, what is left of the state, how to go on.
  const std::string line = fmt::format(
      "node 1: node 0's gpurun (node0:29500) is gone (node0:29500: connection reset by peer): "
      "the job cannot go on without it (node 0 holds the job's store and makes every "
      "decision); the training state is only in the memory of the job's ranks (node 0's ended "
      "with it; this node's, pid {}, are stopped now: a program that saves a checkpoint on "
      "SIGTERM has until the SIGKILL); to go on, start a new job (node 0 first) from the "
      "program's own checkpoint, if it writes one; this node's gpurun exits 1; stopping this "
      "node's workers (SIGTERM, SIGKILL after 100 ms)",
      pid);
  CHECK(n.console.err.find(line) != std::string::npos);
  CHECK(n.console.err.find("is gone") == n.console.err.rfind("is gone"));  // said once
}

TEST_CASE(
    "node agent: node 0 gone while workers run (a paused job's parked ones) and a pause "
    "snapshot file is here: both are said") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    fmt::format("gpurun-node-agent-test-parked-{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string snap = (dir / "state.snapshot").string();
  if (std::FILE* f = std::fopen(snap.c_str(), "w")) {
    std::fputs("123", f);
    std::fclose(f);
  }
  {
    Node1 n;
    n.snapshot_paths = {snap};
    n.command(Node1::spawn(1000));
    n.run_until([&] { return n.has_event(0); });
    const int pid = n.spawner.procs[0]->pid;
    *n.gone = true;
    n.run_until([&] { return n.sup->done(); });
    REQUIRE(n.sup->done());
    CHECK(n.sup->exit_code() == 1);
    CHECK(n.console.err.find(fmt::format(
              "the training state is in the memory of the job's ranks (node 0's ended with it; "
              "this node's, pid {}, are stopped now: a program that saves a checkpoint on "
              "SIGTERM has until the SIGKILL); if the job is paused, also in this node's pause "
              "snapshot {} (3 bytes, written ",
              pid, snap)) != std::string::npos);
    CHECK(n.console.err.find(" UTC), deleted when this gpurun exits (no new job resumes from a "
                             "pause snapshot); to go on, start a new job") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("node agent: node 0 gone while this node runs no worker: its pause snapshot is said") {
  SUBCASE("a pause snapshot node 0 had copied here") {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      fmt::format("gpurun-node-agent-test-{}", ::getpid());
    std::filesystem::create_directories(dir);
    const std::string snap = (dir / "state.snapshot").string();
    std::thread copier;
    {
      Node1 n([&](const std::string&, int64_t serial, std::function<void(const NodeEvent&)> done) {
        copier = std::thread([serial, snap, done = std::move(done)] {
          if (std::FILE* f = std::fopen(snap.c_str(), "w")) {  // checked by the line below
            std::fputs("12345", f);
            std::fclose(f);
          }
          NodeEvent e;
          e.kind = NodeEvent::Kind::kSnapshotFetched;
          e.serial = serial;
          e.bytes = 5;
          done(e);
        });
      });
      n.snapshot_paths = {(dir / "none.snapshot").string(), snap};
      NodeCommand c;
      c.kind = NodeCommand::Kind::kFetchSnapshot;
      c.endpoint = "127.0.0.1:4567";
      c.serial = 4;
      n.command(c);
      n.run_until([&] { return n.has_event(0); });
      *n.gone = true;
      n.run_until([&] { return n.sup->done(); });
      REQUIRE(n.sup->done());
      CHECK(n.sup->exit_code() == 1);
      CHECK(
          n.said_line("node 1: node 0's gpurun (node0:29500) is gone (node0:29500: "
                      "connection reset by peer): the job cannot go on without it"));
      CHECK(
          n.said_line(fmt::format("; this node runs no worker; if the job is paused, its "
                                  "training state is in this node's pause snapshot {} (5 "
                                  "bytes, written ",
                                  snap)));
      CHECK(
          n.said_line(" UTC, pause snapshot 4 copied here), deleted when this gpurun exits (no "
                      "new job resumes from a pause snapshot); to go on, start a new job (node "
                      "0 first) from the program's own checkpoint, if it writes one; this "
                      "node's gpurun exits 1"));
    }
    copier.join();
    std::filesystem::remove_all(dir);
  }
  SUBCASE("none") {
    Node1 n;
    n.snapshot_paths = {"/nonexistent/gpurun-node-agent-test/state.snapshot"};
    *n.gone = true;
    n.run_until([&] { return n.sup->done(); });
    REQUIRE(n.sup->done());
    CHECK(n.sup->exit_code() == 1);
    CHECK(
        n.said_line("the job cannot go on without it (node 0 holds the job's store and makes "
                    "every decision); this node runs no worker and holds no pause snapshot: "
                    "no training state is left here; to go on, start a new job"));
  }
}

TEST_CASE("node agent: SIGTERM leaves at the next boundary; release then ends it with 0") {
  Node1 n;
  n.command(Node1::spawn(1000));
  n.run_until([&] { return n.has_event(0); });
  CHECK(n.agent->on_signal(SIGTERM));
  CHECK(n.node0.try_get(keys::node_leave(1)) == std::optional<std::string>("SIGTERM"));
  CHECK(
      n.said_line("node 1: leaving the job at the next boundary (SIGTERM); its gpurun then "
                  "exits 0; a second SIGINT or SIGTERM stops its workers at once"));
  CHECK(n.spawner.procs[0]->signals.empty());  // the worker leaves at its boundary
  // Node 0 takes the slot out at the boundary; its process exits 0 and is reported.
  n.spawner.exit(0, ExitStatus{0, 0});
  n.run_until([&] { return n.has_event(1); });
  CHECK(n.event(1)->code == 0);
  CHECK_FALSE(n.sup->done());  // until node 0 releases it
  n.command(Node1::simple(NodeCommand::Kind::kRelease));
  n.run_until([&] { return n.sup->done(); });
  CHECK(n.sup->exit_code() == 0);
}

TEST_CASE("node agent: SIGINT (Ctrl-C) leaves as SIGTERM does; release then ends it with 130") {
  Node1 n;
  n.command(Node1::spawn(1000));
  n.run_until([&] { return n.has_event(0); });
  CHECK(n.agent->on_signal(SIGINT));
  CHECK(n.node0.try_get(keys::node_leave(1)) == std::optional<std::string>("SIGINT"));
  CHECK(
      n.said_line("node 1: leaving the job at the next boundary (SIGINT); its gpurun then exits "
                  "130; a second SIGINT or SIGTERM stops its workers at once"));
  CHECK(n.spawner.procs[0]->signals.empty());  // no KeyboardInterrupt in its rank
  n.spawner.exit(0, ExitStatus{0, 0});
  n.run_until([&] { return n.has_event(1); });
  n.command(Node1::simple(NodeCommand::Kind::kRelease));
  n.run_until([&] { return n.sup->done(); });
  CHECK(n.sup->exit_code() == 130);
  CHECK(n.said_line("node 0 released this node (node 1 left); its gpurun exits 130"));
  // A second Ctrl-C is the supervisor's: it stops the workers at once.
  Node1 m;
  CHECK(m.agent->on_signal(SIGINT));
  CHECK_FALSE(m.agent->on_signal(SIGINT));
}

TEST_CASE("node agent: its status.json members: node 0's store, its slots, states and ranks") {
  Node1 n;
  int changes = 0;
  n.agent->close();
  NodeAgentOptions ao;
  ao.node = 1;
  ao.where = "node0:29500";
  ao.slots = {0, 1};
  ao.wait_slice = 20ms;
  ao.status_changed = [&] { ++changes; };
  n.agent = std::make_unique<NodeAgent>(n.io, *n.sup, connection(n.node0, n.gone),
                                        connection(n.node0, n.gone), ao);
  n.sup->set_controller(n.agent.get());
  n.agent->on_attempt_start(0);
  NodeCommand member = Node1::spawn(1000);  // a joiner of generation 3: rank 2
  member.warm = -1;
  member.generation = 3;
  n.command(member);
  n.command(Node1::spawn(1001));  // a warm joiner
  n.run_until([&] { return n.has_event(1); });
  CHECK(changes >= 2);
  const std::string m = n.agent->status_members({"GPU-a", "GPU-b"});
  INFO(m);
  CHECK(m.find("\"node\": {\"node\": 1, \"node0\": \"node0:29500\", \"state\": \"live\", "
               "\"why\": \"\", \"generation\": 3, \"active\": [0,1,1000]}") != std::string::npos);
  CHECK(m.find("{\"gpu\": 1000, \"local_gpu\": 0, \"physical_gpu\": \"GPU-a\", \"state\": "
               "\"ACTIVE\", \"generation\": 3, \"rank\": 2, \"pid\": ") != std::string::npos);
  CHECK(m.find("{\"gpu\": 1001, \"local_gpu\": 1, \"physical_gpu\": \"GPU-b\", \"state\": "
               "\"WARMING\", \"generation\": -1, \"rank\": -1, \"pid\": ") != std::string::npos);
  n.spawner.exit(0, ExitStatus{1, 0});
  n.run_until([&] { return n.has_event(2); });
  CHECK(n.agent->status_members({}).find("\"state\": \"FAILED\", \"generation\": -1, \"rank\": "
                                         "-1, \"pid\": -1, \"reason\": \"exit code 1\"") !=
        std::string::npos);
}

TEST_CASE("node agent: its workers' lines are named as node 0 names the slot, by generation") {
  Node1 n;
  NodeCommand member = Node1::spawn(1000);  // a joiner of generation 3, active {0, 1, 1000}
  member.warm = -1;
  member.generation = 3;
  n.command(member);
  n.command(Node1::spawn(1001));  // a warm joiner: no rank yet
  n.run_until([&] { return n.has_event(1); });
  n.spawner.output(0, StreamId::kStdout, "loss 0.5\n");
  n.spawner.output(1, StreamId::kStdout, "warming\n");
  CHECK_MESSAGE(n.console.out.find("[rank2 gpu1000]: loss 0.5\n") != std::string::npos,
                n.console.out);
  CHECK(n.console.out.find("[gpu1001]: warming\n") != std::string::npos);
  // Node 0's next generation admits 1001 and drops gpu 1: the ranks follow.
  NodeCommand g;
  g.kind = NodeCommand::Kind::kGeneration;
  g.generation = 4;
  g.decision = control::Decision{};
  g.decision->generation = 4;
  g.decision->active = {0, 1000, 1001};
  n.command(g);
  n.run_until(
      [&] { return n.agent->status_members({}).find("\"generation\": 4") != std::string::npos; });
  n.spawner.output(0, StreamId::kStdout, "loss 0.4\n");
  n.spawner.output(1, StreamId::kStdout, "trains\n");
  CHECK(n.console.out.find("[rank1 gpu1000]: loss 0.4\n") != std::string::npos);
  CHECK(n.console.out.find("[rank2 gpu1001]: trains\n") != std::string::npos);
  CHECK(n.agent->status_members({}).find("\"gpu\": 1001, \"local_gpu\": 1, \"physical_gpu\": "
                                         "null, \"state\": \"ACTIVE\", \"generation\": 4, "
                                         "\"rank\": 2") != std::string::npos);
}

TEST_CASE("node agent: a second SIGTERM is the supervisor's: the workers stop at once") {
  Node1 n;
  n.command(Node1::spawn(1000));
  n.run_until([&] { return n.has_event(0); });
  CHECK(n.agent->on_signal(SIGTERM));
  CHECK_FALSE(n.agent->on_signal(SIGTERM));
  n.sup->handle_signal(SIGTERM);
  n.run_until([&] { return n.sup->done(); });
  REQUIRE(n.sup->done());
  CHECK(n.spawner.procs[0]->signals.at(0) == SIGTERM);
  CHECK(n.sup->exit_code() == 143);
  CHECK(n.console.err.find("stopping while paused") == std::string::npos);
}

TEST_CASE("node agent: after a second stop signal node 0's spawn starts nothing") {
  Node1 n;
  CHECK(n.agent->on_signal(SIGTERM));
  CHECK_FALSE(n.agent->on_signal(SIGTERM));  // the supervisor's: it stops the workers
  n.command(Node1::spawn(1001));
  n.run_until([&] { return n.has_event(0); });
  CHECK(n.spawner.procs.empty());
  CHECK(n.event(0)->kind == NodeEvent::Kind::kExited);
  CHECK(n.event(0)->how ==
        "node 1: node 1 gpu 1 not started: this node is stopping its workers (a stop signal)");
}

TEST_CASE("node agent: a reload writes the offer when it changed") {
  Node1 n;
  n.agent->on_reload_request();  // the join record's offer: not written again
  CHECK_FALSE(n.node0.try_get(keys::node_offer(1)));
  n.offer = {1};
  n.agent->on_reload_request();
  CHECK(n.node0.try_get(keys::node_offer(1)) == std::optional<std::string>("1"));
  n.offer = {};  // active_gpus = []: offers nothing for now, stays in the job
  n.agent->offer_changed();
  CHECK(n.node0.try_get(keys::node_offer(1)) == std::optional<std::string>(""));
}

TEST_CASE("node agent: fetch_snapshot copies off the io thread and answers snapshot_fetched") {
  std::string asked;
  int64_t asked_serial = -1;
  std::thread copier;
  {
    Node1 n([&](const std::string& endpoint, int64_t serial,
                std::function<void(const NodeEvent&)> done) {
      asked = endpoint;
      asked_serial = serial;
      copier = std::thread([serial, done = std::move(done)] {  // done: on another thread
        NodeEvent e;
        e.kind = NodeEvent::Kind::kSnapshotFetched;
        e.serial = serial;
        e.bytes = 73728;
        e.ms = 5;
        done(e);
      });
    });
    NodeCommand c;
    c.kind = NodeCommand::Kind::kFetchSnapshot;
    c.endpoint = "127.0.0.1:4567";
    c.serial = 2;
    n.command(c);
    n.run_until([&] { return n.has_event(0); });
    CHECK(asked == "127.0.0.1:4567");
    CHECK(asked_serial == 2);
    const std::optional<NodeEvent> e = n.event(0);
    REQUIRE(e);
    CHECK(e->kind == NodeEvent::Kind::kSnapshotFetched);
    CHECK(e->serial == 2);
    CHECK(e->bytes == 73728);
    CHECK(e->how == "");
    CHECK(n.said_line("node 1: copying the pause snapshot from 127.0.0.1:4567"));
    CHECK(n.said_line("node 1: the pause snapshot is here: 73728 bytes in 5 ms"));
  }
  copier.join();
}

TEST_CASE("node agent: a node that cannot fetch answers snapshot_fetched with why") {
  Node1 n;  // no fetch_snapshot
  NodeCommand c;
  c.kind = NodeCommand::Kind::kFetchSnapshot;
  c.endpoint = "127.0.0.1:4567";
  c.serial = 1;
  n.command(c);
  n.run_until([&] { return n.has_event(0); });
  const std::optional<NodeEvent> e = n.event(0);
  REQUIRE(e);
  CHECK(e->kind == NodeEvent::Kind::kSnapshotFetched);
  CHECK(e->serial == 1);
  CHECK(e->how == "node 1 cannot copy a pause snapshot (it serves none)");
}

TEST_CASE("node agent: the join record says where the node serves its pause snapshot") {
  MemoryStore node0;
  node0.set(keys::node_job(), "job");
  ElasticJoinRequest r = request();
  r.snapshot_endpoint = "10.0.0.2:4567";
  node0.set(keys::node_answer(1), "admitted");
  const ElasticJoin j = join_elastic_job(node0, r);
  const control::NodeJoin rec =
      control::NodeJoin::from_json(*node0.try_get(keys::node_join(j.node)));
  CHECK(rec.snapshot_endpoint == "10.0.0.2:4567");
}

}  // namespace gpurun::supervisor
