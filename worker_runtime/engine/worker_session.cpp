#include "gpurun/worker/worker_session.hpp"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "gpurun/env_names.hpp"
#include "gpurun/store/client_store.hpp"
#include "gpurun/worker/energy_client.hpp"

namespace gpurun::control {

namespace {

std::string env_or_throw(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v)
    throw ProtocolError(fmt::format(
        "environment variable {} is not set (is this worker started by gpurun --config?)", name));
  return v;
}

int64_t env_int(const char* name) {
  const std::string v = env_or_throw(name);
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc{} || p != v.data() + v.size() || out < 0)
    throw ProtocolError(
        fmt::format("environment variable {}='{}' is not a non-negative integer", name, v));
  return out;
}

}  // namespace

double WorkerSession::mono_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

store::ClientOptions WorkerSession::store_options_from_env() {
  store::ClientOptions o;
  o.host = env_or_throw(env::kStoreAddr);
  o.port = static_cast<uint16_t>(env_int(env::kStorePort));
  return o;
}

std::unique_ptr<WorkerSession> WorkerSession::from_env(SessionOptions o) {
  const char* elastic = std::getenv(env::kElastic);
  if (!elastic || std::string_view(elastic) != "1") return nullptr;
  o.engine.slot = static_cast<int>(env_int(env::kSlot));
  if (const char* w = std::getenv(env::kWarm); w && *w) {
    o.engine.warm = env_int(env::kWarm);
    const char* sb = std::getenv(env::kStandby);
    o.engine.standby = sb && std::string_view(sb) == "1";
  } else
    o.engine.join_generation = env_int(env::kJoinGeneration);
  o.engine.pid = static_cast<int>(::getpid());
  if (const char* r = std::getenv("TORCHELASTIC_RESTART_COUNT"); r && *r)
    o.restart_count = std::strtoll(r, nullptr, 10);
  if (const char* p = std::getenv(env::kPreemptDir); p && *p) o.preempt_dir = p;
  auto session = std::make_unique<WorkerSession>(
      std::move(o), std::make_unique<store::ClientStore>(store_options_from_env()));
  // keys::sever: a lost node's connections shut down off the main thread (a cut link). Its own
  // connection, with a short request timeout: a cut-off node's watch gives up quietly.
  try {
    store::ClientOptions so = store_options_from_env();
    so.timeout = std::chrono::seconds(5);
    SeverWatchOptions wo;
    WorkerSession* s = session.get();
    wo.generation = [s] { return s->generation_.load(); };
    wo.log = s->opt_.log;
    wo.store_host = so.host;
    s->sever_ =
        std::make_unique<SeverWatch>(std::make_unique<store::ClientStore>(so), std::move(wo));
  } catch (const Error& e) {
    session->opt_.log(fmt::format("warning: no watch for severed addresses: {}", e.what()));
  }
  return session;
}

WorkerSession::WorkerSession(SessionOptions options, std::unique_ptr<store::Store> store)
    : opt_(std::move(options)), store_(std::move(store)), engine_(opt_.engine) {
  if (!opt_.log) {
    const int slot = opt_.engine.slot;
    opt_.log = [slot](const std::string& line) {
      std::fprintf(stderr, "gpurun worker (slot %d): %s\n", slot, line.c_str());
      std::fflush(stderr);
    };
  }
}

std::vector<EngineAction> WorkerSession::on(EngineEvent e) {
  std::vector<EngineAction> out;
  while (true) {
    if (e.mono_ms == 0) e.mono_ms = mono_ms();
    if (e.unix_ms == 0)
      e.unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
    std::vector<EngineAction> actions = engine_.on(e);
    generation_ = engine_.has_generation() ? engine_.generation() : -1;
    std::optional<EngineEvent> next;
    for (EngineAction& a : actions) {
      switch (a.kind) {
        case EngineAction::Kind::kSet:
          if (a.best_effort) {
            try {
              store_->set(a.key, a.value);
            } catch (const Error&) {  // only this value is lost; the next step reports a
            }                         // broken store
          } else {
            store_->set(a.key, a.value);
          }
          break;
        case EngineAction::Kind::kWaitGet: {
          EngineEvent v;
          v.kind = EngineEvent::Kind::kValue;
          v.text = store_->get(a.key, store::Store::kNoTimeout);
          if (opt_.on_value) opt_.on_value(a.key, v.text);
          next = std::move(v);
          break;
        }
        case EngineAction::Kind::kLog:
          opt_.log(a.text);
          out.push_back(std::move(a));
          break;
        case EngineAction::Kind::kExit:
          // gpurun writes its stop file before it asks for the exit (docs/cli.md#preemption).
          if (!a.left && !opt_.preempt_dir.empty())
            a.stop = ::access((opt_.preempt_dir + "/stop").c_str(), F_OK) == 0;
          out.push_back(std::move(a));
          break;
        default:
          out.push_back(std::move(a));
      }
    }
    if (!next) return out;
    e = std::move(*next);
  }
}

void WorkerSession::wait_arrivals(const std::string& prefix, int rank, int size,
                                  const std::string& abort_key, std::chrono::milliseconds timeout) {
  store_->set(keys::arrived(prefix, rank), std::to_string(opt_.engine.pid));
  std::vector<int> waiting;
  for (int r = 0; r < size; ++r)
    if (r != rank) waiting.push_back(r);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!waiting.empty()) {
    if (!abort_key.empty())
      if (std::optional<std::string> why = store_->try_get(abort_key))
        throw CommAbandoned(fmt::format("abandoned by gpurun: {}", *why));
    std::erase_if(waiting,
                  [&](int r) { return store_->try_get(keys::arrived(prefix, r)).has_value(); });
    if (waiting.empty()) break;
    if (std::chrono::steady_clock::now() > deadline)
      throw ProtocolError(fmt::format("Timed out: {} of {} ranks of {} did not arrive in {} s",
                                      waiting.size(), size, prefix, timeout.count() / 1000.0));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void WorkerSession::put_slot_data(const std::string& name, const std::string& bytes) {
  store_->set(keys::slot_data(opt_.restart_count, opt_.engine.slot, name), bytes);
}

std::optional<std::string> WorkerSession::get_slot_data(const std::string& name) {
  return store_->try_get(keys::slot_data(opt_.restart_count, opt_.engine.slot, name));
}

std::string WorkerSession::energy_ask(const EnergyQuestion& q, std::chrono::milliseconds timeout) {
  return ask_energy(*store_, opt_.engine.slot, q, timeout);
}

}  // namespace gpurun::control
