#include "gpurun/worker/energy_client.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "gpurun/control/keys.hpp"
#include "gpurun/env_names.hpp"
#include "gpurun/error.hpp"
#include "gpurun/store/client_store.hpp"
#include "gpurun/worker/worker_session.hpp"

namespace gpurun::control {

namespace json = boost::json;

namespace {

double unix_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

json::object parse_answer(const std::string& text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec || !v.is_object())
    throw ProtocolError(fmt::format("gpurun's energy answer is not a JSON object: '{}'", text));
  return std::move(v.as_object());
}

double num(const json::object& o, std::string_view field) {
  const json::value* v = o.if_contains(field);
  return v && v->is_number() ? v->to_number<double>() : 0.0;
}

std::optional<double> maybe_num(const json::object& o, std::string_view field) {
  const json::value* v = o.if_contains(field);
  return v && v->is_number() ? std::optional<double>(v->to_number<double>()) : std::nullopt;
}

std::string str(const json::object& o, std::string_view field) {
  const json::value* v = o.if_contains(field);
  return v && v->is_string() ? std::string(v->as_string()) : std::string();
}

// [{"slot": s, <field>: J}, …] -> slot -> J
std::map<int, double> per_slot(const json::object& o, std::string_view list,
                               std::string_view field) {
  std::map<int, double> out;
  if (const json::value* v = o.if_contains(list); v && v->is_array())
    for (const json::value& g : v->as_array())
      if (g.is_object())
        out[static_cast<int>(num(g.as_object(), "slot"))] = num(g.as_object(), field);
  return out;
}

}  // namespace

double EnergyMeasurement::total_energy_j() const {
  double j = 0;
  for (const auto& [slot, e] : gpu_energy_j) j += e;
  return j;
}

std::string ask_energy(store::Store& store, int slot, const EnergyQuestion& q,
                       std::chrono::milliseconds timeout) {
  static std::atomic<int64_t> next{0};  // one counter per process: every asker's keys differ
  const int64_t pid = ::getpid(), n = next++;
  store.set(keys::energy_ask(slot, pid, n), q.to_json());
  if (q.op == EnergyQuestion::Op::kBegin) return {};
  const std::string key = keys::energy_answer(slot, pid, n);
  std::string answer = store.get(key, timeout);
  store.remove(key);
  return answer;
}

std::unique_ptr<EnergyClient> EnergyClient::from_env() {
  const char* elastic = std::getenv(env::kElastic);
  if (!elastic || std::string_view(elastic) != "1") return nullptr;
  const char* slot = std::getenv(env::kSlot);
  if (!slot || !*slot)
    throw ProtocolError("GPURUN_SLOT is not set (is this worker started by gpurun --config?)");
  return std::make_unique<EnergyClient>(
      std::make_unique<store::ClientStore>(WorkerSession::store_options_from_env()),
      static_cast<int>(std::strtol(slot, nullptr, 10)));
}

EnergyClient::EnergyClient(std::unique_ptr<store::Store> store, int slot,
                           std::chrono::milliseconds timeout)
    : store_(std::move(store)), slot_(slot), timeout_(timeout) {}

std::string EnergyClient::ask(const EnergyQuestion& q) {
  try {
    return ask_energy(*store_, slot_, q, timeout_);
  } catch (const StoreTimeout& e) {
    throw StoreTimeout(fmt::format(
        "slot {}: no answer from gpurun to the energy question '{}' within {} s: {}", slot_,
        to_string(q.op), std::chrono::duration<double>(timeout_).count(), e.what()));
  }
}

std::optional<EnergyReading> EnergyClient::energy(int rank) {
  EnergyQuestion q;
  q.rank = rank;
  const json::object a = parse_answer(ask(q));
  if (a.contains("off")) return off_ = str(a, "off"), std::nullopt;
  if (a.contains("error")) throw Error(str(a, "error"));
  EnergyReading r;
  r.seconds = num(a, "seconds");
  r.epoch = static_cast<int64_t>(num(a, "epoch"));
  r.gpu_energy_j = per_slot(a, "gpus", "job_j");
  r.epoch_gpu_energy_j = per_slot(a, "gpus", "epoch_j");
  r.total_energy_j = num(a, "job_j");
  r.epoch_energy_j = num(a, "epoch_j");
  if (const json::value* v = a.if_contains("epochs"); v && v->is_array())
    for (const json::value& e : v->as_array()) {
      if (!e.is_object()) continue;
      const json::object& o = e.as_object();
      EnergyEpoch ep;
      ep.epoch = static_cast<int64_t>(num(o, "epoch"));
      ep.seconds = num(o, "seconds");
      ep.energy_j = num(o, "energy_j");
      ep.cost = num(o, "cost");
      if (const json::value* g = o.if_contains("gpu_energy_j"); g && g->is_object())
        for (const auto& kv : g->as_object())
          if (kv.value().is_number())
            ep.gpu_energy_j[std::stoi(std::string(kv.key()))] = kv.value().to_number<double>();
      r.epochs.push_back(std::move(ep));
    }
  return r;
}

void EnergyClient::begin_window(const std::string& name, int rank) {
  if (std::find(open_.begin(), open_.end(), name) != open_.end())
    throw UsageError(fmt::format("energy window '{}' is already open on slot {}", name, slot_));
  EnergyQuestion q;
  q.op = EnergyQuestion::Op::kBegin;
  q.name = name;
  q.rank = rank;
  q.t_s = unix_now_s();
  EnergyQuestion::from_json(q.to_json());  // a bad name fails here, not in gpurun
  open_.push_back(name);
  ask(q);
}

std::optional<EnergyMeasurement> EnergyClient::end_window(const std::string& name, int rank) {
  const auto it = std::find(open_.begin(), open_.end(), name);
  if (it == open_.end())
    throw UsageError(
        fmt::format("energy window '{}' is not open on slot {} (begin_window first)", name, slot_));
  open_.erase(it);
  EnergyQuestion q;
  q.op = EnergyQuestion::Op::kEnd;
  q.name = name;
  q.rank = rank;
  q.t_s = unix_now_s();
  const json::object a = parse_answer(ask(q));
  if (a.contains("off")) return off_ = str(a, "off"), std::nullopt;
  if (a.contains("error")) throw Error(str(a, "error"));
  return EnergyMeasurement{name, num(a, "seconds"), per_slot(a, "gpus", "energy_j")};
}

std::optional<StopDetail> EnergyClient::stop_detail() {
  EnergyQuestion q;
  q.op = EnergyQuestion::Op::kStop;
  const json::object a = parse_answer(ask(q));
  if (str(a, "reason").empty()) return std::nullopt;
  return StopDetail{str(a, "reason"),
                    str(a, "text"),
                    str(a, "cause"),
                    str(a, "signal"),
                    maybe_num(a, "predicted_cost_j"),
                    maybe_num(a, "cost_so_far_j"),
                    maybe_num(a, "threshold_j")};
}

}  // namespace gpurun::control
