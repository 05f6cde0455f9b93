#include "store/memory_budget.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check_text.hpp"
#include "gpurun/error.hpp"
#include "store/backend.hpp"

namespace gpurun::store {

namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * 1024;

using gpurun::testing::contains;

}  // namespace

TEST_CASE("memory budget: charges within the limit, refuses beyond it and changes nothing") {
  MemoryBudget b(64 * kKiB);
  CHECK(b.limit_bytes() == 64 * kKiB);
  CHECK(b.try_charge(40 * kKiB));
  CHECK(b.used_bytes() == 40 * kKiB);
  CHECK_FALSE(b.fits(30 * kKiB));
  CHECK_FALSE(b.try_charge(30 * kKiB));
  CHECK(b.used_bytes() == 40 * kKiB);
  CHECK(b.try_charge(24 * kKiB));  // exactly the limit
  CHECK(b.used_bytes() == 64 * kKiB);
  CHECK_FALSE(b.try_charge(1));
  b.release(64 * kKiB);
  CHECK(b.used_bytes() == 0);
  CHECK(b.peak_bytes() == 64 * kKiB);
  CHECK(b.try_charge(0));
}

TEST_CASE("memory budget: items over 64 KiB may use 7/8 of it; small ones all of it") {
  MemoryBudget b(8 * kMiB);  // large items: up to 7 MiB
  CHECK(b.try_charge(6 * kMiB));
  CHECK(b.available_bytes(kMiB) == kMiB);  // a large item: 7 MiB - 6 MiB
  CHECK(b.try_charge(kMiB));
  CHECK_FALSE(b.try_charge(128 * kKiB));  // large: over 7/8
  CHECK(b.try_charge(64 * kKiB));         // small: uses the reserve
  // A large item charged in small parts is classed by its whole size.
  CHECK_FALSE(b.try_charge(4 * kKiB, 512 * kKiB));
  CHECK(b.try_charge(4 * kKiB));
  CHECK(b.used_bytes() == 7 * kMiB + 68 * kKiB);
  b.charge(2 * kMiB);  // unconditional: may pass the limit
  CHECK(b.used_bytes() > b.limit_bytes());
  CHECK_FALSE(b.try_charge(1));
  CHECK(b.available_bytes(1) == 0);
}

TEST_CASE("memory budget: 0 is unlimited; the default is min(RAM/8, 4 GiB), at least 256 MiB") {
  MemoryBudget unlimited(0);
  CHECK(unlimited.try_charge(std::size_t{1} << 40));
  CHECK(unlimited.fits(std::size_t{1} << 41));
  CHECK(unlimited.used_bytes() == std::size_t{1} << 40);
  const std::size_t d = default_memory_budget_bytes();
  CHECK(d >= 256 * kMiB);
  CHECK(d <= std::size_t{4} << 30);
}

TEST_CASE("memory budget: concurrent try_charge never passes the limit") {
  MemoryBudget b(kMiB);
  std::vector<std::thread> threads;
  std::vector<std::size_t> got(4, 0);
  for (std::size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100000; ++i) {
        if (b.try_charge(100)) got[t] += 100;
      }
    });
  }
  for (auto& t : threads) t.join();
  std::size_t total = 0;
  for (std::size_t g : got) total += g;
  CHECK(total == b.used_bytes());
  CHECK(total <= kMiB);
  CHECK(total > kMiB - 100);  // filled up to the last 100-byte step
}

TEST_CASE("memory charge: gives back what it holds when removed or destroyed") {
  MemoryBudget b(kMiB);
  {
    MemoryCharge c(b);
    CHECK(c.try_add(1000));
    c.add(24);
    CHECK(c.held_bytes() == 1024);
    CHECK(b.used_bytes() == 1024);
    CHECK_FALSE(c.try_add(kMiB));
    CHECK(c.held_bytes() == 1024);
    c.remove(24);
    CHECK(b.used_bytes() == 1000);
    c.remove(5000);  // at most what it holds
    CHECK(c.held_bytes() == 0);
    CHECK(b.used_bytes() == 0);
    CHECK(c.try_add(4096));
  }
  CHECK(b.used_bytes() == 0);
}

TEST_CASE("memory budget: maybe_trim runs once enough bytes were released") {
  MemoryBudget b(256 * kMiB);  // trims after 4 MiB released
  CHECK(b.trim_after_bytes() == 4 * kMiB);
  CHECK(MemoryBudget(0).trim_after_bytes() == 64 * kMiB);
  b.charge(16 * kMiB);
  b.release(kMiB);
  CHECK_FALSE(b.maybe_trim());
  b.release(4 * kMiB);
#if defined(__GLIBC__)
  CHECK(b.maybe_trim());
#endif
  CHECK_FALSE(b.maybe_trim());  // the counter restarted
}

// ---- Backend accounting -------------------------------------------------------------

TEST_CASE("backend budget: KV entries are charged and given back exactly") {
  MemoryBudget budget(64 * kMiB);
  Backend b;
  b.set_memory_budget(&budget);
  CHECK(budget.used_bytes() == 0);
  b.set("k", std::string(kMiB, 'x'));
  const std::size_t one = b.stored_bytes();
  CHECK(one >= kMiB + 1);
  CHECK(one < kMiB + 256);  // payload plus a small per-entry estimate
  CHECK(budget.used_bytes() == one);
  b.set("k", "small");  // overwrite: shrinks
  CHECK(b.stored_bytes() < 256);
  b.append("k", std::string(2 * kMiB, 'y'));
  CHECK(b.stored_bytes() >= 2 * kMiB);
  CHECK(b.add("n", 5) == 5);
  CHECK(b.compare_set("c", "", std::string(kMiB, 'z')).size() == kMiB);
  b.multi_set({"m1", "m2"}, {std::string(1000, 'a'), std::string(2000, 'b')});
  CHECK(b.stored_bytes() >= 3 * kMiB + 3000);
  CHECK(budget.used_bytes() == b.stored_bytes());
  for (const char* k : {"k", "n", "c", "m1", "m2"}) CHECK(b.delete_key(k));
  CHECK(b.stored_bytes() == 0);
  CHECK(budget.used_bytes() == 0);
}

TEST_CASE("backend budget: queues, pending waits and reset_keyspace give their bytes back") {
  MemoryBudget budget(64 * kMiB);
  Backend b;
  b.set_memory_budget(&budget);
  b.queue_push("q", std::string(100000, 'v'));
  b.queue_push("q", "w");
  CHECK(b.stored_bytes() > 100000);
  CHECK(b.queue_pop("q").second->size() == 100000);
  CHECK(b.queue_pop("q").second == "w");
  CHECK(b.stored_bytes() == 0);

  // A WAIT holds its missing keys twice (its list and the per-key index) plus overhead.
  std::vector<std::string> keys;
  for (int i = 0; i < 100; ++i) keys.push_back(std::string(8000, 'a') + std::to_string(i));
  CHECK_FALSE(b.wait(1, keys));
  CHECK(b.stored_bytes() >= 2 * 100 * 8000);
  CHECK_FALSE(b.wait(2, {"x"}));
  b.cancel_waits(1);
  const std::size_t small_wait = b.stored_bytes();
  CHECK(small_wait > 0);
  CHECK(small_wait < 2048);
  b.set("x", "1");  // completes conn 2's wait: its registration goes, the entry stays
  CHECK(b.num_pending_waits() == 0);
  CHECK(b.stored_bytes() < 256);

  b.set("gpurun/keep", "1");
  b.set("/drop", std::string(kMiB, 'd'));
  b.queue_push("/dropq", std::string(kMiB, 'e'));
  const std::size_t keep = b.stored_bytes() - (2 * kMiB);
  b.reset_keyspace("gpurun/");
  CHECK(b.stored_bytes() < keep);
  CHECK(b.delete_key("gpurun/keep"));
  CHECK_FALSE(b.delete_key("x"));  // dropped by reset_keyspace
  CHECK(b.stored_bytes() == 0);
  CHECK(budget.used_bytes() == 0);
}

TEST_CASE("backend budget: a client's write that does not fit throws and stores nothing") {
  MemoryBudget budget(16 * kMiB);  // large items: up to 14 MiB
  Backend b;
  b.set_memory_budget(&budget);
  b.set("a", std::string(8 * kMiB, 'a'), Admit::kWithinBudget);
  try {
    b.set("b", std::string(8 * kMiB, 'b'), Admit::kWithinBudget);
    FAIL("an 8 MiB SET over the budget was admitted");
  } catch (const StoreError& e) {
    const std::string what = e.what();
    CHECK(contains(what, "SET of key 'b' with a value of 8388608 bytes"));
    CHECK(contains(what, "memory budget of 16777216 bytes"));
  }
  CHECK(b.get("b").empty());
  CHECK_THROWS_AS(b.append("a", std::string(7 * kMiB, 'x'), Admit::kWithinBudget), StoreError);
  CHECK(b.get("a").size() == 8 * kMiB);
  CHECK_THROWS_AS(b.queue_push("q", std::string(7 * kMiB, 'x'), Admit::kWithinBudget), StoreError);
  CHECK(b.queue_len("q") == 0);
  CHECK_THROWS_AS(b.multi_set({"m", "n"}, {std::string(4 * kMiB, 'm'), std::string(4 * kMiB, 'n')},
                              Admit::kWithinBudget),
                  StoreError);
  CHECK(b.num_keys() == 1);
  CHECK_THROWS_AS(b.compare_set("c", "", std::string(7 * kMiB, 'c'), Admit::kWithinBudget),
                  StoreError);
  CHECK(b.get("c").empty());

  std::vector<std::string> keys;
  for (int i = 0; i < 500; ++i) keys.push_back(std::string(8000, 'w') + std::to_string(i));
  try {
    b.wait(7, keys, Admit::kWithinBudget);
    FAIL("a WAIT over the budget was registered");
  } catch (const StoreError& e) {
    CHECK(contains(e.what(), "WAIT on 500 missing key(s)"));
  }
  CHECK(b.num_pending_waits() == 0);
  CHECK(b.pending_waits(7) == 0);

  // gpurun's own writes (Admit::kAlways, the default) are charged but never refused.
  b.set("gpurun/state", std::string(8 * kMiB, 's'));
  CHECK(budget.used_bytes() > budget.limit_bytes());
  CHECK(b.get("gpurun/state").size() == 8 * kMiB);
}

TEST_CASE("backend budget: GET and MULTI_GET refuse replies over their cap before copying") {
  Backend b;
  b.set("v", std::string(kMiB, 'v'));
  CHECK(b.get("v", kMiB).size() == kMiB);
  CHECK_THROWS_AS(b.get("v", kMiB - 1), StoreError);
  CHECK(b.get("missing", 0).empty());
  // One 1 MiB value named 100 times: a 100 MiB reply.
  const std::vector<std::string> keys(100, "v");
  try {
    b.multi_get(keys, 10 * kMiB);
    FAIL("a 100 MiB MULTI_GET reply was copied");
  } catch (const StoreError& e) {
    CHECK(contains(e.what(), "MULTI_GET request: its reply for 100 key(s)"));
  }
  CHECK(b.multi_get({"v", "v"}, 2 * kMiB + 16).size() == 2);
}

TEST_CASE("backend budget: a destroyed backend gives back everything it held") {
  MemoryBudget budget(64 * kMiB);
  {
    Backend b;
    b.set("before", std::string(1000, 'x'));  // stored before the budget was attached
    b.set_memory_budget(&budget);
    CHECK(budget.used_bytes() == b.stored_bytes());
    b.set("k", std::string(kMiB, 'k'));
    CHECK_FALSE(b.wait(1, {"never"}));
    CHECK(budget.used_bytes() > kMiB);
  }
  CHECK(budget.used_bytes() == 0);
}

}  // namespace gpurun::store
