#include "store/backend.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpurun/error.hpp"

namespace gpurun::store {
namespace {

// A backend that records which connections were sent STOP_WAITING.
struct Recorder {
  std::vector<ConnectionId> woken;
  Backend backend;
  explicit Recorder(Limits limits = {})
      : backend(limits, [this](ConnectionId c) { woken.push_back(c); }) {}
};

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("backend: SET, GET of a missing key is empty, DELETE_KEY reports removal") {
  Backend b;
  CHECK(b.get("k").empty());
  b.set("k", "v");
  CHECK(b.get("k") == "v");
  CHECK(b.delete_key("k"));
  CHECK_FALSE(b.delete_key("k"));
  CHECK(b.get("k").empty());
}

TEST_CASE("backend: COMPARE_SET four cases, each waking waiters") {
  Recorder r;
  Backend& b = r.backend;
  CHECK_FALSE(b.wait(1, {"k"}));
  CHECK(b.compare_set("k", "x", "new") == "x");  // missing, expected non-empty
  CHECK(b.get("k").empty());
  CHECK(b.num_keys() == 0);
  CHECK(r.woken == std::vector<ConnectionId>{1});

  CHECK(b.compare_set("k", "", "first") == "first");  // missing, expected empty
  CHECK(b.get("k") == "first");
  CHECK(b.compare_set("k", "first", "second") == "second");  // present, equal
  CHECK(b.get("k") == "second");
  CHECK_FALSE(b.wait(2, {"other"}));
  CHECK(b.compare_set("k", "nope", "third") == "second");  // present, different
  CHECK(b.get("k") == "second");
}

TEST_CASE("backend: ADD stores decimal text and parses like stoll") {
  Backend b;
  CHECK(b.add("n", 5) == 5);
  CHECK(b.add("n", -7) == -2);
  CHECK(b.get("n") == "-2");
  b.set("s", " \t12abc");
  CHECK(b.add("s", 1) == 13);
  CHECK(b.get("s") == "13");
  b.set("p", "+40");
  CHECK(b.add("p", 2) == 42);
  b.set("bad", "abc");
  try {
    b.add("bad", 1);
    FAIL("non-numeric ADD accepted");
  } catch (const StoreError& e) {
    CHECK(std::string(e.what()).find("'bad'") != std::string::npos);
    CHECK(std::string(e.what()).find("not an integer") != std::string::npos);
  }
  CHECK(b.get("bad") == "abc");
  b.set("empty", "");
  CHECK_THROWS_AS(b.add("empty", 1), StoreError);
  b.set("big", "99999999999999999999");
  CHECK_THROWS_AS(b.add("big", 1), StoreError);
  b.set("max", "9223372036854775807");
  CHECK_THROWS_AS(b.add("max", 1), StoreError);
  b.set("min", "-9223372036854775808");
  CHECK(b.add("min", 1) == -9223372036854775807LL);
}

TEST_CASE("backend: WAIT replies at once when present, else counts missing keys") {
  Recorder r;
  Backend& b = r.backend;
  b.set("a", "1");
  CHECK(b.wait(1, {"a"}));
  CHECK(b.wait(1, {}));
  CHECK_FALSE(b.wait(1, {"a", "b", "c"}));
  CHECK(b.pending_waits(1) == 2);
  b.set("b", "1");
  CHECK(r.woken.empty());
  b.append("c", "x");
  CHECK(r.woken == std::vector<ConnectionId>{1});
  CHECK(b.pending_waits(1) == 0);
  CHECK(b.num_pending_waits() == 0);
  b.set("c", "again");  // the wait is forgotten: no second notification
  CHECK(r.woken.size() == 1);
}

TEST_CASE("backend: abandon_prefix ends the waits under it and refuses new ones") {
  Recorder r;
  Backend& b = r.backend;
  std::vector<ConnectionId> closed;
  b.set_close_connection([&](ConnectionId c, const std::string& why) {
    CHECK(why.find("will never be written") != std::string::npos);
    closed.push_back(c);
  });
  b.set("g/1/comm/train/pg/0", "addr0");
  // Rank 0 of torch's rendezvous waits for rank 1's address; another connection waits on a
  // key elsewhere; a third on both.
  CHECK_FALSE(b.wait(1, {"g/1/comm/train/pg/1"}));
  CHECK_FALSE(b.wait(2, {"g/1/abort-not-under"}));
  CHECK_FALSE(b.wait(3, {"g/1/comm/train/pg/1", "elsewhere"}));
  CHECK_FALSE(b.wait(5, {"/g/1/comm/train/pg/0/rank_1"}));  // as torch's TCPStore sends it
  b.abandon_prefix("g/1/comm/");
  std::sort(closed.begin(), closed.end());
  CHECK(closed == std::vector<ConnectionId>{1, 3, 5});  // their connections are closed
  CHECK(r.woken.empty());
  CHECK(b.pending_waits(1) == 0);
  CHECK(b.pending_waits(3) == 0);
  CHECK(b.pending_waits(2) == 1);
  // A new WAIT on a missing key there closes its connection (StoreError); a present key, or
  // a key elsewhere, is unaffected.
  CHECK_THROWS_WITH_AS(b.wait(1, {"g/1/comm/train/pg/1"}),
                       doctest::Contains("gpurun abandoned the keys under 'g/1/comm/'"),
                       StoreError);
  CHECK(b.wait(1, {"g/1/comm/train/pg/0"}));
  CHECK_FALSE(b.wait(4, {"g/2/comm/train/pg/1"}));
  b.set("g/1/comm/train/pg/1", "late");  // no waiter left on it: nobody is woken
  CHECK(r.woken.empty());
  CHECK_THROWS_AS(b.wait(5, {"/g/1/comm/train/pg/0/rank_1"}), StoreError);
  b.reset_keyspace("keep/");  // a restart: the prefix may be used again
  CHECK_FALSE(b.wait(1, {"g/1/comm/train/pg/1"}));
}

TEST_CASE("backend: every writer wakes; DELETE_KEY does not") {
  Recorder r;
  Backend& b = r.backend;
  b.wait(1, {"k1"});
  b.wait(2, {"k2"});
  b.wait(3, {"k3"});
  b.wait(4, {"k4"});
  b.wait(5, {"k5"});
  b.delete_key("k1");
  CHECK(r.woken.empty());
  b.set("k1", "");
  b.add("k2", 1);
  b.append("k3", "x");
  b.compare_set("k4", "", "v");
  b.multi_set({"k5", "z"}, {"1", "2"});
  CHECK(r.woken == std::vector<ConnectionId>{1, 2, 3, 4, 5});
}

TEST_CASE("backend: CANCEL_WAIT and connection drop forget waits") {
  Recorder r;
  Backend& b = r.backend;
  b.wait(1, {"k"});
  b.wait(2, {"k"});
  b.wait(3, {"k", "j"});
  b.cancel_waits(1);
  b.drop_connection(3);
  CHECK(b.pending_waits(1) == 0);
  CHECK(b.num_pending_waits() == 1);
  b.set("k", "v");
  CHECK(r.woken == std::vector<ConnectionId>{2});
  b.set("j", "v");
  CHECK(r.woken.size() == 1);
  b.cancel_waits(99);  // nothing pending: harmless
}

TEST_CASE("backend: a live key's connection closing deletes it and sets its lost key") {
  Recorder r;
  Backend& b = r.backend;
  b.set("gpurun/live/node1", "host-a 42");
  b.bind_live(7, "gpurun/live/node1");
  b.set("gpurun/live/node2", "host-b 43");
  b.bind_live(8, "gpurun/live/node2");
  b.bind_live(7, "other/key");  // not a live key: ignored
  b.wait(9, {"gpurun/lost/node1"});
  b.drop_connection(8);  // node 2 only
  CHECK(b.check({"gpurun/live/node1"}));
  CHECK_FALSE(b.check({"gpurun/live/node2"}));
  CHECK(b.check({"gpurun/lost/node2"}));
  CHECK_FALSE(b.check({"gpurun/lost/node1"}));
  CHECK(r.woken.empty());
  const auto before = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  b.drop_connection(7);
  CHECK_FALSE(b.check({"gpurun/live/node1"}));
  const int64_t lost_ms = std::stoll(b.get("gpurun/lost/node1"));
  CHECK(lost_ms >= before);
  CHECK(lost_ms <= before + 60'000);
  CHECK(r.woken == std::vector<ConnectionId>{9});  // a WAIT on the lost key is woken
  b.drop_connection(7);                            // twice: nothing more happens
  CHECK(b.get("gpurun/lost/node1") == std::to_string(lost_ms));
}

TEST_CASE("backend: a live key SET again by another connection moves to it") {
  Recorder r;
  Backend& b = r.backend;
  b.bind_live(1, "gpurun/live/n");
  b.set("gpurun/live/n", "second");
  b.bind_live(2, "gpurun/live/n");
  b.drop_connection(1);
  CHECK(b.get("gpurun/live/n") == "second");
  CHECK_FALSE(b.check({"gpurun/lost/n"}));
  b.drop_connection(2);
  CHECK(b.check({"gpurun/lost/n"}));
}

TEST_CASE("backend: per-connection limit on pending wait registrations") {
  Limits limits;
  limits.max_pending_waits_per_connection = 3;
  Recorder r(limits);
  Backend& b = r.backend;
  CHECK_FALSE(b.wait(1, {"a", "b"}));
  try {
    b.wait(1, {"c", "d"});
    FAIL("limit not enforced");
  } catch (const StoreError& e) {
    CHECK(std::string(e.what()).find("limit of 3") != std::string::npos);
  }
  CHECK(b.pending_waits(1) == 2);
  CHECK_FALSE(b.wait(1, {"c"}));
  CHECK_FALSE(b.wait(2, {"a", "b", "c"}));  // other connections have their own budget
  b.set("a", "");
  CHECK(b.pending_waits(1) == 2);
}

TEST_CASE("backend: queues are FIFO, separate from KV, and a push wakes one waiter") {
  Recorder r;
  Backend& b = r.backend;
  CHECK(b.queue_pop("q") == std::make_pair(int64_t{0}, std::optional<std::string>()));
  CHECK_FALSE(b.check({"q"}));
  CHECK_FALSE(b.wait(1, {"q"}));
  CHECK_FALSE(b.wait(2, {"q"}));
  b.queue_push("q", "first");
  CHECK(r.woken == std::vector<ConnectionId>{1});
  b.queue_push("q", "second");
  CHECK(r.woken == std::vector<ConnectionId>{1, 2});
  CHECK(b.queue_len("q") == 2);
  CHECK(b.check({"q"}));
  CHECK(b.wait(3, {"q"}));
  CHECK(b.get("q").empty());
  CHECK(b.num_keys() == 0);
  CHECK(b.list_keys().empty());
  CHECK(b.queue_pop("q") == std::make_pair(int64_t{2}, std::optional<std::string>("first")));
  CHECK(b.queue_pop("q") == std::make_pair(int64_t{1}, std::optional<std::string>("second")));
  CHECK(b.queue_len("q") == 0);
  b.set("q", "kv");  // same name in KV is independent
  CHECK(b.queue_len("q") == 0);
  CHECK(b.get("q") == "kv");
}

TEST_CASE("backend: GETNUMKEYS, LIST_KEYS, MULTI_GET, CHECK") {
  Backend b;
  b.multi_set({"/a", "init/", "/b"}, {"1", "2", "3"});
  b.queue_push("q", "x");
  CHECK(b.num_keys() == 3);
  CHECK(sorted(b.list_keys()) == std::vector<std::string>{"/a", "/b", "init/"});
  CHECK(b.multi_get({"/b", "missing", "/a"}) == std::vector<std::string>{"3", "", "1"});
  CHECK(b.check({"/a", "/b"}));
  CHECK_FALSE(b.check({"/a", "missing"}));
}

TEST_CASE("backend: reset_keyspace keeps keys and queues under the prefix only") {
  Recorder r;
  Backend& b = r.backend;
  b.set("gpurun/generation", "3");
  b.set("/default_pg/0//cpu//0/0", "addr");
  b.set("init/", "2");
  b.queue_push("gpurun/events", "e");
  b.queue_push("/q", "x");
  b.wait(7, {"init/x"});
  b.reset_keyspace("gpurun/");
  CHECK(b.list_keys() == std::vector<std::string>{"gpurun/generation"});
  CHECK(b.queue_len("gpurun/events") == 1);
  CHECK(b.queue_len("/q") == 0);
  CHECK(b.add("init/", 1) == 1);  // the old counter is gone
  CHECK(b.num_pending_waits() == 1);
  b.set("init/x", "");
  CHECK(r.woken == std::vector<ConnectionId>{7});
}

}  // namespace gpurun::store

TEST_CASE("write observer sees writes under its prefix only, after the value is stored") {
  gpurun::store::Backend b;
  std::vector<std::string> seen;
  // The observer runs with the backend locked, so it cannot read the store
  // itself; a read posted from it (as the elastic controller does) runs later.
  std::vector<std::string> posted;
  b.set_write_observer("gpurun/", [&](const std::string& key) { posted.push_back(key); });
  auto run_posted = [&] {
    for (const auto& k : posted) seen.push_back(k + "=" + b.get(k));
    posted.clear();
  };
  b.set("gpurun/a", "1");
  run_posted();
  b.set("other/a", "2");
  run_posted();
  b.add("gpurun/n", 5);
  run_posted();
  b.append("gpurun/a", "x");
  run_posted();
  b.compare_set("gpurun/c", "", "y");
  run_posted();
  b.multi_set({"gpurun/m", "zzz"}, {"3", "4"});
  run_posted();
  b.queue_push("gpurun/q", "v");  // queues are not KV writes
  run_posted();
  CHECK(seen == std::vector<std::string>{"gpurun/a=1", "gpurun/n=5", "gpurun/a=1x", "gpurun/c=y",
                                         "gpurun/m=3"});
}

TEST_CASE("backend: concurrent writers and waiters on many threads lose no count and no wake-up") {
  std::mutex mu;
  std::map<gpurun::store::ConnectionId, int> woken;
  gpurun::store::Backend b({}, [&](gpurun::store::ConnectionId c) {
    std::lock_guard<std::mutex> lock(mu);
    ++woken[c];
  });
  constexpr int kThreads = 8;
  constexpr int kRounds = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&b, t] {
      const auto conn = static_cast<gpurun::store::ConnectionId>(t + 1);
      for (int i = 0; i < kRounds; ++i) {
        b.add("counter", 1);
        // Wait on a key the next thread sets (this round's), then set ours.
        const std::string mine = "k/" + std::to_string(t) + "/" + std::to_string(i);
        const std::string next =
            "k/" + std::to_string((t + 1) % kThreads) + "/" + std::to_string(i);
        if (b.wait(conn, {next})) b.cancel_waits(conn);  // present already: nothing pending
        b.set(mine, "v");
        if (i % 64 == 0) b.cancel_waits(conn);  // a CANCEL_WAIT racing a wake
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(b.get("counter") == std::to_string(kThreads * kRounds));
  CHECK(b.num_keys() == kThreads * kRounds + 1);
  CHECK(b.num_pending_waits() == 0);  // every key was set: each wait was woken or cancelled
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [conn, n] : woken) CHECK(n <= kRounds);
}
