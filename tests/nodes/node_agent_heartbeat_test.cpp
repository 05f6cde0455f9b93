// The slot agent of node k > 0 (launcher/nodes/node_agent.hpp) and --node-timeout
// (docs/cli.md#elastic-nodes): its heartbeat to node 0, and a node cut off from node 0 (its store
// answers nothing: a cut link, node 0's host stopped) stopping its workers and ending with 1. Over
// the in-memory store with fake processes; the real gpurun across network namespaces is
// tests/python/run_nodes_netns.sh's cut case.
#include "nodes/node_agent.hpp"

#include <doctest/doctest.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "gpurun/control/heartbeat.hpp"
#include "gpurun/control/keys.hpp"
#include "gpurun/control/node_messages.hpp"
#include "gpurun/error.hpp"
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

/// One connection to node 0's store: once `cut` is set, every request waits out the
/// connection's request timeout and throws StoreTimeout, as a client's does on a cut link.
std::unique_ptr<store::Store> cut_link(MemoryStore& store, std::shared_ptr<std::atomic<bool>> cut,
                                       std::chrono::milliseconds timeout) {
  return std::make_unique<store::testing::FaultyStore>(store, [cut, timeout] {
    if (!*cut) return;
    std::this_thread::sleep_for(timeout);
    throw StoreTimeout("no reply from store at node0:29500 within the request timeout");
  });
}

/// Node 1 with two slots and --node-timeout 200 ms: its supervisor on fake processes, its agent
/// on node 0's store through two links (commands, events) that `cut` cuts.
struct BeatingNode1 {
  static constexpr std::chrono::milliseconds kTimeout = 200ms;
  boost::asio::io_context io;
  FakeSpawner spawner{io};
  CaptureConsole console;
  EventLog events;
  MemoryStore node0;
  std::shared_ptr<std::atomic<bool>> cut = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<Supervisor> sup;
  std::unique_ptr<NodeAgent> agent;
  std::vector<std::string> said;
  int64_t commands = 0;

  BeatingNode1() {
    SupervisorOptions o;
    o.plan.nproc = 2;
    o.plan.world_size = 2;
    o.plan.nnodes = 2;
    o.plan.node_rank = 1;
    o.plan.device = Device::kCpu;
    o.plan.run_id = "job";
    o.plan.master_addr = "node0";
    o.plan.master_port = 29500;
    o.plan.run_dir = "/nonexistent/gpurun-node-agent-heartbeat-test";
    o.argv = {"/bin/true"};
    o.grace_period = 30s;  // the cut-off grace replaces it
    o.kill_timeout = 200ms;
    o.drain_timeout = 100ms;
    o.poll_interval = 5ms;
    sup = std::make_unique<Supervisor>(io, o, spawner, console, events);
    NodeAgentOptions ao;
    ao.node = 1;
    ao.where = "node0:29500";
    ao.slots = {0, 1};
    ao.joined_offer = {0, 1};
    ao.wait_slice = 20ms;
    ao.node_timeout = kTimeout;
    ao.cut_off_grace = 50ms;
    ao.say = [this](const std::string& line) { said.push_back(line); };
    agent = std::make_unique<NodeAgent>(io, *sup, cut_link(node0, cut, kTimeout),
                                        cut_link(node0, cut, kTimeout), ao);
    sup->set_controller(agent.get());
    sup->final_status = [this](int) { return agent->final_status(); };
    sup->start();
  }
  ~BeatingNode1() { agent->close(); }

  void spawn(int slot) {
    NodeCommand c;
    c.kind = NodeCommand::Kind::kSpawn;
    c.slot = slot;
    c.generation = 3;
    control::Decision d;
    d.generation = 3;
    d.active = {0, 1, slot};
    c.decision = d;
    node0.set(keys::node_command(1, commands++), c.to_json());
  }
  /// Runs io until `until()` holds (a safety bound of 5 s, not a check).
  void run_until(const std::function<bool()>& until) {
    const auto end = std::chrono::steady_clock::now() + 5s;
    while (!until() && std::chrono::steady_clock::now() < end) {
      io.restart();
      io.run_for(5ms);
    }
  }
  int64_t beat() {
    const auto v = node0.try_get(keys::node_beat(1));
    return v ? std::stoll(*v) : 0;
  }
};

}  // namespace

TEST_CASE("node agent: with --node-timeout the node advances its heartbeat in node 0's store") {
  BeatingNode1 n;
  n.run_until([&] { return n.beat() >= 3; });  // every heartbeat_interval(200 ms) = 40 ms
  CHECK(n.beat() >= 3);
  CHECK_FALSE(n.agent->end());
}

TEST_CASE("node agent: a stuck io thread stops the heartbeat from advancing") {
  BeatingNode1 n;
  n.run_until([&] { return n.beat() >= 2; });
  const int64_t before = n.beat();
  // The io thread runs nothing for 10 heartbeat intervals: the reader still writes, the value
  // stays (at most the marker posted last runs when io runs again).
  std::this_thread::sleep_for(10 * control::heartbeat_interval(BeatingNode1::kTimeout));
  CHECK(n.beat() <= before + 1);
  n.run_until([&] { return n.beat() >= before + 3; });
  CHECK(n.beat() >= before + 3);
}

TEST_CASE("node agent: cut off from node 0 for --node-timeout: workers stopped, exit 1") {
  BeatingNode1 n;
  n.spawn(1000);
  n.run_until([&] { return n.node0.try_get(keys::node_event(1, 0)).has_value(); });
  REQUIRE(n.spawner.procs.size() == 1);
  *n.cut = true;  // node 0's store answers nothing from now on
  n.run_until([&] { return n.sup->done(); });
  REQUIRE(n.sup->done());
  CHECK(n.sup->exit_code() == 1);
  CHECK(n.spawner.procs[0]->signals.at(0) == SIGTERM);
  const std::string& err = n.console.err;
  CHECK(err.find("node 1: cut off from node 0: its store at node0:29500 has not answered for ") !=
        std::string::npos);
  // Node 0 may be alive (and went on) or gone with its host: the line says both, and what is
  // left here (this node's ranks, stopped now).
  CHECK(err.find(" (--node-timeout 0.2 s): if node 0 still runs, it has given this node up by "
                 "now and the job goes on without this node's slots; if node 0 is gone, the job "
                 "has ended; the training state is only in the memory of the job's ranks (node "
                 "0's, if it still runs, keep theirs; this node's, pid ") != std::string::npos);
  CHECK(err.find("this node's gpurun exits 1; stopping this node's workers (SIGTERM, SIGKILL "
                 "after 50 ms)") != std::string::npos);
  CHECK(err.find("node 0's gpurun (node0:29500) is gone") == std::string::npos);  // not its death
  REQUIRE(n.agent->end());
  CHECK(n.agent->end()->reason.rfind("cut off from node 0", 0) == 0);
}

TEST_CASE("node agent: given up by node 0 (its link came back): workers stopped, exit 1") {
  BeatingNode1 n;
  n.spawn(1000);
  n.run_until([&] { return n.node0.try_get(keys::node_event(1, 0)).has_value(); });
  REQUIRE(n.spawner.procs.size() == 1);
  NodeCommand c;
  c.kind = NodeCommand::Kind::kGivenUp;
  c.reason = "its gpurun sent no heartbeat for 3.087 s (--node-timeout 3 s)";
  n.node0.set(keys::node_command(1, n.commands++), c.to_json());
  n.run_until([&] { return n.sup->done(); });
  REQUIRE(n.sup->done());
  CHECK(n.sup->exit_code() == 1);
  CHECK(n.spawner.procs[0]->signals.at(0) == SIGTERM);
  const std::string& err = n.console.err;
  // Node 0 went on: not "node 0 ended the job", and the cut-off grace, not --grace-period.
  CHECK(err.find("node 1: node 0 gave this node up (its gpurun sent no heartbeat for 3.087 s "
                 "(--node-timeout 3 s)) and trains on without its slots; this node's gpurun "
                 "exits 1; stopping this node's workers (SIGTERM, SIGKILL after 50 ms)") !=
        std::string::npos);
  CHECK(err.find("ended the job") == std::string::npos);
}

}  // namespace gpurun::supervisor
