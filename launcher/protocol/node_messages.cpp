#include "gpurun/control/node_messages.hpp"

#include <fmt/format.h>
#include <boost/json.hpp>

#include "json_fields.hpp"

namespace gpurun::control {

namespace json = boost::json;

namespace {

// A node message: a JSON object of version 1 ("v":1).
json::object node_object(std::string_view text, std::string_view what) {
  const json::object o = detail::parse_object(text, what).as_object();
  const json::value* v = o.if_contains("v");
  if (!v || !v->is_int64() || v->as_int64() != 1)
    throw ProtocolError(fmt::format("{} is not version 1 (\"v\":1): '{}'", what, text));
  return o;
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
    case NodeCommand::Kind::kGeneration:
      return "generation";
    case NodeCommand::Kind::kGivenUp:
      return "given_up";
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
  if (!address.empty()) o["address"] = address;
  if (monotonic_ms > 0) o["monotonic_ms"] = monotonic_ms;
  return json::serialize(o);
}

NodeJoin NodeJoin::from_json(std::string_view text) {
  constexpr std::string_view what = "a node's join record";
  const json::object o = node_object(text, what);
  NodeJoin j;
  j.node = static_cast<int>(detail::get_int(o, "node", what, text));
  j.host = detail::get_string(o, "host", what, text);
  j.pid = static_cast<int>(detail::get_int(o, "pid", what, text));
  j.slots = detail::get_ids(o, "slots", what, text);
  j.offer = detail::get_ids(o, "offer", what, text);
  j.run_id = detail::get_optional_string(o, "run_id", what, text);
  j.device = detail::get_optional_string(o, "device", what, text);
  j.snapshot_endpoint = detail::get_optional_string(o, "snapshot_endpoint", what, text);
  j.address = detail::get_optional_string(o, "address", what, text);
  if (const json::value* m = o.if_contains("monotonic_ms"); m && m->is_number())
    j.monotonic_ms = m->to_number<double>();
  if (j.node < 1)
    throw ProtocolError(fmt::format("{} names node {} (ids start at 1): '{}'", what, j.node, text));
  for (const std::vector<int>* ids : {&j.slots, &j.offer})
    for (int s : *ids)
      if (s < 0 || s >= kSlotsPerNode)
        throw ProtocolError(fmt::format("{} names local slot {} (local slots are 0 to {}): '{}'",
                                        what, s, kSlotsPerNode - 1, text));
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
  const std::string kind = detail::get_string(o, "kind", what, text);
  if (kind == "spawned")
    e.kind = Kind::kSpawned;
  else if (kind == "exited")
    e.kind = Kind::kExited;
  else if (kind == "snapshot_fetched")
    e.kind = Kind::kSnapshotFetched;
  else
    throw ProtocolError(fmt::format("{} has the unknown kind '{}': '{}'", what, kind, text));
  e.slot = static_cast<int>(detail::get_int(o, "slot", what, text));
  e.pid = static_cast<int>(detail::get_int(o, "pid", what, text));
  if (e.kind == Kind::kExited) {
    e.code = static_cast<int>(detail::get_int(o, "code", what, text));
    e.signal = static_cast<int>(detail::get_int(o, "signal", what, text));
    e.how = detail::get_string(o, "how", what, text);
  }
  if (e.kind == Kind::kSnapshotFetched) {
    e.how = detail::get_string(o, "how", what, text);
    e.serial = detail::get_int(o, "serial", what, text);
    e.bytes = detail::get_int(o, "bytes", what, text);
    e.ms = detail::get_int(o, "ms", what, text);
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
    case Kind::kGivenUp:
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
    case Kind::kGeneration:
      o["generation"] = generation;
      o["decision"] = decision ? decision->to_json() : std::string();
      break;
  }
  return json::serialize(o);
}

NodeCommand NodeCommand::from_json(std::string_view text) {
  constexpr std::string_view what = "node 0's command";
  const json::object o = node_object(text, what);
  NodeCommand c;
  const std::string kind = detail::get_string(o, "kind", what, text);
  if (kind == "spawn") {
    c.kind = Kind::kSpawn;
    c.slot = static_cast<int>(detail::get_int(o, "slot", what, text));
    c.generation = detail::get_int(o, "generation", what, text);
    c.warm = detail::get_int(o, "warm", what, text);
    const json::value* sb = o.if_contains("standby");
    c.standby = sb && sb->is_bool() && sb->as_bool();
    c.decision = Decision::from_json(detail::get_string(o, "decision", what, text));
  } else if (kind == "kill") {
    c.kind = Kind::kKill;
    c.slot = static_cast<int>(detail::get_int(o, "slot", what, text));
  } else if (kind == "release") {
    c.kind = Kind::kRelease;
    c.reason = detail::get_optional_string(o, "reason", what, text);
  } else if (kind == "given_up") {
    c.kind = Kind::kGivenUp;
    c.reason = detail::get_optional_string(o, "reason", what, text);
  } else if (kind == "exit") {
    c.kind = Kind::kExit;
    c.code = static_cast<int>(detail::get_int(o, "code", what, text));
    c.reason = detail::get_optional_string(o, "reason", what, text);
  } else if (kind == "fetch_snapshot") {
    c.kind = Kind::kFetchSnapshot;
    c.endpoint = detail::get_string(o, "endpoint", what, text);
    c.serial = detail::get_int(o, "serial", what, text);
  } else if (kind == "generation") {
    c.kind = Kind::kGeneration;
    c.generation = detail::get_int(o, "generation", what, text);
    c.decision = Decision::from_json(detail::get_string(o, "decision", what, text));
  } else {
    throw ProtocolError(fmt::format("{} has the unknown kind '{}': '{}'", what, kind, text));
  }
  return c;
}

}  // namespace gpurun::control
