// Leases and the effective GPU set. Reference: docs/sharing.md.
#include "control/policy.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iterator>
#include <tuple>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "gpurun/control/decision.hpp"

namespace gpurun::control {

namespace json = boost::json;

namespace {

std::vector<int> sorted_unique(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

int64_t int_field(const json::object& o, std::string_view key, const std::string& where) {
  const json::value* v = o.if_contains(key);
  if (!v || !v->is_int64())
    throw LeaseError(fmt::format("{}: field '{}' must be an integer", where, key));
  return v->as_int64();
}

bool running(const Lease& l, int64_t now_ms) {
  return !l.until_ms || *l.until_ms > now_ms;
}

}  // namespace

std::vector<Lease> parse_leases(std::string_view text, const std::string& source) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) return {};
  boost::system::error_code ec;
  json::value root = json::parse(text, ec);
  if (ec || !root.is_object() || !root.as_object().contains("leases") ||
      !root.as_object().at("leases").is_array())
    throw LeaseError(fmt::format(
        "{}: not a leases file (expected {{\"leases\": [...]}}); fix it, or remove it to end "
        "every lease",
        source));
  std::vector<Lease> out;
  size_t i = 0;
  for (const json::value& lv : root.as_object().at("leases").as_array()) {
    const std::string where = fmt::format("{}: lease {}", source, i++);
    if (!lv.is_object()) throw LeaseError(where + ": not an object");
    const json::object& o = lv.as_object();
    Lease l;
    const json::value* g = o.if_contains("gpus");
    if (!g || !g->is_array() || g->as_array().empty())
      throw LeaseError(where + ": field 'gpus' must be a non-empty array of GPU ids");
    for (const json::value& id : g->as_array()) {
      if (!id.is_int64() || id.as_int64() < 0 || id.as_int64() > 1'000'000)
        throw LeaseError(where + ": field 'gpus' must hold GPU ids (integers >= 0)");
      l.gpus.push_back(static_cast<int>(id.as_int64()));
    }
    l.gpus = sorted_unique(std::move(l.gpus));
    l.since_ms = int_field(o, "since_ms", where);
    if (const json::value* u = o.if_contains("until_ms"); u && !u->is_null())
      l.until_ms = int_field(o, "until_ms", where);
    if (const json::value* n = o.if_contains("note"); n && n->is_string())
      l.note = std::string(n->as_string());
    out.push_back(std::move(l));
  }
  return out;
}

std::string render_leases(const std::vector<Lease>& leases) {
  json::array arr;
  for (const Lease& l : leases) {
    json::object o;
    json::array g;
    for (int id : l.gpus) g.push_back(id);
    o["gpus"] = std::move(g);
    o["since_ms"] = l.since_ms;
    if (l.until_ms)
      o["until_ms"] = *l.until_ms;
    else
      o["until_ms"] = nullptr;
    if (!l.note.empty()) o["note"] = l.note;
    arr.push_back(std::move(o));
  }
  json::object root;
  root["leases"] = std::move(arr);
  return json::serialize(root) + "\n";
}

std::vector<int> lent_gpus(const std::vector<Lease>& leases, int64_t now_ms) {
  std::vector<int> out;
  for (const Lease& l : leases)
    if (running(l, now_ms)) out.insert(out.end(), l.gpus.begin(), l.gpus.end());
  return sorted_unique(std::move(out));
}

std::vector<Lease> drop_ended(const std::vector<Lease>& leases, int64_t now_ms,
                              std::vector<Lease>* ended) {
  std::vector<Lease> out;
  for (const Lease& l : leases) {
    if (running(l, now_ms))
      out.push_back(l);
    else if (ended)
      ended->push_back(l);
  }
  return out;
}

std::optional<int64_t> next_lease_end(const std::vector<Lease>& leases, int64_t now_ms) {
  std::optional<int64_t> best;
  for (const Lease& l : leases)
    if (l.until_ms && *l.until_ms > now_ms && (!best || *l.until_ms < *best)) best = l.until_ms;
  return best;
}

EffectiveSet effective_set(const std::vector<int>& declared, const std::vector<Lease>& leases,
                           int64_t now_ms, int min_gpus, std::string (*until_text)(int64_t),
                           const std::vector<std::pair<int, std::string>>& yielded,
                           const std::vector<int>& current) {
  // The reason per lent GPU: the latest end among the running leases that name it.
  std::vector<std::pair<int, std::string>> why;
  for (int gpu : declared) {
    std::optional<int64_t> until;
    bool lent = false, forever = false;
    for (const Lease& l : leases) {
      if (!running(l, now_ms) || !has_id(l.gpus, gpu)) continue;
      lent = true;
      if (!l.until_ms)
        forever = true;
      else if (!until || *l.until_ms > *until)
        until = l.until_ms;
    }
    if (!lent) continue;
    why.emplace_back(gpu, forever      ? std::string("lent until reclaimed")
                          : until_text ? "lent until " + until_text(*until)
                                       : fmt::format("lent until {} ms", *until));
  }
  for (const auto& [gpu, reason] : yielded) {
    if (!has_id(declared, gpu)) continue;
    auto w =
        std::find_if(why.begin(), why.end(), [id = gpu](const auto& p) { return p.first == id; });
    if (w == why.end())
      why.emplace_back(gpu, reason);
    else
      w->second += "; " + reason;
  }
  EffectiveSet out;
  const size_t floor = std::min(declared.size(), static_cast<size_t>(std::max(min_gpus, 0)));
  size_t keep = declared.size() - why.size() < floor ? floor - (declared.size() - why.size()) : 0;
  // Which left-out GPUs the floor keeps: first those the job trains on now (keeping one that
  // already left would start a rank on a GPU someone else now has, and send another away),
  // then lent ones before yielded ones (those run another user's process), lowest id first.
  std::vector<std::tuple<bool, bool, int>> order;  // (not current, yielded, gpu)
  for (const auto& [gpu, reason] : why) {
    const bool is_yielded = std::any_of(yielded.begin(), yielded.end(),
                                        [g = gpu](const auto& y) { return y.first == g; });
    order.emplace_back(!has_id(current, gpu), is_yielded, gpu);
  }
  std::sort(order.begin(), order.end());
  std::vector<int> kept_ids;
  for (size_t i = 0; i < keep && i < order.size(); ++i) kept_ids.push_back(std::get<2>(order[i]));
  for (int gpu : declared) {
    auto w = std::find_if(why.begin(), why.end(), [&](const auto& p) { return p.first == gpu; });
    if (w == why.end()) {
      out.active.push_back(gpu);
    } else if (has_id(kept_ids, gpu)) {
      out.active.push_back(gpu);
      out.kept.emplace_back(gpu,
                            fmt::format("{}, kept: [policy] min_gpus = {}", w->second, min_gpus));
    } else {
      out.excluded.push_back(*w);
    }
  }
  return out;
}

std::string kept_note(const EffectiveSet& e, const std::vector<int>& gpus, int min_gpus) {
  std::vector<int> kept;
  for (const auto& [gpu, why] : e.kept)
    if (has_id(gpus, gpu)) kept.push_back(gpu);
  if (kept.empty()) return "";
  return fmt::format(
      "; GPU{} {} stay{} in the job for now ([policy] min_gpus = {}): {} once the job has "
      "enough GPUs without {}",
      kept.size() == 1 ? "" : "s", fmt::join(kept, ", "), kept.size() == 1 ? "s" : "", min_gpus,
      kept.size() == 1 ? "it leaves" : "they leave", kept.size() == 1 ? "it" : "them");
}

std::string ids_text(const std::vector<int>& ids) {
  return "[" + join_ids(ids, ", ") + "]";
}

namespace {

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

}  // namespace

std::string lend_effect(const std::vector<int>& lent, const std::vector<int>& current,
                        const EffectiveSet& after, int min_gpus) {
  std::vector<int> leaving, idle;
  for (int g : lent) {
    if (!has_id(current, g))
      idle.push_back(g);
    else if (!has_id(after.active, g))
      leaving.push_back(g);
  }
  std::vector<std::string> parts;
  if (after.active.empty() && !current.empty())
    parts.push_back("the job pauses at its next boundary");
  else if (!leaving.empty())
    parts.push_back(fmt::format("the job stops using {} at its next boundary", ids_text(leaving)));
  if (!idle.empty())
    parts.push_back(fmt::format("{} {} not in use by the job now", ids_text(idle),
                                idle.size() == 1 ? "is" : "are"));
  std::string out = joined(parts);
  const std::string kept = kept_note(after, lent, min_gpus);
  if (out.empty())
    return kept.empty() ? "nothing changes for the job" : "the job keeps them" + kept;
  return out + kept;
}

std::string reclaim_effect(const std::vector<int>& back, const std::vector<int>& declared,
                           const std::vector<int>& current, const EffectiveSet& after) {
  std::vector<int> returning, leaving, undeclared;
  std::vector<std::string> parts;
  const auto why_out = [&](int g) -> const std::string* {
    for (const auto& [gpu, why] : after.excluded)
      if (gpu == g) return &why;
    return nullptr;
  };
  for (int g : after.active)
    if (!has_id(current, g)) returning.push_back(g);
  for (int g : current)
    if (!has_id(after.active, g)) leaving.push_back(g);
  if (!returning.empty())
    parts.push_back(fmt::format("the job takes back {} at its next boundary", ids_text(returning)));
  for (int g : leaving) {
    const std::string* why = why_out(g);
    parts.push_back(fmt::format("GPU {} leaves the job in their place ({})", g,
                                why ? *why : std::string("no longer wanted")));
  }
  for (int g : back) {
    if (has_id(after.active, g)) continue;
    if (!has_id(declared, g)) {
      undeclared.push_back(g);
      continue;
    }
    if (const std::string* why = why_out(g))
      parts.push_back(fmt::format("GPU {} stays out: {}", g, *why));
  }
  if (!undeclared.empty())
    parts.push_back(fmt::format("{} stay{} out: config.toml does not name {}", ids_text(undeclared),
                                undeclared.size() == 1 ? "s" : "",
                                undeclared.size() == 1 ? "it" : "them"));
  return parts.empty() ? "nothing changes for the job" : joined(parts);
}

std::vector<int> parse_gpu_list(std::string_view text, const std::vector<int>& all,
                                std::string_view what) {
  if (text == "all") return sorted_unique(all);
  std::vector<int> out;
  const auto bad = [&](std::string_view why) {
    return LeaseError(
        fmt::format("invalid {} '{}': {} (expected ids like 2,3 or 0-3, or all)", what, text, why));
  };
  const auto number = [&](std::string_view s) {
    int n = -1;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    if (s.empty() || ec != std::errc{} || p != s.data() + s.size() || n < 0)
      throw bad(fmt::format("'{}' is not a GPU id", s));
    return n;
  };
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string_view part = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (part.empty()) throw bad("an empty part");
    if (const size_t dash = part.find('-'); dash != std::string_view::npos) {
      const int lo = number(part.substr(0, dash)), hi = number(part.substr(dash + 1));
      if (hi < lo) throw bad(fmt::format("the range '{}' runs backwards", part));
      if (hi - lo > 4096) throw bad(fmt::format("the range '{}' is too long", part));
      for (int i = lo; i <= hi; ++i) out.push_back(i);
    } else {
      out.push_back(number(part));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  // "1,1" or "0-2,2": a GPU named twice is a typo (which GPU was meant?), never taken as once.
  std::vector<int> sorted = out;
  std::sort(sorted.begin(), sorted.end());
  if (const auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end())
    throw bad(fmt::format("GPU {} is named twice; list each GPU once", *dup));
  return sorted_unique(std::move(out));
}

int64_t parse_duration_ms(std::string_view text, std::string_view what) {
  const auto bad = [&] {
    return LeaseError(fmt::format(
        "invalid {} '{}': expected a positive duration such as 90s, 30m, 2h or 1d", what, text));
  };
  if (text.empty()) throw bad();
  double scale = 1000.0;
  std::string_view num = text;
  switch (text.back()) {
    case 's':
      num.remove_suffix(1);
      break;
    case 'm':
      scale = 60e3, num.remove_suffix(1);
      break;
    case 'h':
      scale = 3600e3, num.remove_suffix(1);
      break;
    case 'd':
      scale = 86400e3, num.remove_suffix(1);
      break;
    default:
      break;
  }
  double v = 0;
  const auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  if (num.empty() || ec != std::errc{} || p != num.data() + num.size() || !std::isfinite(v) ||
      v <= 0)
    throw bad();
  const double ms = std::ceil(v * scale);
  if (ms > 366.0 * 86400e3 * 100) throw bad();  // a century: a slip, not a lease
  // Under a second a lease could end before gpurun reads it (at its next boundary at best).
  if (ms < 1000)
    throw LeaseError(
        fmt::format("invalid {} '{}': shorter than 1s, the least a lease lasts", what, text));
  return static_cast<int64_t>(ms);
}

}  // namespace gpurun::control
