// The pause snapshot across nodes (launcher/control/elastic_controller_snapshot.cpp,
// docs/cli.md#elastic-nodes, "Pause and resume across nodes"): a paused job whose only pause
// snapshot was on a node that is lost ends at once, its training state lost; a copy elsewhere,
// or a node still live (slow), keeps today's wait.
#include "control/elastic_controller.hpp"

#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "gpurun/control/keys.hpp"
#include "gpurun/control/node_messages.hpp"
#include "scheduler_fixture.hpp"
#include "store/backend.hpp"

using namespace gpurun::control;
using gpurun::store::Backend;

namespace {

NodeHubOptions options() {
  NodeHubOptions o;
  o.run_id = "job";
  return o;
}

void join_node(Backend& b, NodeHub& hub, int node) {
  NodeJoin j;
  j.node = node;
  j.host = "host" + std::to_string(node);
  j.pid = 4000 + node;
  j.slots = {0, 1};
  j.offer = {};
  j.run_id = "job";
  j.device = "cpu";
  b.set(keys::node_join(node), j.to_json());
  REQUIRE(hub.on_key(keys::node_join(node)));
}

// Node `node`'s gpurun died (its store connection closed: kill -9).
void lose(Backend& b, NodeHub& hub, int node) {
  b.set(keys::node_lost(node), "1");
  REQUIRE(hub.on_key(keys::node_lost(node)));
}

std::string unreachable(const NodeHub& hub, std::set<int> copies, std::set<int> fetching = {}) {
  return snapshot_unreachable(copies, fetching, [&](int k) { return hub.lost(k); });
}

}  // namespace

TEST_CASE("snapshot copies: the only copy on a lost node can never be read again") {
  Backend b;
  NodeHub hub(b, options());
  join_node(b, hub, 1);
  join_node(b, hub, 2);
  CHECK(unreachable(hub, {1}).empty());  // node 1 is live: a slow node is waited for
  lose(b, hub, 1);
  const std::string why = unreachable(hub, {1});
  CHECK(why.find("is on node 1 (host1, gpurun pid 4001), which was lost: its gpurun's store "
                 "connection closed") == 0);
  CHECK(why.find("node ids are not reused (a restarted gpurun joins as a new node)") !=
        std::string::npos);
  CHECK(unreachable(hub, {0, 1}).empty());    // node 0 copied it before
  CHECK(unreachable(hub, {1, 2}).empty());    // node 2, live, has a copy
  CHECK(unreachable(hub, {1}, {0}).empty());  // node 0's copy in flight: its answer decides
  CHECK(unreachable(hub, {1}, {2}).empty());  // so does live node 2's
  CHECK(unreachable(hub, {}).empty());        // no pause snapshot
  lose(b, hub, 2);
  CHECK_FALSE(unreachable(hub, {1}, {2}).empty());  // node 2 died while copying it
  CHECK(unreachable(hub, {1, 2}).find(", and on node 2 (host2") != std::string::npos);
}

TEST_CASE("snapshot copies: a released node is not lost (its leaving is said, not a loss)") {
  Backend b;
  NodeHub hub(b, options());
  join_node(b, hub, 1);
  b.set(keys::node_leave(1), "SIGTERM");
  hub.on_key(keys::node_leave(1));
  hub.release_idle([](int) { return false; }, [](int) { return false; });
  lose(b, hub, 1);  // its disconnect after the release
  CHECK(hub.lost(1).empty());
  CHECK(unreachable(hub, {1}).empty());
}

TEST_CASE("scheduler: a paused job whose only pause snapshot cannot be read loses its state") {
  using gpurun::control::testing::cfg;
  gpurun::control::testing::Harness h(cfg(std::nullopt), 2);
  h.join_all();
  const std::string where = "is on node 1 (host1, gpurun pid 4001), which was lost: …";
  CHECK_FALSE(h.s.snapshot_unreachable(where));     // training: the members hold the state
  h.s.config_loaded(cfg(std::vector<int>{}), "c");  // pause: gpu 0 writes the snapshot
  h.drain();
  h.boundary(0);  // paused: the snapshot alone holds the state (a resume loads it)
  for (int gpu : {0, 1}) CHECK(h.s.on_process_exit(gpu, true, "exit code 0", false));
  h.drain();
  REQUIRE(h.s.holds_job_open());
  CHECK(h.s.state_lost().empty());
  CHECK(h.s.snapshot_unreachable(where));
  h.drain();
  CHECK_FALSE(h.s.holds_job_open());  // the supervisor ends the job: exit status 1
  CHECK(h.s.finished());
  const std::string& lost = h.s.state_lost();
  CHECK(lost.find("the training state is lost: the job is paused and its only pause snapshot (") ==
        0);
  CHECK(lost.find("serial 1, written by gpu 0 in generation 0) is on node 1 (host1") !=
        std::string::npos);
  CHECK(h.events("state_lost") == 1);
  CHECK_FALSE(h.s.snapshot_unreachable(where));  // once
  CHECK(h.events("state_lost") == 1);
}
