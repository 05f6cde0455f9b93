#include "store/server.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "store/client.hpp"
#include "test_util.hpp"

namespace gpurun::store {

using testing::eventually;
using testing::frame;
using testing::RawConn;
using testing::TestServer;
using testing::validate_frame;

TEST_CASE("server: port 0 picks a port; a torch handshake gets its PING echoed") {
  TestServer ts;
  CHECK(ts.port() != 0);
  RawConn c(ts.port());
  REQUIRE(c.connected());
  c.send(std::string("\x00\xce\xf7\x85\x3c\x0d\x39\x30\x00\x00", 10));
  CHECK(c.read(4) == std::string("\x39\x30\x00\x00", 4));
  CHECK(eventually([&] { return ts.on_io([&] { return ts.server().num_sessions(); }) == 1; }));
}

TEST_CASE("server: many clients add concurrently and agree on the total") {
  TestServer ts;
  constexpr int kClients = 32;
  constexpr int kAdds = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        Client c(ts.client_options());
        for (int j = 0; j < kAdds; ++j) c.add("counter", 1);
        c.set("/rank/" + std::to_string(i), std::to_string(i));
        if (c.get("/rank/" + std::to_string(i)) != std::to_string(i)) ++failures;
      } catch (const std::exception&) {
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  Client c(ts.client_options());
  CHECK(c.add("counter", 0) == kClients * kAdds);
  CHECK(c.num_keys() == kClients + 1);
}

TEST_CASE("server: a blocking WAIT on one connection does not block others") {
  TestServer ts;
  Client waiter(ts.client_options());
  std::atomic<bool> done{false};
  std::string got;
  std::thread t([&] {
    got = waiter.get("/late");
    done = true;
  });
  CHECK(eventually(
      [&] { return ts.on_io([&] { return ts.server().backend().num_pending_waits(); }) == 1; }));
  Client other(ts.client_options());
  for (int i = 0; i < 100; ++i) other.set("/k" + std::to_string(i), "v");
  CHECK(other.get("/k99") == "v");
  CHECK(other.num_keys() == 100);
  CHECK_FALSE(done.load());  // nothing set "/late" yet
  other.set("/late", "here");
  t.join();
  CHECK(got == "here");
}

TEST_CASE("server: CANCEL_WAIT always replies 1; a timed-out client stays usable") {
  TestServer ts;
  RawConn raw(ts.port());
  raw.send(validate_frame() + frame({QueryType::kCancelWait, {}, {}, 0, 0}));
  CHECK(raw.read(1) == std::string(1, '\x01'));
  raw.send(frame({QueryType::kWait, {"never"}, {}, 0, 0}) +
           frame({QueryType::kCancelWait, {}, {}, 0, 0}));
  CHECK(raw.read(1) == std::string(1, '\x01'));
  CHECK(eventually(
      [&] { return ts.on_io([&] { return ts.server().backend().num_pending_waits(); }) == 0; }));
  // A cancelled wait never gets its STOP_WAITING later.
  Client c(ts.client_options());
  c.set("never", "now");
  raw.send(frame({QueryType::kPing, {}, {}, 0, 42}));
  CHECK(raw.read(4) == std::string("\x2a\x00\x00\x00", 4));

  try {
    c.wait({"/absent", "/also"}, std::chrono::milliseconds(50));
    FAIL("wait did not time out");
  } catch (const StoreTimeout& e) {
    const std::string what = e.what();
    CHECK(what.find("'/absent'") != std::string::npos);
    CHECK(what.find("timed out after") != std::string::npos);
  }
  c.set("/x", "1");
  CHECK(c.get("/x") == "1");
}

TEST_CASE("server: a malformed client is dropped with a logged reason; others carry on") {
  TestServer ts;
  Client good(ts.client_options());
  good.set("/a", "1");

  RawConn bad(ts.port());
  bad.send(validate_frame() + std::string(1, '\xc8'));
  CHECK(bad.closed_by_peer());
  CHECK(eventually([&] { return ts.log_contains("unknown command byte 200"); }));
  CHECK(ts.log_contains("from 127.0.0.1:"));

  RawConn old(ts.port());
  old.send(std::string("\x03", 1));
  CHECK(old.closed_by_peer());
  CHECK(eventually([&] { return ts.log_contains("pre-2.2 TCPStore client (torch 1.13?)"); }));

  RawConn big(ts.port());
  std::string frame_bytes = validate_frame();
  put_u8(frame_bytes, static_cast<uint8_t>(QueryType::kSet));
  put_u64(frame_bytes, 8193);
  big.send(frame_bytes);
  CHECK(big.closed_by_peer());

  RawConn notnum(ts.port());
  notnum.send(validate_frame() + frame({QueryType::kAdd, {"/a"}, {}, 0, 0}) +
              frame({QueryType::kSet, {"/a"}, {"text"}, 0, 0}) +
              frame({QueryType::kAdd, {"/a"}, {}, 1, 0}));
  CHECK(notnum.read(8).size() == 8);  // the first ADD on "1" works
  CHECK(notnum.closed_by_peer());
  CHECK(eventually([&] { return ts.log_contains("not an integer"); }));

  CHECK(good.get("/a") == "text");
  good.set("/b", "2");
  CHECK(good.get("/b") == "2");
  CHECK(eventually([&] { return ts.on_io([&] { return ts.server().num_sessions(); }) == 1; }));
}

TEST_CASE("server: EOF drops the connection's waits") {
  TestServer ts;
  {
    RawConn raw(ts.port());
    raw.send(validate_frame() + frame({QueryType::kWait, {"/k", "/j"}, {}, 0, 0}));
    CHECK(eventually(
        [&] { return ts.on_io([&] { return ts.server().backend().num_pending_waits(); }) == 1; }));
  }
  CHECK(eventually([&] {
    return ts.on_io([&] {
      return ts.server().backend().num_pending_waits() + ts.server().num_sessions();
    }) == 0;
  }));
  Client c(ts.client_options());
  c.set("/k", "v");
  CHECK(c.get("/k") == "v");
}

TEST_CASE("server: a busy port is an error naming host and port") {
  TestServer first;
  ServerOptions o;
  o.hosts = {"127.0.0.1"};
  o.port = first.port();
  boost::asio::io_context io;
  try {
    Server second(io, o);
    FAIL("second server bound a busy port");
  } catch (const StoreError& e) {
    CHECK(std::string(e.what()).find("cannot listen on 127.0.0.1:" +
                                     std::to_string(first.port())) != std::string::npos);
  }
}

TEST_CASE("server: default hosts listen on IPv4 and (when present) IPv6 loopback") {
  TestServer ts;
  Client v4(ts.client_options());
  v4.set("/x", "1");
  // "localhost" may resolve to ::1 first; either address reaches the same store.
  ClientOptions lo = ts.client_options();
  lo.host = "localhost";
  Client any(lo);
  CHECK(any.get("/x") == "1");
}

TEST_CASE("server: reset_keyspace keeps gpurun/ keys for the next attempt") {
  TestServer ts;
  Client c(ts.client_options());
  c.set("gpurun/generation", "4");
  c.set("/default_pg/0//cpu//0/0", "blob");
  c.add("init/", 2);
  c.queue_push("/jobs", "j");
  CHECK(c.num_keys() == 3);  // a round trip: the server has applied everything above
  ts.on_io([&] { ts.server().reset_keyspace("gpurun/"); });
  CHECK(c.list_keys() == std::vector<std::string>{"gpurun/generation"});
  CHECK(c.num_keys() == 1);
  CHECK(c.add("init/", 1) == 1);
  CHECK(c.queue_len("/jobs") == 0);
  CHECK(c.get("gpurun/generation") == "4");
}

TEST_CASE("server: close() drops clients; their next call fails with a StoreError") {
  TestServer ts;
  Client c(ts.client_options());
  c.set("/a", "1");
  ts.on_io([&] { ts.server().close(); });
  ts.on_io([&] { ts.server().close(); });  // idempotent
  CHECK_THROWS_AS(c.get("/a"), StoreError);
  CHECK(ts.on_io([&] { return ts.server().num_sessions(); }) == 0);
}

}  // namespace gpurun::store
