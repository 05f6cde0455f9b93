#include "gpurun/control/worker_control.hpp"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdlib>

#include <fmt/format.h>

#include "gpurun/check.hpp"
#include "gpurun/env_names.hpp"

namespace gpurun::control {

namespace {

std::string env_or_throw(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v)
    throw ProtocolError(
        fmt::format("environment variable {} is not set (is this worker "
                    "started by gpurun --config?)",
                    name));
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

std::unique_ptr<WorkerControl> WorkerControl::from_env() {
  const char* elastic = std::getenv(env::kElastic);
  if (!elastic || std::string_view(elastic) != "1") return nullptr;
  WorkerControlOptions o;
  o.store.host = env_or_throw(env::kStoreAddr);
  o.store.port = static_cast<uint16_t>(env_int(env::kStorePort));
  o.gpu = static_cast<int>(env_int(env::kSlot));
  if (const char* w = std::getenv(env::kWarm); w && *w)
    o.warm = env_int(env::kWarm);
  else
    o.join_generation = env_int(env::kJoinGeneration);
  return std::make_unique<WorkerControl>(std::move(o));
}

WorkerControl::WorkerControl(WorkerControlOptions options)
    : opt_(std::move(options)),
      client_(std::make_unique<store::Client>(opt_.store)),
      generation_(opt_.warm >= 0 ? -1 : opt_.join_generation) {}

std::string WorkerControl::wait_get(const std::string& key) {
  while (true) {
    try {
      client_->wait({key}, opt_.wait_chunk);
      break;
    } catch (const StoreTimeout&) {
      // Keep waiting: the supervisor decides when a boundary is overdue.
    }
  }
  return client_->get(key);
}

void WorkerControl::joined() {
  const int r = current_.rank_of(opt_.gpu);
  if (r < 0)
    throw ProtocolError(fmt::format("slot {} is not a member of generation {} (active [{}])",
                                    opt_.gpu, generation_, join_ids(current_.active)));
  client_->set(keys::joined(generation_, r), std::to_string(::getpid()));
}

const Decision& WorkerControl::join() {
  current_json_ = wait_get(keys::start(generation_));
  current_ = Decision::from_json(current_json_);
  round_ = 0;
  joined();
  return current_;
}

Decision WorkerControl::report_and_wait(int64_t epoch, int64_t step, bool has_state,
                                        std::string snapshot) {
  Report r;
  r.rank = rank();
  r.gpu = opt_.gpu;
  r.generation = generation_;
  r.round = round_;
  r.epoch = epoch;
  r.step = step;
  r.pid = static_cast<int>(::getpid());
  r.time_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count();
  r.has_state = has_state;
  r.snapshot = std::move(snapshot);
  if (r.rank < 0)
    throw ProtocolError(
        fmt::format("slot {} reports at a boundary but is not a member of "
                    "generation {}",
                    opt_.gpu, generation_));
  client_->set(keys::report(generation_, round_, r.rank), r.to_json());
  current_json_ = wait_get(keys::decision(generation_, round_));
  Decision d = Decision::from_json(current_json_);
  current_ = d;
  if (d.kind == Decision::Kind::kContinue || d.kind == Decision::Kind::kSnapshot) {
    ++round_;
  } else if (d.kind == Decision::Kind::kExit) {
    // The job is finishing: nothing follows this decision.
  } else {
    if (d.is_leaver(opt_.gpu)) park_generation_ = d.generation;
    generation_ = d.generation;
    round_ = 0;
  }
  return d;
}

std::optional<Decision> WorkerControl::wait_admission() {
  GPURUN_CHECK(opt_.warm >= 0, "slot {} waits for an admission but is not a warm joiner", opt_.gpu);
  client_->set(keys::ready(opt_.gpu, opt_.warm), std::to_string(::getpid()));
  return take_join_decision(wait_get(keys::admit(opt_.gpu, opt_.warm)));
}

std::optional<Decision> WorkerControl::take_join_decision(const std::string& json) {
  Decision d = Decision::from_json(json);
  if (d.kind == Decision::Kind::kExit) return std::nullopt;
  current_json_ = json;
  current_ = d;
  generation_ = d.generation;
  round_ = 0;
  joined();
  return d;
}

void WorkerControl::publish_timing(int64_t generation, const std::string& json) {
  client_->set(keys::timing(generation, opt_.gpu), json);
}

std::optional<Decision> WorkerControl::park_and_wait() {
  GPURUN_CHECK(park_generation_ >= 0, "slot {} parks without having left", opt_.gpu);
  client_->set(keys::parked(opt_.gpu, park_generation_), std::to_string(::getpid()));
  const std::string json = wait_get(keys::wake(opt_.gpu, park_generation_));
  park_generation_ = -1;
  return take_join_decision(json);
}

}  // namespace gpurun::control
