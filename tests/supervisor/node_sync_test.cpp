// The records multi-node gpuruns exchange through node 0's store (docs/cli.md#multi-node): a
// node's failure, node 0's decision, and which failure is the root cause.
#include "supervisor/node_sync.hpp"

#include <doctest/doctest.h>

namespace gpurun::supervisor {

TEST_CASE("node sync: a failure record round-trips, a reason with spaces and newlines included") {
  NodeFailure f{1700000000123, 1, 3, 1, 139, "rank 3 (pid 42) ended with signal SIGSEGV\nline 2"};
  const std::string text = f.encode();
  CHECK(text == "1700000000123 1 3 1 139 rank 3 (pid 42) ended with signal SIGSEGV line 2");
  const auto back = NodeFailure::decode(text);
  REQUIRE(back);
  CHECK(back->time_ms == f.time_ms);
  CHECK(back->node == 1);
  CHECK(back->rank == 3);
  CHECK(back->local_rank == 1);
  CHECK(back->code == 139);
  CHECK(back->reason == "rank 3 (pid 42) ended with signal SIGSEGV line 2");
  const auto lost = NodeFailure::decode("5 2 -1 -1 1 node 2's gpurun disconnected");
  REQUIRE(lost);
  CHECK(lost->rank == -1);
}

TEST_CASE("node sync: records that are not gpurun's are refused") {
  CHECK_FALSE(NodeFailure::decode(""));
  CHECK_FALSE(NodeFailure::decode("12 1 3"));
  CHECK_FALSE(NodeFailure::decode("x 1 3 1 7 why"));
  CHECK_FALSE(AttemptOutcome::decode("exit"));
  CHECK_FALSE(AttemptOutcome::decode("exit 300 too big"));
  CHECK_FALSE(AttemptOutcome::decode("quit 1 no"));
}

TEST_CASE("node sync: node 0's decision round-trips") {
  const auto r = AttemptOutcome::decode(AttemptOutcome{true, 0, "node 1: rank 2 failed"}.encode());
  REQUIRE(r);
  CHECK(r->restart);
  CHECK(r->reason == "node 1: rank 2 failed");
  const auto e = AttemptOutcome::decode(AttemptOutcome{false, 3, "node 1: rank 2 failed"}.encode());
  REQUIRE(e);
  CHECK_FALSE(e->restart);
  CHECK(e->code == 3);
  CHECK(e->reason == "node 1: rank 2 failed");
}

TEST_CASE("node sync: the root cause is the first failure in time, then the lowest node") {
  CHECK_FALSE(root_cause({}));
  // Node 1 was lost first; node 0's worker failed after it (its peer vanished).
  const std::vector<NodeFailure> fs{{2000, 0, 0, 0, 1, "rank 0 failed: connection reset"},
                                    {1990, 1, -1, -1, 1, "node 1 lost"},
                                    {2500, 2, 4, 0, 1, "rank 4 failed"}};
  CHECK(root_cause(fs)->node == 1);
  const std::vector<NodeFailure> tie{{7, 2, 4, 0, 1, "b"}, {7, 1, 2, 0, 1, "a"}};
  CHECK(root_cause(tie)->node == 1);
}

}  // namespace gpurun::supervisor
