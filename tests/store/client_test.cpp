#include "gpurun/store/client.hpp"

#include <doctest/doctest.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check_text.hpp"
#include "gpurun/error.hpp"
#include "testing/store_server.hpp"

namespace gpurun::store {

using testing::eventually;
using testing::TestServer;

namespace {

using gpurun::testing::contains;

int listen_loopback(uint16_t& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::listen(fd, 16) == 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

int connect_loopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Forwards connections to a store but closes everything once `budget` bytes
// (both directions together) have passed; later connections are closed at once.
class CuttingProxy {
 public:
  CuttingProxy(uint16_t upstream, std::size_t budget) : upstream_(upstream), budget_(budget) {
    listen_fd_ = listen_loopback(port_);
    thread_ = std::thread([this] { run(); });
  }
  ~CuttingProxy() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  uint16_t port() const { return port_; }

 private:
  void run() {
    int client = -1, server = -1;
    while (!stop_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      if (client >= 0) {
        fds.push_back({client, POLLIN, 0});
        fds.push_back({server, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 1) <= 0) continue;  // 1 ms: the destructor waits this
      if (fds[0].revents & POLLIN) {
        int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (client >= 0 || budget_ == 0) {
          ::close(c);
        } else {
          client = c;
          server = connect_loopback(upstream_);
          const int one = 1;  // forwarded as it comes: no Nagle wait on either leg
          ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          ::setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const int from = fds[i].fd, to = from == client ? server : client;
        char buf[4096];
        ssize_t n = ::recv(from, buf, std::min(sizeof(buf), budget_), 0);
        if (n > 0) {
          ::send(to, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL);
          budget_ -= static_cast<std::size_t>(n);
        }
        if (n <= 0 || budget_ == 0) {
          ::close(client);
          ::close(server);
          client = server = -1;
          if (n <= 0) budget_ = 0;
          break;
        }
      }
    }
    if (client >= 0) ::close(client);
    if (server >= 0) ::close(server);
  }

  uint16_t upstream_;
  std::size_t budget_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Fails the test (not a StoreError, so the cut loop cannot swallow it).
void expect(bool ok, const char* what) {
  if (!ok) throw std::logic_error(std::string("wrong reply: ") + what);
}

// Runs every client operation once; throws on the first failure.
void run_script(Client& c, const std::string& p) {
  c.set(p + "a", "1");
  expect(c.get(p + "a") == "1", "get");
  expect(c.add(p + "n", 2) == 2, "add");
  expect(c.compare_set(p + "a", "1", "2") == "2", "compare_set");
  expect(c.check({p + "a", p + "n"}), "check");
  expect(c.num_keys() == 2, "num_keys");
  c.append(p + "a", "x");
  c.multi_set({p + "m1", p + "m2"}, {"v1", "v2"});
  expect(c.multi_get({p + "m1", p + "a"}) == std::vector<std::string>{"v1", "2x"}, "multi_get");
  c.queue_push(p + "q", "item");
  expect(c.queue_len(p + "q") == 1, "queue_len");
  expect(c.queue_pop(p + "q") == std::optional<std::string>("item"), "queue_pop");
  expect(c.delete_key(p + "m2"), "delete_key");
  expect(c.list_keys().size() == 3, "list_keys");
  c.wait({p + "a"});
  c.ping();
}

// A scripted fake store: answers the handshake, then for each request after
// it calls `respond`, writing what it returns.
class FakeStore {
 public:
  using Respond = std::function<std::string(const Request&)>;
  explicit FakeStore(Respond respond) : respond_(std::move(respond)) {
    listen_fd_ = listen_loopback(port_);
    thread_ = std::thread([this] { run(); });
  }
  ~FakeStore() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  uint16_t port() const { return port_; }

 private:
  void run() {
    pollfd p{listen_fd_, POLLIN, 0};
    while (!stop_ && ::poll(&p, 1, 10) == 0) {
    }
    if (stop_) return;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    FrameDecoder dec;
    while (!stop_) {
      pollfd q{fd, POLLIN, 0};
      if (::poll(&q, 1, 10) <= 0) continue;
      uint8_t buf[4096];
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      std::span<const uint8_t> in(buf, static_cast<std::size_t>(n));
      Request r;
      while (dec.decode(in, r) == FrameDecoder::Status::kRequest) {
        std::string out;
        if (r.type == QueryType::kPing && !dec.mid_request()) {
          put_u32(out, r.u32);
        } else if (r.type != QueryType::kValidate) {
          out = respond_(r);
        }
        ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
      }
    }
    ::close(fd);
  }

  Respond respond_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

ClientOptions fast_options(uint16_t port, std::chrono::milliseconds timeout) {
  ClientOptions o;
  o.port = port;
  o.timeout = timeout;
  o.connect_backoff_initial = std::chrono::milliseconds(10);
  return o;
}

}  // namespace

TEST_CASE("client: nothing listening -> StoreError naming host:port and attempts") {
  uint16_t port = 0;
  ::close(listen_loopback(port));  // a port that was free a moment ago
  try {
    Client c(fast_options(port, std::chrono::milliseconds(200)));
    FAIL("connected to a closed port");
  } catch (const StoreTimeout&) {
    FAIL("connect failure must be a StoreError, not a timeout of an operation");
  } catch (const StoreError& e) {
    CHECK(contains(e.what(), "127.0.0.1:" + std::to_string(port)));
    CHECK(contains(e.what(), "attempt"));
  }
}

TEST_CASE("client: an IPv6 host in brackets ('[::1]', as --master-addr takes it) connects") {
  TestServer ts;
  ClientOptions plain = fast_options(ts.port(), std::chrono::seconds(5));
  plain.host = "::1";
  try {
    Client probe(plain);
  } catch (const StoreError& e) {
    MESSAGE("skipped: no IPv6 loopback here: " << e.what());
    return;
  }
  ClientOptions bracketed = plain;
  bracketed.host = "[::1]";
  Client c(bracketed);  // was: "cannot resolve [[::1]]:port"
  c.set("/v6", "ok");
  CHECK(c.get("/v6") == "ok");
  CHECK(c.peer() == "[::1]:" + std::to_string(ts.port()));
}

TEST_CASE(
    "client: a SET of a gpurun/live/ key is bound to the connection; closing it sets "
    "gpurun/lost/") {
  TestServer ts;
  Client watcher(ts.client_options());
  {
    Client node(ts.client_options());
    node.set("gpurun/live/node1", "up");
    CHECK(watcher.get("gpurun/live/node1") == "up");
    CHECK_FALSE(watcher.check({"gpurun/lost/node1"}));
  }  // the connection closes (as when a node's gpurun dies)
  watcher.wait({"gpurun/lost/node1"}, std::chrono::seconds(10));
  CHECK_FALSE(watcher.check({"gpurun/live/node1"}));
  CHECK(std::stoll(watcher.get("gpurun/lost/node1")) > 0);
}

TEST_CASE("client: every operation works against the server") {
  TestServer ts;
  Client c(ts.client_options());
  run_script(c, "/s/");
  CHECK(c.peer() == "127.0.0.1:" + std::to_string(ts.port()));
  CHECK(c.queue_pop("/empty", false) == std::nullopt);
  CHECK(c.compare_set("/s/none", "x", "y") == "x");
}

TEST_CASE("client: blocking queue_pop is woken by a push from another client") {
  TestServer ts;
  Client popper(ts.client_options());
  std::optional<std::string> got;
  std::thread t([&] { got = popper.queue_pop("/jobs"); });
  CHECK(eventually(
      [&] { return ts.on_io([&] { return ts.server().backend().num_pending_waits(); }) == 1; }));
  Client pusher(ts.client_options());
  pusher.queue_push("/jobs", "job-1");
  t.join();
  CHECK(got == std::optional<std::string>("job-1"));
  CHECK(pusher.queue_len("/jobs") == 0);
}

TEST_CASE("client: one client shared by threads serialises requests") {
  TestServer ts;
  Client c(ts.client_options());
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 100; ++j) c.add("/n", 1);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(c.add("/n", 0) == 800);
}

TEST_CASE("client: a STOP_WAITING that crosses CANCEL_WAIT is consumed (0 then 1)") {
  FakeStore fake([](const Request& r) -> std::string {
    if (r.type == QueryType::kWait) return "";  // never answers in time
    if (r.type == QueryType::kCancelWait) return std::string("\x00\x01", 2);  // crossed
    if (r.type == QueryType::kGetNumKeys) {
      std::string out;
      put_i64(out, 5);
      return out;
    }
    return "";
  });
  Client c(fast_options(fake.port(), std::chrono::seconds(20)));
  CHECK_THROWS_AS(c.wait({"k"}, std::chrono::milliseconds(20)), StoreTimeout);
  CHECK(c.num_keys() == 5);  // stream still in sync
}

TEST_CASE("client: a bad CANCEL_WAIT reply or a short PING echo is a StoreError") {
  FakeStore fake([](const Request& r) -> std::string {
    if (r.type == QueryType::kCancelWait) return std::string("\x02", 1);
    return "";
  });
  Client c(fast_options(fake.port(), std::chrono::seconds(20)));
  try {
    c.wait({"k"}, std::chrono::milliseconds(20));
    FAIL("bad reply accepted");
  } catch (const StoreTimeout&) {
    FAIL("a protocol error must not look like a timeout");
  } catch (const StoreError& e) {
    CHECK(contains(e.what(), "CANCEL_WAIT"));
  }
  try {
    c.ping();
    FAIL("closed connection reused");
  } catch (const StoreError& e) {
    CHECK(contains(e.what(), "earlier error"));
  }
}

TEST_CASE("client: server cut after n bytes -> clear StoreError, never a hang (every n)") {
  TestServer ts;
  int completed = 0, failed_connect = 0, failed_midway = 0;
  for (std::size_t n = 0;; ++n) {
    // The previous iteration's proxy may still be delivering bytes to the
    // server: wait until its session is gone, so no stale SET lands after the reset.
    REQUIRE(eventually([&] { return ts.on_io([&] { return ts.server().num_sessions(); }) == 0; }));
    ts.on_io([&] { ts.server().reset_keyspace("\xff no key starts like this"); });
    CuttingProxy proxy(ts.port(), n);
    const std::string peer = "127.0.0.1:" + std::to_string(proxy.port());
    try {
      Client c(fast_options(proxy.port(), std::chrono::milliseconds(300)));
      try {
        run_script(c, "/it/");
        ++completed;
        break;  // the budget covers the whole script: done
      } catch (const StoreError& e) {
        ++failed_midway;
        CHECK_MESSAGE(contains(e.what(), peer), e.what());
      }
    } catch (const StoreError& e) {
      ++failed_connect;
      CHECK_MESSAGE(contains(e.what(), peer), e.what());
    }
    REQUIRE(n < 5000);
  }
  CHECK(completed == 1);
  CHECK(failed_connect == 14);  // VALIDATE (5) + PING (5) + echo (4)
  CHECK(failed_midway > 100);
}

}  // namespace gpurun::store
