#include "control/resize_timeline.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <boost/json.hpp>

namespace gpurun::control {

namespace json = boost::json;

double monotonic_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

std::string ids(const std::vector<int>& v) {
  return "[" + join_ids(v, ",") + "]";
}

/// Classifies a resize for people: what changed between the old and the new set.
std::string kind_of(const Decision& d, const std::vector<int>& from) {
  if (d.active.empty()) return "pause";
  if (from.empty()) return "resume";
  if (!d.failed.empty()) return "recovery";
  if (!d.joiners.empty() && !d.leavers.empty()) return "swap";
  if (!d.joiners.empty()) return "grow";
  if (!d.leavers.empty()) return "shrink";
  return "resize";
}

/// The old generation's set: active - joiners + leavers + failed.
std::vector<int> from_of(const Decision& d) {
  std::set<int> s(d.active.begin(), d.active.end());
  for (int g : d.joiners) s.erase(g);
  s.insert(d.leavers.begin(), d.leavers.end());
  s.insert(d.failed.begin(), d.failed.end());
  return {s.begin(), s.end()};
}

double round3(double v) {
  return static_cast<double>(static_cast<int64_t>(v * 1000.0 + (v < 0 ? -0.5 : 0.5))) / 1000.0;
}

}  // namespace

void ResizeTimeline::config_seen() {
  detect_ = now_();
}

void ResizeTimeline::decision_written(const Decision& d) {
  if (d.kind == Decision::Kind::kSnapshot) {
    if (!snapshot_decision_) snapshot_decision_ = now_();
    return;
  }
  if (d.kind != Decision::Kind::kResize || open_.count(d.generation) != 0) return;
  if (d.generation <= last_generation_) return;  // already timed
  last_generation_ = d.generation;
  for (auto it = open_.begin(); it != open_.end();) close((it++)->first);
  Open o;
  o.decision = d;
  o.decided = now_();
  o.detect = std::exchange(detect_, std::nullopt);
  if (d.active.empty() || from_of(d).empty()) o.snapshot_decision = snapshot_decision_;
  snapshot_decision_.reset();
  o.expected.insert(d.active.begin(), d.active.end());
  o.expected.insert(d.leavers.begin(), d.leavers.end());
  for (int g : d.failed) o.expected.erase(g);
  for (int g : d.joiners)
    if (auto e = early_spawns_.find(g); e != early_spawns_.end()) {
      // A warm joiner spawned for this edit (after it was seen); an older spawn (the launch's,
      // of a hold-mode rank woken now) is not part of this resize.
      if (!o.detect || e->second.first >= *o.detect) {
        o.spawned[g] = e->second.first;
        o.spawned_pid[g] = e->second.second;
      }
      early_spawns_.erase(e);
    }
  open_.emplace(d.generation, std::move(o));
}

void ResizeTimeline::spawned(int gpu, int pid) {
  if (open_.empty() || !open_.rbegin()->second.expected.count(gpu)) {
    early_spawns_[gpu] = {now_(), pid};
    return;
  }
  Open& o = open_.rbegin()->second;
  o.spawned[gpu] = now_();
  o.spawned_pid[gpu] = pid;
}

bool ResizeTimeline::on_record(int64_t generation, int gpu, std::string_view text,
                               double clock_offset_ms) {
  auto it = open_.find(generation);
  if (it == open_.end()) return false;
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) return false;
  const json::object& o = v.as_object();
  Record r;
  if (const auto* role = o.if_contains("role"); role && role->is_string())
    r.role = std::string(role->as_string());
  if (const auto* pid = o.if_contains("pid"); pid && pid->is_int64()) r.pid = pid->as_int64();
  if (const auto* b = o.if_contains("bytes"); b && b->is_int64()) r.bytes = b->as_int64();
  const auto* marks = o.if_contains("marks");
  if (!marks || !marks->is_object()) return false;
  for (const auto& [k, mv] : marks->as_object()) {
    if (!mv.is_number()) return false;
    r.marks.emplace_back(std::string(k), mv.to_number<double>() + clock_offset_ms);
  }
  std::stable_sort(r.marks.begin(), r.marks.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  it->second.records[gpu] = std::move(r);
  close_complete();
  return true;
}

void ResizeTimeline::slot_gone(int gpu, int pid) {
  for (auto& [g, o] : open_) {
    if (o.records.count(gpu)) continue;
    const auto s = o.spawned_pid.find(gpu);
    if (s != o.spawned_pid.end() && s->second != pid) continue;  // a newer process will report
    if (o.expected.count(gpu)) o.gone.insert(gpu);
  }
  close_complete();
}

void ResizeTimeline::flush() {
  while (!open_.empty()) close(open_.begin()->first);
}

void ResizeTimeline::close_complete() {
  for (auto it = open_.begin(); it != open_.end();) {
    const Open& o = it->second;
    const bool complete = std::all_of(o.expected.begin(), o.expected.end(),
                                      [&](int g) { return o.records.count(g) || o.gone.count(g); });
    const int64_t g = (it++)->first;
    if (complete) close(g);
  }
}

void ResizeTimeline::close(int64_t generation) {
  auto it = open_.find(generation);
  if (it == open_.end()) return;
  const Open o = std::move(it->second);
  open_.erase(it);
  const Decision& d = o.decision;
  const std::vector<int> from = from_of(d);
  const double origin = o.detect ? *o.detect : o.snapshot_decision.value_or(o.decided);
  const auto rel = [&](double t) { return round3(t - origin); };

  // The critical path: gpurun's moments, then each phase's latest end over the ranks.
  std::map<std::string, double> latest;
  if (o.detect) latest["detect"] = *o.detect;
  if (o.snapshot_decision) latest["snapshot_decision"] = *o.snapshot_decision;
  latest["decision"] = o.decided;
  for (const auto& [gpu, t] : o.spawned) latest["spawned"] = std::max(latest["spawned"], t);
  for (const auto& [gpu, r] : o.records)
    for (const auto& [name, t] : r.marks) {
      if (name == "seen" || name == "snapshot_begin") continue;  // per rank only
      auto [pos, fresh] = latest.emplace(name, t);
      if (!fresh) pos->second = std::max(pos->second, t);
    }
  std::vector<std::pair<std::string, double>> path(latest.begin(), latest.end());
  std::stable_sort(path.begin(), path.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  JsonObject phases;
  for (size_t i = 1; i < path.size(); ++i)
    phases.add(path[i].first, round3(path[i].second - path[i - 1].second));

  std::string ranks = "[";
  for (const auto& [gpu, r] : o.records) {
    JsonObject marks;
    if (auto s = o.spawned.find(gpu); s != o.spawned.end()) marks.add("spawned", rel(s->second));
    for (const auto& [name, t] : r.marks) marks.add(name, rel(t));
    JsonObject rank;
    rank.add("gpu", gpu)
        .add("role", r.role)
        .add("pid", r.pid)
        .add("bytes", r.bytes)
        .add_raw("ms", marks.str());
    ranks += (ranks.size() > 1 ? "," : "") + rank.str();
  }
  ranks += "]";
  std::vector<int> missing;
  for (int g : o.expected)
    if (!o.records.count(g)) missing.push_back(g);
  const std::string end_name = d.active.empty() ? "left" : "resumed";
  const double end = latest.count(end_name) ? latest[end_name] : path.back().second;

  JsonObject e;
  e.add("generation", d.generation)
      .add("kind", kind_of(d, from))
      .add_raw("from", ids(from))
      .add_raw("to", ids(d.active))
      .add_raw("joiners", ids(d.joiners))
      .add_raw("leavers", ids(d.leavers))
      .add_raw("failed", ids(d.failed))
      .add("clock", "monotonic")
      .add("origin", o.detect              ? "config seen"
                     : o.snapshot_decision ? "snapshot decision"
                                           : "decision")
      .add("total_ms", round3(end - origin))
      .add_raw("phases_ms", phases.str())
      .add_raw("ranks", ranks)
      .add_raw("missing", ids(missing))
      .add("complete", missing.empty());
  last_ = e.str();
  ready_.push_back(std::move(e));
}

std::vector<JsonObject> ResizeTimeline::take_ready() {
  return std::exchange(ready_, {});
}

std::vector<std::string> ResizeTimeline::describe(std::string_view event_json) {
  boost::system::error_code ec;
  const json::value v = json::parse(event_json, ec);
  if (ec || !v.is_object()) return {};
  const json::object& o = v.as_object();
  // Numbers as people write them (0.1 ms: "1630.2", "908"; never "1.6302E3"), lists as
  // "[0, 1]".
  const auto number = [](const json::value& x) -> std::string {
    if (x.is_int64() || x.is_uint64()) return json::serialize(x);
    std::string s = fmt::format("{:.1f}", x.to_number<double>());
    if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
    return s == "-0" ? "0" : s;
  };
  const auto show = [&](const json::value& x) -> std::string {
    if (x.is_number()) return number(x);
    if (x.is_string()) return std::string(x.as_string());
    if (x.is_array()) {
      std::string s = "[";
      for (const auto& e : x.as_array()) s += (s.size() > 1 ? ", " : "") + json::serialize(e);
      return s + "]";
    }
    return json::serialize(x);
  };
  const auto text = [&](const json::object& obj, std::string_view k) -> std::string {
    const json::value* x = obj.if_contains(k);
    if (!x || x->is_null()) return "-";
    return show(*x);
  };
  const auto ms_list = [&](const json::value* x) {
    std::string s;
    if (!x || !x->is_object()) return s;
    for (const auto& [k, t] : x->as_object())
      s += fmt::format("{}{} {}", s.empty() ? "" : ", ", std::string_view(k), show(t));
    return s;
  };
  const json::value* to = o.if_contains("to");
  const bool pause = to && to->is_array() && to->as_array().empty();
  std::vector<std::string> out;
  out.push_back(fmt::format(
      "last resize: generation {} {} {} -> {}: {} ms from the {} to {} (phases, ms: {}){}",
      text(o, "generation"), text(o, "kind"), text(o, "from"), text(o, "to"), text(o, "total_ms"),
      text(o, "origin"), pause ? "paused" : "training", ms_list(o.if_contains("phases_ms")),
      text(o, "complete") == "true" ? "" : "; no record from gpu " + text(o, "missing")));
  if (const json::value* r = o.if_contains("ranks"); r && r->is_array())
    for (const auto& rv : r->as_array()) {
      if (!rv.is_object()) continue;
      const json::object& ro = rv.as_object();
      out.push_back(fmt::format("  gpu {} {}: {}", text(ro, "gpu"), text(ro, "role"),
                                ms_list(ro.if_contains("ms"))));
    }
  return out;
}

}  // namespace gpurun::control
