// The worker engine's events and actions as JSON (docs/control-protocol.md#worker-engine): the
// C interface's wire form, and the table cases shared by the C++ and Python tests.
#include <fmt/format.h>
#include <boost/json.hpp>

#include "gpurun/json_writer.hpp"
#include "gpurun/worker/worker_engine.hpp"

namespace gpurun::control {

namespace json = boost::json;

namespace {

using A = EngineAction::Kind;
using E = EngineEvent::Kind;

constexpr std::pair<E, std::string_view> kEventNames[] = {
    {E::kOpen, "open"},
    {E::kReady, "ready"},
    {E::kBoundary, "boundary"},
    {E::kValue, "value"},
    {E::kDone, "done"},
    {E::kFailed, "failed"},
    {E::kCollectiveFailed, "collective_failed"},
    {E::kDevice, "device"},
    {E::kProgramError, "program_error"},
};

constexpr std::pair<A, std::string_view> kActionNames[] = {
    {A::kSet, "set"},
    {A::kWaitGet, "wait_get"},
    {A::kLog, "log"},
    {A::kState, "state"},
    {A::kMakeGroup, "make_group"},
    {A::kDropGroup, "drop_group"},
    {A::kBroadcastState, "broadcast_state"},
    {A::kVerifyState, "verify_state"},
    {A::kWriteSnapshot, "write_snapshot"},
    {A::kReadSnapshot, "read_snapshot"},
    {A::kRelease, "release"},
    {A::kPark, "park"},
    {A::kTrain, "train"},
    {A::kExit, "exit"},
};

std::string ints(const std::vector<int>& v) {
  return "[" + join_ids(v, ", ") + "]";
}

json::object parse(std::string_view text, std::string_view what) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec || !v.is_object())
    throw ProtocolError(fmt::format("{} is not a JSON object: '{}'", what, text));
  return std::move(v.as_object());
}

int64_t int_or(const json::object& o, std::string_view f, int64_t dflt, std::string_view text) {
  const json::value* v = o.if_contains(f);
  if (!v) return dflt;
  if (v->is_int64()) return v->as_int64();
  if (v->is_uint64()) return static_cast<int64_t>(v->as_uint64());
  throw ProtocolError(fmt::format("field '{}' is not an integer: '{}'", f, text));
}

double num_or(const json::object& o, std::string_view f, double dflt, std::string_view text) {
  const json::value* v = o.if_contains(f);
  if (!v) return dflt;
  if (v->is_double()) return v->as_double();
  if (v->is_int64()) return static_cast<double>(v->as_int64());
  if (v->is_uint64()) return static_cast<double>(v->as_uint64());
  throw ProtocolError(fmt::format("field '{}' is not a number: '{}'", f, text));
}

std::string str_or(const json::object& o, std::string_view f, std::string_view text) {
  const json::value* v = o.if_contains(f);
  if (!v) return {};
  if (!v->is_string())
    throw ProtocolError(fmt::format("field '{}' is not a string: '{}'", f, text));
  return std::string(v->as_string());
}

}  // namespace

std::string_view to_string(EngineEvent::Kind k) {
  for (const auto& [kind, name] : kEventNames)
    if (kind == k) return name;
  return "?";
}

std::string_view to_string(EngineAction::Kind k) {
  for (const auto& [kind, name] : kActionNames)
    if (kind == k) return name;
  return "?";
}

std::string to_json(const EngineEvent& e) {
  JsonObject o;
  o.add("event", to_string(e.kind));
  if (e.mono_ms != 0) o.add("mono_ms", e.mono_ms);
  if (e.unix_ms != 0) o.add("unix_ms", e.unix_ms);
  if (e.epoch >= 0) o.add("epoch", e.epoch);
  if (e.step >= 0) o.add("step", e.step);
  if (e.bytes != 0) o.add("bytes", e.bytes);
  if (!e.text.empty()) o.add("text", e.text);
  return o.str();
}

EngineEvent event_from_json(std::string_view text) {
  const json::object o = parse(text, "a worker engine event");
  EngineEvent e;
  const std::string name = str_or(o, "event", text);
  bool found = false;
  for (const auto& [kind, n] : kEventNames)
    if (n == name) e.kind = kind, found = true;
  if (!found)
    throw ProtocolError(fmt::format("unknown worker engine event '{}': '{}'", name, text));
  e.mono_ms = num_or(o, "mono_ms", 0, text);
  e.unix_ms = int_or(o, "unix_ms", 0, text);
  e.epoch = int_or(o, "epoch", -1, text);
  e.step = int_or(o, "step", -1, text);
  e.bytes = int_or(o, "bytes", 0, text);
  e.text = str_or(o, "text", text);
  return e;
}

EngineOptions options_from_json(std::string_view text) {
  const json::object o = parse(text, "worker engine options");
  EngineOptions opt;
  opt.slot = static_cast<int>(int_or(o, "slot", 0, text));
  opt.join_generation = int_or(o, "join_generation", 0, text);
  opt.warm = int_or(o, "warm", -1, text);
  if (const json::value* v = o.if_contains("standby"))
    opt.standby = v->is_bool() ? v->as_bool() : int_or(o, "standby", 0, text) != 0;
  opt.pid = static_cast<int>(int_or(o, "pid", 0, text));
  return opt;
}

std::string to_json(const EngineAction& a) {
  JsonObject o;
  o.add("action", to_string(a.kind));
  switch (a.kind) {
    case A::kSet:
      o.add("key", a.key).add("value", a.value);
      if (a.best_effort) o.add("best_effort", true);
      break;
    case A::kWaitGet:
      o.add("key", a.key);
      break;
    case A::kLog:
      o.add("text", a.text);
      break;
    case A::kState:
      o.add("from", to_string(a.from)).add("to", to_string(a.to)).add("text", a.text);
      break;
    case A::kMakeGroup:
      o.add("prefix", a.prefix)
          .add("abort_key", a.abort_key)
          .add("purpose", a.purpose)
          .add_raw("group", ints(a.group))
          .add("rank", a.rank);
      break;
    case A::kDropGroup:
      o.add("abort", a.abort);
      break;
    case A::kBroadcastState:
      o.add("root", a.root).add("receive", a.receive);
      break;
    case A::kVerifyState:
      o.add("root", a.root).add("text", a.text);
      break;
    case A::kReadSnapshot:
      o.add("epoch", a.epoch).add("step", a.step);
      break;
    case A::kRelease:
    case A::kPark:
      o.add("role", a.role);
      break;
    case A::kWriteSnapshot:
      break;
    case A::kTrain: {
      const Decision& d = a.decision;
      o.add("kind", to_string(d.kind))
          .add("generation", d.generation)
          .add("rank", a.rank)
          .add("world_size", static_cast<int64_t>(d.active.size()))
          .add_raw("active", ints(d.active))
          .add("every_steps", d.every_steps)
          .add("global_batch", d.global_batch)
          .add("checkpoint", d.checkpoint)
          .add("park_mode", to_string(d.park_mode))
          .add("jumped", a.jumped)
          .add("role", a.role);
      JsonObject env;
      for (const auto& [name, value] : a.env) env.add(name, value);
      o.add_raw("env", env.str()).add_raw("decision", d.to_json());
      break;
    }
    case A::kExit:
      o.add("text", a.text).add("left", a.left).add("stop", a.stop);
      if (!a.reason.empty()) o.add("reason", a.reason);
      break;
  }
  return o.str();
}

std::string to_json(const std::vector<EngineAction>& actions) {
  std::string out = "[";
  for (size_t i = 0; i < actions.size(); ++i) out += (i ? ", " : "") + to_json(actions[i]);
  return out + "]";
}

}  // namespace gpurun::control
