#include "gpurun/control/decision.hpp"

#include <algorithm>
#include <charconv>
#include <limits>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "gpurun/check.hpp"
#include "gpurun/control/node_messages.hpp"
#include "json_fields.hpp"

namespace gpurun::control {

namespace json = boost::json;

using detail::get_ids;
using detail::get_int;
using detail::get_string;
using detail::parse_object;

std::string_view to_string(Decision::Kind kind) {
  switch (kind) {
    case Decision::Kind::kStart:
      return "start";
    case Decision::Kind::kContinue:
      return "continue";
    case Decision::Kind::kResize:
      return "resize";
    case Decision::Kind::kExit:
      return "exit";
    case Decision::Kind::kSnapshot:
      return "snapshot";
  }
  return "unknown";
}

int Decision::rank_of(int gpu) const {
  auto it = std::lower_bound(active.begin(), active.end(), gpu);
  if (it == active.end() || *it != gpu) return -1;
  return static_cast<int>(it - active.begin());
}

bool Decision::is_leaver(int gpu) const {
  return has_id(leavers, gpu);
}

StateSource StateSource::peer(int rank, int gpu) {
  GPURUN_CHECK(rank >= 0 && gpu >= 0, "a peer state source needs a rank and a gpu: rank {} gpu {}",
               rank, gpu);
  return {Kind::kPeer, rank, gpu};
}

int StateSource::wire_code() const {
  switch (kind) {
    case Kind::kPeer:
      return rank;
    case Kind::kSnapshot:
      return -1;
    case Kind::kNone:
      break;
  }
  return -2;
}

StateSource StateSource::from_wire(int64_t code, int64_t gpu, std::string_view what) {
  if (code == -2) return none();
  if (code == -1) return snapshot();
  if (code < -2 || code > std::numeric_limits<int>::max())
    throw ProtocolError(
        fmt::format("{} has state_source {}: expected a rank >= 0, -1 or -2", what, code));
  if (gpu < 0 || gpu > std::numeric_limits<int>::max())
    throw ProtocolError(
        fmt::format("{} has state_source {} (a rank) but state_source_gpu {}: expected a slot >= 0",
                    what, code, gpu));
  return {StateSource::Kind::kPeer, static_cast<int>(code), static_cast<int>(gpu)};
}

std::string describe(const StateSource& s) {
  if (s.is_peer()) return fmt::format("gpu {}", s.gpu);
  if (s.is_snapshot()) return "the pause snapshot";
  return "a fresh start";
}

std::string Decision::to_json() const {
  if (kind == Kind::kExit)
    return fmt::format(
        R"({{"v":1,"kind":"exit","generation":{}{}}})", generation,
        reason.empty() ? std::string() : ",\"reason\":" + json::serialize(json::string(reason)));
  return fmt::format(
      R"({{"v":1,"kind":"{}","generation":{},"prev_generation":{},"round":{},"epoch":{},"step":{},)"
      R"("active":{},"joiners":{},"leavers":{},"failed":{},"state_source":{},"state_source_gpu":{},)"
      R"("park_mode":"{}","every_steps":{},"global_batch":{}{}{}}})",
      to_string(kind), generation, prev_generation, round, epoch, step, ids_json(active),
      ids_json(joiners), ids_json(leavers), ids_json(failed), state_source.wire_code(),
      state_source.gpu, to_string(park_mode), every_steps, global_batch,
      checkpoint ? R"(,"checkpoint":true)" : "",
      behind.empty() ? std::string() : ",\"behind\":" + ids_json(behind));
}

Decision Decision::from_json(std::string_view text) {
  constexpr std::string_view what = "decision";
  const json::value root = parse_object(text, what);
  const json::object& o = root.as_object();
  Decision d;
  const std::string kind = get_string(o, "kind", what, text);
  if (kind == "start")
    d.kind = Kind::kStart;
  else if (kind == "continue")
    d.kind = Kind::kContinue;
  else if (kind == "resize")
    d.kind = Kind::kResize;
  else if (kind == "exit")
    d.kind = Kind::kExit;
  else if (kind == "snapshot")
    d.kind = Kind::kSnapshot;
  else
    throw ProtocolError(fmt::format("decision has an unknown kind '{}': '{}'", kind, text));
  d.generation = get_int(o, "generation", what, text);
  if (d.kind == Kind::kExit) {
    if (o.contains("reason")) d.reason = get_string(o, "reason", what, text);  // absent: unknown
    return d;
  }
  d.prev_generation = get_int(o, "prev_generation", what, text);
  d.round = get_int(o, "round", what, text);
  d.epoch = get_int(o, "epoch", what, text);
  d.step = get_int(o, "step", what, text);
  d.active = get_ids(o, "active", what, text);
  d.joiners = get_ids(o, "joiners", what, text);
  d.leavers = get_ids(o, "leavers", what, text);
  d.failed = get_ids(o, "failed", what, text);
  d.state_source = StateSource::from_wire(get_int(o, "state_source", what, text),
                                          get_int(o, "state_source_gpu", what, text),
                                          fmt::format("decision '{}'", text));
  const std::string park = get_string(o, "park_mode", what, text);
  if (park == "release")
    d.park_mode = ParkMode::kRelease;
  else if (park == "hold")
    d.park_mode = ParkMode::kHold;
  else
    throw ProtocolError(fmt::format("decision has an unknown park_mode '{}': '{}'", park, text));
  d.every_steps = get_int(o, "every_steps", what, text);
  d.global_batch = get_int(o, "global_batch", what, text);
  if (const json::value* c = o.if_contains("checkpoint")) {
    if (!c->is_bool())
      throw ProtocolError(fmt::format("decision has a non-boolean 'checkpoint': '{}'", text));
    d.checkpoint = c->as_bool();
  }
  // Optional: absent (no member behind, or a supervisor built before it existed) = none.
  if (o.contains("behind")) d.behind = get_ids(o, "behind", what, text);
  return d;
}

std::string Report::to_json() const {
  return fmt::format(
      R"({{"v":1,"rank":{},"gpu":{},"generation":{},"round":{},"epoch":{},"step":{},"pid":{},"time_ms":{}{}}})",
      rank, gpu, generation, round, epoch, step, pid, time_ms,
      std::string(has_state ? "" : R"(,"has_state":false)") +
          (snapshot.empty() ? std::string()
                            : ",\"snapshot\":" + json::serialize(json::string(snapshot))));
}

Report Report::from_json(std::string_view text) {
  constexpr std::string_view what = "report";
  const json::value root = parse_object(text, what);
  const json::object& o = root.as_object();
  Report r;
  r.rank = static_cast<int>(get_int(o, "rank", what, text));
  r.gpu = static_cast<int>(get_int(o, "gpu", what, text));
  r.generation = get_int(o, "generation", what, text);
  r.round = get_int(o, "round", what, text);
  r.epoch = get_int(o, "epoch", what, text);
  r.step = get_int(o, "step", what, text);
  r.pid = static_cast<int>(get_int(o, "pid", what, text));
  // Optional: reports of workers built before it existed have none (0 = unknown).
  if (o.contains("time_ms")) r.time_ms = get_int(o, "time_ms", what, text);
  if (const json::value* h = o.if_contains("has_state")) {
    if (!h->is_bool())
      throw ProtocolError(fmt::format("report has a non-boolean 'has_state': '{}'", text));
    r.has_state = h->as_bool();
  }
  if (const json::value* v = o.if_contains("snapshot")) {
    if (!v->is_string())
      throw ProtocolError(fmt::format("report has a non-string 'snapshot': '{}'", text));
    r.snapshot = std::string(v->as_string());
  }
  return r;
}

std::string boundary_text(int64_t epoch, int64_t step) {
  if (epoch < 0) return "before the first epoch";
  if (step <= 0) return fmt::format("after epoch {}", epoch + 1);
  return fmt::format("in epoch {} after step {}", epoch + 1, step);
}

std::string position_text(int64_t epoch, int64_t step) {
  return step <= 0 ? boundary_text(epoch - 1, 0) : boundary_text(epoch, step);
}

std::vector<EnvVar> generation_env(const Decision& d, int slot) {
  const int rank = d.rank_of(slot);
  if (rank < 0) return {};
  // Nodes in their order in `active` (node-major when sorted: node ids come in join order);
  // the slot's place among its own node's active slots.
  const int node = slot_node(slot);
  std::vector<int> nodes;
  int local_rank = 0, local_world = 0;
  for (int s : d.active) {
    const int n = slot_node(s);
    if (!has_id(nodes, n)) nodes.push_back(n);
    if (n != node) continue;
    if (s == slot) local_rank = local_world;
    ++local_world;
  }
  const auto group_rank = std::find(nodes.begin(), nodes.end(), node) - nodes.begin();
  const std::string r = std::to_string(rank);
  const std::string world = std::to_string(d.active.size());
  return {{"RANK", r},
          {"WORLD_SIZE", world},
          {"LOCAL_RANK", std::to_string(local_rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
          {"GROUP_RANK", std::to_string(group_rank)},
          {"GROUP_WORLD_SIZE", std::to_string(nodes.size())},
          {"ROLE_RANK", r},
          {"ROLE_WORLD_SIZE", world}};
}

std::string ids_json(const std::vector<int>& ids) {
  return "[" + join_ids(ids) + "]";
}

bool has_id(const std::vector<int>& ids, int x) {
  return std::find(ids.begin(), ids.end(), x) != ids.end();
}

std::string join_ids(const std::vector<int>& ids, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += sep;
    out += std::to_string(ids[i]);
  }
  return out;
}

std::vector<int> parse_ids(std::string_view text) {
  std::vector<int> out;
  if (text.empty()) return out;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string_view item = text.substr(start, comma == text.npos ? text.npos : comma - start);
    int v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc{} || p != item.data() + item.size() || v < 0)
      throw ProtocolError(fmt::format("bad id list '{}': '{}' is not a slot id", text, item));
    out.push_back(v);
    if (comma == text.npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace gpurun::control
