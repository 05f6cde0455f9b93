// The records multi-node gpuruns exchange through node 0's store (docs/cli.md#multi-node): a
// node's failure, node 0's decision, and which failure is the root cause; a node > 0 that
// finds another program on node 0's store port.
#include "nodes/node_sync.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "testing/memory_store.hpp"

namespace gpurun::supervisor {
namespace {

/// Node 0's store: the in-memory fake.
using store::testing::MemoryStore;

/// A loopback listener that is not a store: it accepts and answers `reply` then closes
/// (`reply` empty: closes at once), or (`accept` false) never accepts, so connections complete
/// in the kernel's backlog and get no answer.
struct ForeignListener {
  int fd = -1;
  uint16_t port = 0;
  std::atomic<bool> stop{false};
  std::thread acceptor;
  ForeignListener(bool accept, std::string reply) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 64) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
    if (!accept) return;
    acceptor = std::thread([this, reply] {
      while (!stop) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 20) != 1) continue;
        const int c = ::accept(fd, nullptr, nullptr);
        if (c < 0) continue;
        if (!reply.empty()) (void)!::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
        ::close(c);
      }
    });
  }
  ~ForeignListener() {
    stop = true;
    if (acceptor.joinable()) acceptor.join();
    ::close(fd);
  }
};

}  // namespace

TEST_CASE("node sync: a node > 0 tells another program on node 0's port from a store not up yet") {
  using namespace std::chrono_literals;
  struct Kind {
    const char* name;
    bool accept;
    std::string reply;
    std::string seen;
  };
  const Kind kinds[] = {
      {"HTTP server", true, "HTTP/1.1 400 Bad Request\r\n\r\n",
       "it answered PING with 'HTTP/1.1 400 Bad Request\\x0d\\x0a\\x0d\\x0a'"},
      {"accepts, then closes", true, "", "it closed the connection without answering PING"},
      {"silent", false, "", "no answer to PING within "},
  };
  for (const Kind& k : kinds) {
    INFO(k.name);
    ForeignListener foreign(k.accept, k.reply);
    boost::asio::io_context io;
    NodeSyncOptions o;
    o.nnodes = 2;
    o.node_rank = 1;
    o.port = foreign.port;
    o.op_timeout = 300ms;     // one connect window
    o.connect_timeout = 20s;  // before the fix: waited on all of it, then "did not answer"
    NodeSync sync(io, o);
    const auto t0 = std::chrono::steady_clock::now();
    std::string error;
    try {
      sync.join();
    } catch (const JoinError& e) {
      error = e.what();
    }
    const auto took = std::chrono::steady_clock::now() - t0;
    INFO(error);
    const std::string where = "127.0.0.1:" + std::to_string(foreign.port);
    CHECK(error.rfind(where + " answers but is not a TCPStore (" + k.seen, 0) == 0);
    CHECK(error.find("another program listens on node 0's store port (3 tries over ") !=
          std::string::npos);
    CHECK(took < 10s);  // three windows of 0.3 s, not connect_timeout
  }
}

TEST_CASE("node sync: a node > 0 still waits for a port that refuses connections") {
  using namespace std::chrono_literals;
  uint16_t port = 0;
  {
    ForeignListener closed(false, "");  // a port that was free a moment ago
    port = closed.port;
  }
  boost::asio::io_context io;
  NodeSyncOptions o;
  o.nnodes = 2;
  o.node_rank = 1;
  o.port = port;
  o.op_timeout = 300ms;
  o.connect_timeout = 1s;
  NodeSync sync(io, o);
  std::string error;
  try {
    sync.join();
  } catch (const JoinError& e) {
    error = e.what();
  }
  INFO(error);
  CHECK(error.rfind(
            "node 0's store at 127.0.0.1:" + std::to_string(port) + " did not answer within 1 s",
            0) == 0);
}

TEST_CASE("node sync: node 0's own status never outranks a recorded failure, in any millisecond") {
  // Node 1 recorded its failure (stamped by its clock, here ahead of node 0's); node 0's workers
  // were stopped because of it, so node 0 ends with status 1 but records no failure of its own.
  boost::asio::io_context io;
  MemoryStore store;
  NodeSyncOptions o;
  o.nnodes = 2;
  o.poll_interval = std::chrono::milliseconds(1);
  NodeSync sync(io, o, store);
  std::optional<NodeFailure> root;
  sync.on_root_cause = [&](int, const NodeFailure& f) { root = f; };
  sync.attempt_started(0);
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  store.set(
      job_keys::fail(0, 1),
      NodeFailure{now + 60'000, 1, 2, 0, 3, "rank 2 (pid 7) ended with exit code 3"}.encode());
  store.set(job_keys::end(0, 1), "3 0");
  std::optional<AttemptOutcome> outcome;
  sync.attempt_ended(0, 1, false, [&](const AttemptOutcome& a) { outcome = a; });
  for (int i = 0; i < 2000 && !outcome; ++i) io.run_for(std::chrono::milliseconds(5));
  REQUIRE(outcome);
  REQUIRE(root);
  CHECK(root->node == 1);
  CHECK(root->reason == "rank 2 (pid 7) ended with exit code 3");
  CHECK(outcome->code == 3);
}

TEST_CASE("node sync: node 0 refuses a node at the start and keeps its store until it is gone") {
  // A joining node writes its join record, then its live key. Node 0 may read the first and
  // refuse the node (here: another --nproc) before the second is there; its store must stay
  // up until that node has read the refusal and disconnected (the store's lost key), or the
  // node sees only a closed connection instead of why it was refused.
  boost::asio::io_context io;
  MemoryStore store;
  NodeSyncOptions o;
  o.nnodes = 2;
  o.nproc = 2;
  o.poll_interval = std::chrono::milliseconds(1);
  o.disconnect_wait = std::chrono::seconds(600);
  NodeSync sync(io, o, store);
  store.set(job_keys::join(1), "3 2 host-1 4242");  // nproc 3, nnodes 2, host, pid
  std::optional<std::string> error;
  bool closed = false;
  sync.rendezvous([&](const std::string& e) {
    error = e;
    sync.finish([&] { closed = true; });  // what gpurun does: close the store when called
  });
  for (int i = 0; i < 2000 && !error; ++i) io.run_for(std::chrono::milliseconds(5));
  REQUIRE(error);
  CHECK(error->find("node 1 (host-1) joined with 3 workers (--nproc), node 0 has 2") !=
        std::string::npos);
  CHECK(store.try_get(job_keys::start()).value().rfind("error 1 ", 0) == 0);
  for (int polls = 0; polls < 50; ++polls) io.run_one();  // node 1 is still connected
  CHECK_FALSE(closed);
  store.set(job_keys::lost(1), "1700000000000");  // its connection closed
  for (int i = 0; i < 2000 && !closed; ++i) io.run_for(std::chrono::milliseconds(5));
  CHECK(closed);
}

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

TEST_CASE("node sync: --nnodes 2:3 re-forms the job with the nodes left, ranks renumbered") {
  // Node 1 of three is lost: node 0 restarts with nodes 0 and 2 (node 2 is GROUP_RANK 1 now),
  // written for the others before the decision; losing two leaves fewer than MIN: no restart.
  for (const bool lose_two : {false, true}) {
    CAPTURE(lose_two);
    boost::asio::io_context io;
    MemoryStore store;
    NodeSyncOptions o;
    o.nnodes = 2;
    o.nnodes_max = 3;
    o.nproc = 1;
    o.max_restarts = 1;
    o.last_call_timeout = std::chrono::milliseconds(0);
    o.poll_interval = std::chrono::milliseconds(1);
    std::vector<std::string> said;
    o.say = [&](const std::string& line) { said.push_back(line); };
    NodeSync sync(io, o, store);
    store.set(job_keys::join(1), "1 3 host-1 4241");
    store.set(job_keys::join(2), "1 3 host-2 4242");
    std::optional<std::string> ready;
    sync.rendezvous([&](const std::string& e) { ready = e; });
    REQUIRE(ready == std::string());
    REQUIRE(sync.nnodes() == 3);
    sync.attempt_started(0);
    store.set(job_keys::lost(1), "1000");  // node 1's gpurun disconnected
    if (lose_two)
      store.set(job_keys::lost(2), "1001");
    else
      store.set(job_keys::end(0, 2), "1 0");  // node 2's workers were stopped
    std::optional<AttemptOutcome> outcome;
    sync.attempt_ended(0, 1, false, [&](const AttemptOutcome& a) { outcome = a; });
    for (int i = 0; i < 2000 && !outcome; ++i) io.run_for(std::chrono::milliseconds(5));
    REQUIRE(outcome);
    if (lose_two) {
      CHECK_FALSE(outcome->restart);
      CHECK(outcome->reason.find("(no restart: node(s) 1, 2 gone, and fewer than --nnodes 2:3's "
                                 "2 would be left)") != std::string::npos);
      CHECK_FALSE(store.try_get(job_keys::members(0)));
      continue;
    }
    CHECK(outcome->restart);  // before: "no restart: ... a static job needs every node"
    CHECK(outcome->nnodes == 2);
    CHECK(outcome->node_rank == 0);
    CHECK(sync.nnodes() == 2);
    CHECK(store.try_get(job_keys::members(0)) == std::string("0 2"));  // node 2 is second: rank 1
    CHECK(store.try_get(job_keys::next(0)).value_or("").rfind("restart ", 0) == 0);
    CHECK(std::find(said.begin(), said.end(),
                    "node 1 (host-1) left the job: restarting with 2 nodes (--nnodes 2:3; restart "
                    "1 of 1)") != said.end());
  }
}
