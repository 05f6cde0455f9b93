#include "gpurun/control/node_messages.hpp"

#include <fmt/format.h>
#include <boost/json.hpp>

namespace gpurun::control {

namespace json = boost::json;

namespace {

json::object node_object(std::string_view text, std::string_view what) {
  boost::system::error_code ec;
  json::value root = json::parse(text, ec);
  if (ec || !root.is_object())
    throw ProtocolError(fmt::format("{} is not a JSON object: '{}'", what, text));
  const json::object& o = root.as_object();
  const json::value* v = o.if_contains("v");
  if (!v || !v->is_int64() || v->as_int64() != 1)
    throw ProtocolError(fmt::format("{} is not version 1 (\"v\":1): '{}'", what, text));
  return o;
}

int64_t int_field(const json::object& o, std::string_view field, std::string_view what,
                  std::string_view text, std::optional<int64_t> fallback = std::nullopt) {
  const json::value* v = o.if_contains(field);
  if (!v && fallback) return *fallback;
  if (!v || !v->is_int64())
    throw ProtocolError(fmt::format("{} lacks the integer field '{}': '{}'", what, field, text));
  return v->as_int64();
}

std::string string_field(const json::object& o, std::string_view field, std::string_view what,
                         std::string_view text, bool optional = false) {
  const json::value* v = o.if_contains(field);
  if (!v && optional) return {};
  if (!v || !v->is_string())
    throw ProtocolError(fmt::format("{} lacks the string field '{}': '{}'", what, field, text));
  return std::string(v->as_string());
}

std::vector<int> ids_field(const json::object& o, std::string_view field, std::string_view what,
                           std::string_view text) {
  const json::value* v = o.if_contains(field);
  if (!v || !v->is_array())
    throw ProtocolError(fmt::format("{} lacks the array field '{}': '{}'", what, field, text));
  std::vector<int> out;
  for (const auto& e : v->as_array()) {
    if (!e.is_int64() || e.as_int64() < 0)
      throw ProtocolError(fmt::format("{} field '{}' holds a non-id: '{}'", what, field, text));
    out.push_back(static_cast<int>(e.as_int64()));
  }
  return out;
}

json::array ids_array(const std::vector<int>& ids) {
  json::array a;
  for (int id : ids) a.emplace_back(id);
  return a;
}

std::string_view event_name(NodeEvent::Kind k) {
  switch (k) {
    case NodeEvent::Kind::kSpawned:
      return "spawned";
    case NodeEvent::Kind::kExited:
      return "exited";
    case NodeEvent::Kind::kSnapshotFetched:
      return "snapshot_fetched";
  }
  return "?";
}

std::string_view command_name(NodeCommand::Kind k) {
  switch (k) {
    case NodeCommand::Kind::kSpawn:
      return "spawn";
    case NodeCommand::Kind::kKill:
      return "kill";
    case NodeCommand::Kind::kRelease:
      return "release";
    case NodeCommand::Kind::kExit:
      return "exit";
    case NodeCommand::Kind::kFetchSnapshot:
      return "fetch_snapshot";
  }
  return "?";
}

}  // namespace

std::string slot_name(int slot) {
  if (slot_node(slot) == 0) return fmt::format("gpu {}", slot);
  return fmt::format("node {} gpu {}", slot_node(slot), slot_local(slot));
}

std::string NodeJoin::to_json() const {
  json::object o;
  o["v"] = 1;
  o["node"] = node;
  o["host"] = host;
  o["pid"] = pid;
  o["slots"] = ids_array(slots);
  o["offer"] = ids_array(offer);
  o["run_id"] = run_id;
  o["device"] = device;
  if (!snapshot_endpoint.empty()) o["snapshot_endpoint"] = snapshot_endpoint;
  if (monotonic_ms > 0) o["monotonic_ms"] = monotonic_ms;
  return json::serialize(o);
}

NodeJoin NodeJoin::from_json(std::string_view text) {
  constexpr std::string_view what = "a node's join record";
  const json::object o = node_object(text, what);
  NodeJoin j;
  j.node = static_cast<int>(int_field(o, "node", what, text));
  j.host = string_field(o, "host", what, text);
  j.pid = static_cast<int>(int_field(o, "pid", what, text));
  j.slots = ids_field(o, "slots", what, text);
  j.offer = ids_field(o, "offer", what, text);
  j.run_id = string_field(o, "run_id", what, text, /*optional=*/true);
  j.device = string_field(o, "device", what, text, /*optional=*/true);
  j.snapshot_endpoint = string_field(o, "snapshot_endpoint", what, text, /*optional=*/true);
  if (const json::value* m = o.if_contains("monotonic_ms"); m && m->is_number())
    j.monotonic_ms = m->to_number<double>();
  if (j.node < 1)
    throw ProtocolError(fmt::format("{} names node {} (ids start at 1): '{}'", what, j.node, text));
  for (int s : j.slots)
    if (s >= kSlotsPerNode)
      throw ProtocolError(fmt::format("{} names local slot {} (at most {} per node): '{}'", what, s,
                                      kSlotsPerNode, text));
  return j;
}

std::string NodeEvent::to_json() const {
  json::object o;
  o["v"] = 1;
  o["kind"] = event_name(kind);
  o["slot"] = slot;
  o["pid"] = pid;
  if (kind == Kind::kExited) {
    o["code"] = code;
    o["signal"] = signal;
    o["how"] = how;
  }
  if (kind == Kind::kSnapshotFetched) {
    o["how"] = how;
    o["serial"] = serial;
    o["bytes"] = bytes;
    o["ms"] = ms;
  }
  return json::serialize(o);
}

NodeEvent NodeEvent::from_json(std::string_view text) {
  constexpr std::string_view what = "a node's event";
  const json::object o = node_object(text, what);
  NodeEvent e;
  const std::string kind = string_field(o, "kind", what, text);
  if (kind == "spawned")
    e.kind = Kind::kSpawned;
  else if (kind == "exited")
    e.kind = Kind::kExited;
  else if (kind == "snapshot_fetched")
    e.kind = Kind::kSnapshotFetched;
  else
    throw ProtocolError(fmt::format("{} has the unknown kind '{}': '{}'", what, kind, text));
  e.slot = static_cast<int>(int_field(o, "slot", what, text));
  e.pid = static_cast<int>(int_field(o, "pid", what, text));
  if (e.kind == Kind::kExited) {
    e.code = static_cast<int>(int_field(o, "code", what, text));
    e.signal = static_cast<int>(int_field(o, "signal", what, text));
    e.how = string_field(o, "how", what, text);
  }
  if (e.kind == Kind::kSnapshotFetched) {
    e.how = string_field(o, "how", what, text);
    e.serial = int_field(o, "serial", what, text);
    e.bytes = int_field(o, "bytes", what, text);
    e.ms = int_field(o, "ms", what, text);
  }
  return e;
}

std::string NodeCommand::to_json() const {
  json::object o;
  o["v"] = 1;
  o["kind"] = command_name(kind);
  switch (kind) {
    case Kind::kSpawn:
      o["slot"] = slot;
      o["generation"] = generation;
      o["warm"] = warm;
      o["standby"] = standby;
      // The decision's own canonical JSON, carried as text: decoded by Decision::from_json.
      o["decision"] = decision ? decision->to_json() : std::string();
      break;
    case Kind::kKill:
      o["slot"] = slot;
      break;
    case Kind::kRelease:
      o["reason"] = reason;
      break;
    case Kind::kExit:
      o["code"] = code;
      o["reason"] = reason;
      break;
    case Kind::kFetchSnapshot:
      o["endpoint"] = endpoint;
      o["serial"] = serial;
      break;
  }
  return json::serialize(o);
}

NodeCommand NodeCommand::from_json(std::string_view text) {
  constexpr std::string_view what = "node 0's command";
  const json::object o = node_object(text, what);
  NodeCommand c;
  const std::string kind = string_field(o, "kind", what, text);
  if (kind == "spawn") {
    c.kind = Kind::kSpawn;
    c.slot = static_cast<int>(int_field(o, "slot", what, text));
    c.generation = int_field(o, "generation", what, text);
    c.warm = int_field(o, "warm", what, text);
    const json::value* sb = o.if_contains("standby");
    c.standby = sb && sb->is_bool() && sb->as_bool();
    c.decision = Decision::from_json(string_field(o, "decision", what, text));
  } else if (kind == "kill") {
    c.kind = Kind::kKill;
    c.slot = static_cast<int>(int_field(o, "slot", what, text));
  } else if (kind == "release") {
    c.kind = Kind::kRelease;
    c.reason = string_field(o, "reason", what, text, /*optional=*/true);
  } else if (kind == "exit") {
    c.kind = Kind::kExit;
    c.code = static_cast<int>(int_field(o, "code", what, text));
    c.reason = string_field(o, "reason", what, text, /*optional=*/true);
  } else if (kind == "fetch_snapshot") {
    c.kind = Kind::kFetchSnapshot;
    c.endpoint = string_field(o, "endpoint", what, text);
    c.serial = int_field(o, "serial", what, text);
  } else {
    throw ProtocolError(fmt::format("{} has the unknown kind '{}': '{}'", what, kind, text));
  }
  return c;
}

}  // namespace gpurun::control
