// RuntimeEnv::from_env(): the worker environment, parsed in one place.
#include "runtime/runtime_env.hpp"

#include <unistd.h>

#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

#include "gpurun/error.hpp"

namespace gpurun::rt {

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

int64_t env_int(const char* name, int64_t fallback) {
  const auto v = env(name);
  if (!v) return fallback;
  try {
    size_t used = 0;
    const long long x = std::stoll(*v, &used);
    if (used == v->size()) return x;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("environment variable {}={:?} is not an integer", name, *v));
}

}  // namespace

RuntimeEnv RuntimeEnv::from_env() {
  RuntimeEnv e;
  if (env("GPURUN_COMM_TIMEOUT_MS"))
    e.comm_timeout = std::chrono::milliseconds(env_int("GPURUN_COMM_TIMEOUT_MS", 0));
  const std::string dev = env("GPURUN_DEVICE").value_or("cpu");
  if (dev != "cpu" && dev != "cuda")
    throw Error(fmt::format("environment variable GPURUN_DEVICE={:?}: expected cpu or cuda", dev));
  e.cuda = dev == "cuda";
  e.slot = static_cast<int>(env_int("GPURUN_SLOT", env_int("LOCAL_RANK", 0)));
  e.store.host = env("GPURUN_STORE_ADDR").value_or(env("MASTER_ADDR").value_or("127.0.0.1"));
  e.store.port = static_cast<uint16_t>(env_int("GPURUN_STORE_PORT", env_int("MASTER_PORT", 29500)));
  e.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  e.rank = static_cast<int>(env_int("RANK", 0));
  e.world = static_cast<int>(env_int("WORLD_SIZE", 1));
  if (auto p = env("GPURUN_SNAPSHOT_PATH")) {
    e.snapshot_path = *p;
  } else if (auto d = env("GPURUN_RUN_DIR")) {
    e.snapshot_path = *d + "/state.snapshot";
  } else {
    e.snapshot_path = fmt::format("/tmp/gpurun-state-{}.snapshot", ::getpid());
  }
  e.prepare_snapshot = env("GPURUN_SNAPSHOT_PREPARE").value_or("0") == "1";
  e.trace_dir = env("GPURUN_TRACE_DIR").value_or("");
  return e;
}

}  // namespace gpurun::rt
