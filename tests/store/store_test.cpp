// The Store contract (gpurun/store/store.hpp), run against every implementation: the client
// over a real server, node 0's backend in process, and the tests' in-memory fake.
#include "gpurun/store/store.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "check_text.hpp"
#include "gpurun/error.hpp"
#include "gpurun/store/client_store.hpp"
#include "store/backend.hpp"
#include "store/backend_store.hpp"
#include "testing/memory_store.hpp"
#include "testing/store_server.hpp"

namespace gpurun::store {
namespace {

using gpurun::testing::contains;
using namespace std::chrono_literals;

struct OverClient {
  static constexpr const char* kName = "ClientStore";
  testing::TestServer server;
  ClientStore client{server.client_options()};
  Store& store() { return client; }
  HostedStore* hosted() { return nullptr; }  // the wire has no reset_keyspace
};

struct OverBackend {
  static constexpr const char* kName = "BackendStore";
  Backend backend;
  BackendStore local{backend, 1ms};
  Store& store() { return local; }
  HostedStore* hosted() { return &local; }
};

struct InMemory {
  static constexpr const char* kName = "MemoryStore";
  testing::MemoryStore memory;
  Store& store() { return memory; }
  HostedStore* hosted() { return &memory; }
};

#define GPURUN_STORES OverClient, OverBackend, InMemory

TEST_CASE_TEMPLATE("store: set, try_get and get return the bytes set", T, GPURUN_STORES) {
  T f;
  INFO(T::kName);
  Store& s = f.store();
  CHECK_FALSE(s.try_get("k").has_value());
  const std::string bytes("a\0b", 3);
  s.set("k", bytes);
  CHECK(s.try_get("k") == bytes);
  CHECK(s.get("k", 1s) == bytes);
  s.set("k", "v2");
  CHECK(s.get("k", Store::kNoTimeout) == "v2");
}

TEST_CASE_TEMPLATE("store: get and wait give up after their timeout, naming the key", T,
                   GPURUN_STORES) {
  T f;
  INFO(T::kName);
  Store& s = f.store();
  s.set("present", "1");
  try {
    s.wait({"present", "missing-key"}, 20ms);
    FAIL("wait returned without the key");
  } catch (const StoreTimeout& e) {
    CHECK(contains(e.what(), "missing-key"));
  }
  CHECK_THROWS_AS(s.get("missing-key", 20ms), StoreTimeout);
  // The store is still usable after a timeout.
  s.set("missing-key", "here");
  CHECK(s.get("missing-key", 1s) == "here");
}

TEST_CASE_TEMPLATE("store: wait returns once another thread sets the keys", T, GPURUN_STORES) {
  T f;
  INFO(T::kName);
  Store& s = f.store();
  auto waiter = std::async(std::launch::async, [&s] {
    s.wait({"a", "b"}, Store::kNoTimeout);
    return s.try_get("b").value_or("");
  });
  s.set("a", "1");
  s.set("b", "2");
  CHECK(waiter.get() == "2");
}

TEST_CASE_TEMPLATE("store: compare_set has TCPStore's four cases", T, GPURUN_STORES) {
  T f;
  INFO(T::kName);
  Store& s = f.store();
  CHECK(s.compare_set("k", "x", "y") == "x");  // missing, expected given: nothing stored
  CHECK_FALSE(s.try_get("k").has_value());
  CHECK(s.compare_set("k", "", "first") == "first");       // missing, expected empty: stored
  CHECK(s.compare_set("k", "", "second") == "first");      // present, different: unchanged
  CHECK(s.compare_set("k", "first", "third") == "third");  // present, equal: replaced
  CHECK(s.try_get("k") == "third");
}

TEST_CASE_TEMPLATE(
    "store: add counts from zero and refuses a value that is not a number or overflows", T,
    GPURUN_STORES) {
  T f;
  INFO(T::kName);
  Store& s = f.store();
  CHECK(s.add("n", 0) == 0);
  CHECK(s.add("n", 5) == 5);
  CHECK(s.add("n", -2) == 3);
  CHECK(s.try_get("n") == "3");
  // A refused ADD ends a client's connection (the server closes it): one per subcase.
  SUBCASE("not a number") {
    s.set("text", "abc");
    CHECK_THROWS_AS(s.add("text", 1), StoreError);
  }
  SUBCASE("an overflow") {
    s.set("big", "9223372036854775807");
    CHECK_THROWS_AS(s.add("big", 1), StoreError);
  }
}

TEST_CASE_TEMPLATE("store: remove says whether the key existed", T, GPURUN_STORES) {
  T f;
  INFO(T::kName);
  Store& s = f.store();
  s.set("k", "v");
  CHECK(s.remove("k"));
  CHECK_FALSE(s.try_get("k").has_value());
  CHECK_FALSE(s.remove("k"));
}

TEST_CASE_TEMPLATE("store: reset_keyspace keeps only the keys under the prefix", T, OverBackend,
                   InMemory) {
  T f;
  INFO(T::kName);
  HostedStore& s = *f.hosted();
  s.set("gpurun/job/start", "1");
  s.set("torch/rank0", "addr");
  s.reset_keyspace("gpurun/");
  CHECK(s.try_get("gpurun/job/start") == "1");
  CHECK_FALSE(s.try_get("torch/rank0").has_value());
}

}  // namespace
}  // namespace gpurun::store
