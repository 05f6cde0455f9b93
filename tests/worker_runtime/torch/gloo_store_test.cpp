// Gloo's rendezvous store over gpurun's Store (comm/gloo/store.hpp), in process over the
// in-memory fake: keys under the group's prefix, its own keys deleted, the abort key ending a
// wait with gpurun's reason.
#if GPURUN_HAVE_GLOO
#include "comm/gloo/store.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "check_text.hpp"
#include "gpurun/error.hpp"
#include "testing/memory_store.hpp"

namespace gpurun::rt {
namespace {

using store::testing::MemoryStore;
using namespace std::chrono_literals;

/// A GlooStore over a MemoryStore that the test keeps a view of.
struct Fixture {
  MemoryStore* memory = nullptr;
  std::unique_ptr<GlooStore> gloo;
  explicit Fixture(AbortKey abort = {}) {
    auto m = std::make_unique<MemoryStore>();
    memory = m.get();
    gloo = std::make_unique<GlooStore>(std::move(m), "gen/3/gloo", 20ms, std::move(abort));
  }
};

TEST_CASE("gloo store: keys live under the group's prefix; only its own keys are deleted") {
  Fixture f;
  f.gloo->set("rank0", std::vector<char>{'a', '\0', 'b'});
  CHECK(f.memory->try_get("gen/3/gloo/rank0") == std::string("a\0b", 3));
  CHECK(f.gloo->get("rank0") == std::vector<char>{'a', '\0', 'b'});
  f.memory->set("gen/3/gloo/rank1", "theirs");
  CHECK(f.gloo->exists("rank1"));
  CHECK_FALSE(f.gloo->exists("rank2"));
  CHECK(f.gloo->own_keys() == std::vector<std::string>{"gen/3/gloo/rank0"});
  CHECK(f.gloo->delete_own_keys() == 0);
  CHECK_FALSE(f.memory->try_get("gen/3/gloo/rank0").has_value());
  CHECK(f.memory->try_get("gen/3/gloo/rank1") == "theirs");
}

TEST_CASE("gloo store: a wait ends with gpurun's reason once the abort key is set") {
  Fixture f(AbortKey{"gpurun/gen/3/abort", 1ms});
  f.memory->set("gpurun/gen/3/abort", "gpu 1 died (pid 42)");
  try {
    f.gloo->wait({"rank1"}, 10s);
    FAIL("the wait did not see the abort key");
  } catch (const CommError& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(gpurun::testing::contains(what, "abandoned by gpurun: gpu 1 died (pid 42)"),
                  what);
    CHECK_MESSAGE(gpurun::testing::contains(what, "gen/3/gloo"), what);
  }
}

TEST_CASE("gloo store: without the keys or an abort, get and wait end at the timeout") {
  Fixture f(AbortKey{"gpurun/gen/3/abort", 1ms});
  CHECK_THROWS_AS(f.gloo->wait({"rank1"}, 5ms), StoreTimeout);
  CHECK_THROWS_AS(f.gloo->get("rank1"), StoreTimeout);  // the store's 20 ms
}

}  // namespace
}  // namespace gpurun::rt
#endif  // GPURUN_HAVE_GLOO
