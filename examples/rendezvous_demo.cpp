// rendezvous_demo: a tiny gpurun worker that needs no LibTorch. Each rank
// connects to the supervisor's store (MASTER_ADDR:MASTER_PORT, the same
// TCPStore protocol torch uses), publishes who it is, meets the others at a
// store barrier, and rank 0 prints the table.
//
//   build/launcher/gpurun --nproc 4 --device cpu build/examples/rendezvous_demo
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpurun/error.hpp"
#include "gpurun/store/client.hpp"

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v) throw gpurun::Error(fmt::format("{} is not set: run me under gpurun", name));
  return std::stoi(v);
}

}  // namespace

int main() try {
  const int rank = env_int("RANK");
  const int world = env_int("WORLD_SIZE");
  const std::string attempt = env_or("TORCHELASTIC_RESTART_COUNT", "0");

  gpurun::store::ClientOptions opts;
  opts.host = env_or("MASTER_ADDR", "127.0.0.1");
  opts.port = static_cast<uint16_t>(env_int("MASTER_PORT"));
  opts.timeout = std::chrono::seconds(60);
  gpurun::store::Client store(opts);

  const std::string prefix = fmt::format("demo/attempt{}/", attempt);
  store.set(
      prefix + "rank/" + std::to_string(rank),
      fmt::format("pid={} local_rank={} gpu={} device={}", getpid(), env_or("LOCAL_RANK", "?"),
                  env_or("GPURUN_GPU_ID", "-"), env_or("GPURUN_DEVICE", "?")));
  // Barrier: the last rank to arrive opens the gate.
  if (store.add(prefix + "arrived", 1) == world) store.set(prefix + "gate", "open");
  store.wait({prefix + "gate"});

  if (rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) keys.push_back(prefix + "rank/" + std::to_string(r));
    const auto values = store.multi_get(keys);
    fmt::print("rendezvous of {} ranks through gpurun's store at {}:\n", world, store.peer());
    for (int r = 0; r < world; ++r) fmt::print("  rank {}: {}\n", r, values[r]);
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "rendezvous_demo: {}\n", e.what());
  return 1;
}
