// A worker's side of keys::sever (worker_runtime/engine/sever_watch.cpp): this process's TCP
// connections to a lost node's address shut down, so that a collective blocked on it fails at once
// (docs/control-protocol.md#severed-addresses). The real sockets of this process on loopback;
// the watch over the in-memory store with the OS calls replaced.
#include "gpurun/worker/sever_watch.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpurun/control/keys.hpp"
#include "gpurun/unique_fd.hpp"
#include "testing/memory_store.hpp"

using namespace gpurun::control;
using gpurun::UniqueFd;
using gpurun::store::testing::MemoryStore;

namespace {

// A listening socket on 127.0.0.1 (port 0) and its port.
UniqueFd listen_loopback(uint16_t& port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.get() >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd.get(), 4) == 0);
  socklen_t n = sizeof a;
  REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &n) == 0);
  port = ntohs(a.sin_port);
  return fd;
}

UniqueFd connect_loopback(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.get() >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// The watch's record of what it was asked to sever.
struct Calls {
  std::mutex mu;
  std::vector<std::string> severed;
  std::vector<std::string> copy() {
    std::lock_guard<std::mutex> lock(mu);
    return severed;
  }
};

// Waits (a bound of 5 s, not a check) until `watch` handled `n` entries.
void wait_handled(const SeverWatch& watch, int64_t n) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (watch.handled() < n && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace

TEST_CASE("sever: this process's connections to an address shut down; a listener stays") {
  uint16_t port = 0;
  const UniqueFd listener = listen_loopback(port);
  const UniqueFd client = connect_loopback(port);
  const UniqueFd server(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  REQUIRE(server.get() >= 0);
  CHECK(sever_connections("10.255.255.1") == 0);  // nobody there: nothing touched
  CHECK(sever_connections("not an address") == 0);
  // Both ends of the pair have 127.0.0.1 as their remote address.
  CHECK(sever_connections("127.0.0.1") == 2);
  char c = 0;
  CHECK(::recv(server.get(), &c, 1, 0) == 0);  // shut down: a blocked reader sees the end now
  CHECK(::recv(client.get(), &c, 1, 0) == 0);
  CHECK(::send(client.get(), "x", 1, MSG_NOSIGNAL) == -1);
  // The listener is not a connection: it still accepts.
  const UniqueFd again = connect_loopback(port);
  const UniqueFd accepted(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  CHECK(accepted.get() >= 0);
}

TEST_CASE("sever: this host's own addresses are local, another host's are not; the store's") {
  CHECK(local_address("127.0.0.1"));
  CHECK_FALSE(local_address("203.0.113.7"));  // TEST-NET-3: never configured
  CHECK_FALSE(local_address("x"));
  CHECK(same_address("127.0.0.1", "127.0.0.1"));
  CHECK(same_address("::1", "[::1]"));
  CHECK(same_address("127.0.0.1", "localhost"));
  CHECK_FALSE(same_address("10.0.0.2", "127.0.0.1"));
  CHECK_FALSE(same_address("10.0.0.2", ""));
}

TEST_CASE("sever watch: entries of this generation or a later one, not this host's, are severed") {
  auto store = std::make_unique<MemoryStore>();
  MemoryStore& m = *store;
  m.set(keys::node_job(), "job");
  std::atomic<int64_t> generation{-1};
  Calls calls;
  std::vector<std::string> logged;
  std::mutex log_mu;
  SeverWatchOptions o;
  o.generation = [&generation] { return generation.load(); };
  o.poll = std::chrono::milliseconds(1);
  o.sever = [&calls](const std::string& a) {
    std::lock_guard<std::mutex> lock(calls.mu);
    calls.severed.push_back(a);
    return 3;
  };
  o.local = [](const std::string& a) { return a == "10.0.0.1"; };
  o.store_host = "10.0.0.9";  // the store's: never, whatever node 0 writes
  o.log = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(log_mu);
    logged.push_back(line);
  };
  m.set(keys::sever(0), keys::sever_value({4, "10.0.0.7"}));  // an older generation's
  m.set(keys::sever(1), keys::sever_value({5, "10.0.0.2"}));
  SeverWatch watch(std::move(store), o);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(watch.handled() == 0);  // no generation yet: the entries wait
  generation = 5;
  wait_handled(watch, 2);
  CHECK(calls.copy() == std::vector<std::string>{"10.0.0.2"});
  m.set(keys::sever(2), keys::sever_value({5, "10.0.0.1"}));  // this host: never
  m.set(keys::sever(3), "garbage");
  m.set(keys::sever(5), keys::sever_value({6, "10.0.0.9"}));
  m.set(keys::sever(4), keys::sever_value({6, "fe80::2"}));
  wait_handled(watch, 6);
  CHECK(calls.copy() == std::vector<std::string>{"10.0.0.2", "fe80::2"});
  std::lock_guard<std::mutex> lock(log_mu);
  REQUIRE(logged.size() == 2);
  CHECK(logged[0] ==
        "node 0 gave up the node at 10.0.0.2 (generation 5): shut down 3 connection(s) of this "
        "process to it, so that a collective waiting on its workers fails now");
}

TEST_CASE("sever watch: a job of one node (no node job record) is never watched") {
  auto store = std::make_unique<MemoryStore>();
  MemoryStore& m = *store;
  std::atomic<int> called{0};
  SeverWatchOptions o;
  o.generation = [] { return int64_t{0}; };
  o.poll = std::chrono::milliseconds(1);
  o.sever = [&called](const std::string&) { return ++called; };
  {
    SeverWatch watch(std::move(store), o);
    m.set(keys::sever(0), keys::sever_value({0, "10.0.0.2"}));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(watch.handled() == 0);
  }
  CHECK(called == 0);
}
