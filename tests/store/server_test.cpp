#include "store/server.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpurun/error.hpp"
#include "gpurun/store/client.hpp"
#include "testing/store_server.hpp"

namespace gpurun::store {

using gpurun::kResidentMemoryMeasurable;
using testing::eventually;
using testing::frame;
using testing::RawConn;
using testing::resident_kib;
using testing::TestServer;
using testing::validate_frame;

namespace {

ServerOptions with_threads(std::size_t n) {
  ServerOptions o;
  o.threads = n;
  return o;
}

}  // namespace

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

  RawConn old(ts.port());  // a torch 1.13 client: served, but WATCH_KEY (7) is not
  std::string watch(1, '\x07');
  put_bytes(watch, "/k");
  old.send(watch);
  CHECK(old.closed_by_peer());
  CHECK(eventually([&] { return ts.log_contains("WATCH_KEY (code 7 of a torch 1.13 client"); }));

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

TEST_CASE(
    "server: close lines are capped at 20; one line says the rest are counted, the total "
    "comes when the store closes") {
  TestServer ts;
  constexpr int kBad = 30;
  for (int i = 0; i < kBad; ++i) {
    RawConn bad(ts.port());
    bad.send(validate_frame() + std::string(1, '\xc8'));
    REQUIRE(bad.closed_by_peer());
  }
  CHECK(eventually([&] {
    return ts.log_contains(
        "store: 21 connections closed with an error: only the first 20 "
        "are logged (the total follows when the store closes)");
  }));
  CHECK(ts.log_count("closed connection from") == 20);
  // A good client is still served, and its own errors would still count.
  Client good(ts.client_options());
  good.set("/a", "1");
  CHECK(good.get("/a") == "1");
  ts.destroy_server();
  CHECK(ts.log_count("closed connection from") == 20);
  CHECK(ts.log_count("store: and 10 more connections closed with an error (only the first 20 "
                     "are logged)") == 1);
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

// ---- Several reactor threads ------------------------------------------------------
// Connections to one address are handed to the reactors round-robin in accept
// order, so clients connected one after another (all to 127.0.0.1) land on
// reactors 0, 1, 2, ...

TEST_CASE("server: threads option: default, 0 and 1 resolve as documented") {
  CHECK(default_server_threads() >= 1);
  CHECK(default_server_threads() <= 8);
  TestServer dflt(with_threads(0));
  CHECK(dflt.server().threads() == default_server_threads());
  TestServer one(with_threads(1));
  CHECK(one.server().threads() == 1);
  Client c(one.client_options());
  c.set("/a", "1");
  CHECK(c.get("/a") == "1");
}

TEST_CASE("server: concurrent SET/ADD from clients on every reactor thread give exact counts") {
  for (std::size_t threads : {std::size_t{1}, std::size_t{4}}) {
    CAPTURE(threads);
    TestServer ts(with_threads(threads));
    CHECK(ts.server().threads() == threads);
    constexpr int kClients = 16;
    constexpr int kOps = 300;
    std::vector<std::thread> clients;
    std::atomic<int> failures{0};
    for (int i = 0; i < kClients; ++i) {
      clients.emplace_back([&, i] {
        try {
          Client c(ts.client_options());
          for (int j = 0; j < kOps; ++j) {
            c.add("/total", 1);
            c.add("/by/" + std::to_string(i), 2);
            c.set("/last/" + std::to_string(i), std::to_string(j));
            c.append("/log", "x");
          }
          if (c.get("/last/" + std::to_string(i)) != std::to_string(kOps - 1)) ++failures;
        } catch (const std::exception&) {
          ++failures;
        }
      });
    }
    for (auto& t : clients) t.join();
    CHECK(failures == 0);
    Client c(ts.client_options());
    CHECK(c.add("/total", 0) == kClients * kOps);
    for (int i = 0; i < kClients; ++i) CHECK(c.add("/by/" + std::to_string(i), 0) == 2 * kOps);
    CHECK(c.get("/log").size() == static_cast<std::size_t>(kClients * kOps));
    CHECK(c.num_keys() == 2 + 2 * kClients);
  }
}

TEST_CASE("server: a WAIT is released by a SET issued on another reactor thread") {
  TestServer ts(with_threads(2));
  Client waiter(ts.client_options());  // reactor 0
  Client setter(ts.client_options());  // reactor 1
  std::string got;
  std::thread t([&] { got = waiter.get("/late"); });
  CHECK(eventually([&] { return ts.server().backend().num_pending_waits() == 1; }));
  setter.set("/late", "here");
  t.join();
  CHECK(got == "here");

  // Ping-pong: each side waits for a key only the other side (thread) writes.
  // A lost wake-up hangs one side and fails the hang guard.
  constexpr int kRounds = 500;
  std::thread pong([&] {
    for (int i = 0; i < kRounds; ++i) {
      setter.wait({"/ping/" + std::to_string(i)});
      setter.set("/pong/" + std::to_string(i), "1");
    }
  });
  for (int i = 0; i < kRounds; ++i) {
    waiter.set("/ping/" + std::to_string(i), "1");
    waiter.wait({"/pong/" + std::to_string(i)});
  }
  pong.join();
  CHECK(ts.server().backend().num_pending_waits() == 0);
}

TEST_CASE("server: CANCEL_WAIT racing a SET on another thread never answers 1 before a 0") {
  TestServer ts(with_threads(4));
  RawConn raw(ts.port());  // reactor 0
  raw.send(validate_frame());
  Client setter(ts.client_options());  // reactor 1
  int crossed = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string key = "/race/" + std::to_string(i);
    std::thread t([&] { setter.set(key, "v"); });
    raw.send(frame({QueryType::kWait, {key}, {}, 0, 0}) +
             frame({QueryType::kCancelWait, {}, {}, 0, 0}) +
             frame({QueryType::kPing, {}, {}, 0, static_cast<uint32_t>(i)}));
    t.join();
    std::string first = raw.read(1);
    if (first == std::string(1, '\x00')) {
      ++crossed;
      first = raw.read(1);
    }
    REQUIRE(first == std::string(1, '\x01'));
    // Nothing else (no late STOP_WAITING) comes before the PING's echo.
    std::string echo = raw.read(4);
    REQUIRE(echo.size() == 4);
    uint32_t n = 0;
    std::memcpy(&n, echo.data(), 4);
    REQUIRE(n == static_cast<uint32_t>(i));
  }
  MESSAGE("STOP_WAITING crossed the CANCEL_WAIT in " << crossed << " of 300 rounds");
  CHECK(ts.server().backend().num_pending_waits() == 0);
}

TEST_CASE("server: a malformed frame closes only its session; sessions on other threads go on") {
  TestServer ts(with_threads(4));
  std::vector<std::unique_ptr<Client>> good;
  for (int i = 0; i < 3; ++i) good.push_back(std::make_unique<Client>(ts.client_options()));
  RawConn bad(ts.port());  // the 4th connection: the 4th reactor
  // A waiter on the bad connection: its close must drop the wait, not wake anyone.
  bad.send(validate_frame() + frame({QueryType::kWait, {"/never"}, {}, 0, 0}));
  CHECK(eventually([&] { return ts.server().backend().num_pending_waits() == 1; }));
  bad.send(std::string(1, '\xc8'));
  CHECK(bad.closed_by_peer());
  CHECK(eventually([&] { return ts.log_contains("unknown command byte 200"); }));
  CHECK(eventually([&] { return ts.server().num_sessions() == 3; }));
  CHECK(ts.server().backend().num_pending_waits() == 0);
  for (int i = 0; i < 3; ++i) {
    good[static_cast<std::size_t>(i)]->set("/g" + std::to_string(i), "ok");
    CHECK(good[static_cast<std::size_t>(i)]->get("/g" + std::to_string(i)) == "ok");
  }
}

TEST_CASE("server: close() with sessions and waits on every reactor thread") {
  auto ts = std::make_unique<TestServer>(with_threads(4));
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 8; ++i) clients.push_back(std::make_unique<Client>(ts->client_options()));
  std::vector<std::unique_ptr<RawConn>> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.push_back(std::make_unique<RawConn>(ts->port()));
    waiters.back()->send(validate_frame() + frame({QueryType::kWait, {"/never"}, {}, 0, 0}));
  }
  CHECK(eventually([&] { return ts->server().backend().num_pending_waits() == 4; }));
  CHECK(ts->server().num_sessions() == 12);
  ts->on_io([&] { ts->server().close(); });
  CHECK(ts->server().num_sessions() == 0);  // close() waits for every thread
  CHECK(ts->server().backend().num_pending_waits() == 0);
  for (auto& w : waiters) CHECK(w->closed_by_peer());
  for (auto& c : clients) CHECK_THROWS_AS(c->get("/a"), StoreError);
  RawConn late(ts->port());
  CHECK_FALSE(late.connected());
  ts.reset();  // joins the reactor threads
}

TEST_CASE("server: destroying a busy multi-threaded server joins its threads") {
  for (int round = 0; round < 5; ++round) {
    auto ts = std::make_unique<TestServer>(with_threads(4));
    std::atomic<bool> stop{false};
    std::vector<std::thread> load;
    for (int i = 0; i < 4; ++i) {
      load.emplace_back([&] {
        try {
          Client c(ts->client_options());
          while (!stop) c.add("/n", 1);
        } catch (const std::exception&) {
          // the server went away under the client: expected
        }
      });
    }
    CHECK(eventually([&] { return ts->server().num_sessions() == 4; }));
    ts.reset();
    stop = true;
    for (auto& t : load) t.join();
  }
}

TEST_CASE("server: requests sent without reading the replies wait once 16 MiB are unsent") {
  // 80 GETs of a 1 MiB value in one send: 80 MiB of replies. The session handles requests
  // until its unsent replies pass the limit, keeps the rest, and answers them as the client
  // reads: memory stays near the limit (the server runs in this process: its resident size
  // grows by far less than 80 MiB), every reply arrives, in order, and the connection stays.
  for (std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
    CAPTURE(threads);
    TestServer ts(with_threads(threads));
    Client c(ts.client_options());
    std::string value(1u << 20, '\0');
    for (std::size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 131 % 251);
    c.set("/v", value);
    REQUIRE(c.get("/v") == value);  // SET has no reply: a round trip makes sure it landed

    RawConn raw(ts.port());
    std::string requests = validate_frame();
    constexpr int kGets = 80;
    for (int i = 0; i < kGets; ++i) requests += frame({QueryType::kGet, {"/v"}, {}, 0, 0});
    const int64_t rss_before = resident_kib();
    raw.send(requests);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the server stall
    // Under AddressSanitizer freed memory stays resident in its quarantine (256 MiB by
    // default: every freed reply buffer counts), so the bound would measure ASan, not the
    // session (68 MiB with the quarantine, within the bound with quarantine_size_mb=0); under
    // ThreadSanitizer its shadow memory adds to each page touched (49 MiB).
    if (kResidentMemoryMeasurable) CHECK(resident_kib() - rss_before < 48 * 1024);
    for (int i = 0; i < kGets; ++i) {
      const std::string len = raw.read(8);
      REQUIRE(len.size() == 8);
      uint64_t n = 0;
      std::memcpy(&n, len.data(), 8);
      REQUIRE(n == value.size());
      REQUIRE(raw.read(value.size()) == value);
    }
    raw.send(frame({QueryType::kGet, {"/v"}, {}, 0, 0}));  // still served afterwards
    CHECK(raw.read(8 + value.size()).size() == 8 + value.size());
    CHECK_FALSE(ts.log_contains("closed connection"));
  }
}

}  // namespace gpurun::store
