// RuntimeEnv::from_env(): the worker environment, parsed in one place.
#include "runtime/runtime_env.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "gpurun/env_names.hpp"
#include "gpurun/error.hpp"

namespace gpurun::rt {

namespace {

std::optional<std::string> getenv_nonempty(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

int64_t env_int(const char* name, int64_t fallback) {
  const auto v = getenv_nonempty(name);
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

void export_env(const std::vector<std::pair<std::string, std::string>>& vars) {
  for (const auto& [name, value] : vars) {
    const char* now = std::getenv(name.c_str());
    if (now && value == now) continue;
    if (::setenv(name.c_str(), value.c_str(), /*overwrite=*/1) != 0)
      throw Error(fmt::format("cannot set environment variable {}={}: {}", name, value,
                              std::strerror(errno)));
  }
}

RuntimeEnv RuntimeEnv::from_env() {
  RuntimeEnv e;
  if (getenv_nonempty(env::kCommTimeoutMs))
    e.comm_timeout = std::chrono::milliseconds(env_int(env::kCommTimeoutMs, 0));
  const std::string dev = getenv_nonempty(env::kDevice).value_or("cpu");
  if (dev != "cpu" && dev != "cuda")
    throw Error(
        fmt::format("environment variable {}={:?}: expected cpu or cuda", env::kDevice, dev));
  e.cuda = dev == "cuda";
  e.slot = static_cast<int>(env_int(env::kSlot, env_int("LOCAL_RANK", 0)));
  e.local_slot = static_cast<int>(env_int(env::kLocalSlot, e.slot));
  if (e.local_slot < 0)
    throw Error(fmt::format("environment variable {}={} is not a slot on this node (0 or more)",
                            getenv_nonempty(env::kLocalSlot) ? env::kLocalSlot : env::kSlot,
                            e.local_slot));
  e.store.host = getenv_nonempty(env::kStoreAddr)
                     .value_or(getenv_nonempty("MASTER_ADDR").value_or("127.0.0.1"));
  const int64_t port = env_int(env::kStorePort, env_int("MASTER_PORT", 29500));
  if (port < 1 || port > 65535)
    throw Error(fmt::format("store port {} (from {} or MASTER_PORT) is not in 1..65535", port,
                            env::kStorePort));
  e.store.port = static_cast<uint16_t>(port);
  e.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  e.rank = static_cast<int>(env_int("RANK", 0));
  e.world = static_cast<int>(env_int("WORLD_SIZE", 1));
  if (auto p = getenv_nonempty(env::kSnapshotPath)) {
    e.snapshot_path = *p;
  } else if (auto d = getenv_nonempty(env::kRunDir)) {
    e.snapshot_path = *d + "/state.snapshot";
  } else {
    e.snapshot_path = fmt::format("/tmp/gpurun-state-{}.snapshot", ::getpid());
  }
  e.snapshot_fallback_path = getenv_nonempty(env::kSnapshotFallbackPath).value_or("");
  {  // default on; "0" turns the background preparation off (docs/worker-runtime.md)
    const std::string v = getenv_nonempty(env::kSnapshotPrepare).value_or("1");
    if (v != "0" && v != "1")
      throw Error(
          fmt::format("environment variable {}='{}' must be 0 or 1", env::kSnapshotPrepare, v));
    e.prepare_snapshot = v == "1";
  }
  {  // default on; "0": no reservation ahead of a resume's first step
    const std::string v = getenv_nonempty(env::kReserveAhead).value_or("1");
    if (v != "0" && v != "1")
      throw Error(
          fmt::format("environment variable {}='{}' must be 0 or 1", env::kReserveAhead, v));
    e.reserve_ahead = v == "1";
  }
  e.trace_dir = getenv_nonempty(env::kTraceDir).value_or("");
  e.preempt_dir = getenv_nonempty(env::kPreemptDir).value_or("");
  e.preempt_signal = static_cast<int>(env_int(env::kPreemptSignal, 0));
  if (e.preempt_signal < 0 || e.preempt_signal > 64)
    throw Error(fmt::format("environment variable {}={} is not a signal number",
                            env::kPreemptSignal, e.preempt_signal));
  return e;
}

}  // namespace gpurun::rt
