#include "energy/power_profiler.hpp"

#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <utility>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "energy/cost.hpp"
#include "gpurun/check.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::energy {

namespace {

const char* phase_name(int p) {
  static const char* const names[] = {"start", "warmup", "measure", "done"};
  return names[p];
}

}  // namespace

const char* cooldown_name(Cooldown c) {
  switch (c) {
    case Cooldown::kSettled:
      return "settled";
    case Cooldown::kTimeout:
      return "timeout";
    case Cooldown::kOff:
      return "off";
    case Cooldown::kNoTemperature:
      return "no temperature";
  }
  return "?";
}

std::string ProfileRow::to_json_fields() const {
  using detail::json_number;
  return fmt::format(
      "{{\"limit_w\": {}, \"steps\": {}, \"seconds\": {}, \"energy_j\": {}, \"steps_per_s\": {}, "
      "\"avg_power_w\": {}, \"cost_per_step\": {}, \"warmup_s\": {}, \"temp_c\": {}, "
      "\"cooldown\": \"{}\"}}",
      limit_w, steps, json_number(seconds), json_number(energy_j), json_number(steps_per_s),
      json_number(avg_power_w), json_number(cost_per_step), json_number(warmup_s),
      temp_c ? json_number(*temp_c) : std::string("null"), cooldown_name(cooldown));
}

PowerProfiler::PowerProfiler(const ProfilerOptions& options) : opt_(options) {
  if (opt_.max_w == 0 || opt_.max_w < opt_.min_w) {
    throw Error(fmt::format(
        "power profiler: the highest limit ({} W) must be positive and at least the lowest ({} W)",
        opt_.max_w, opt_.min_w));
  }
  if (opt_.step_w == 0) throw Error("power profiler: the limit step must be at least 1 W");
  if (opt_.warmup_steps < 0 || opt_.measure_steps < 1) {
    throw Error(
        fmt::format("power profiler: warm-up steps ({}) must be ≥ 0 and measured steps ({}) ≥ 1",
                    opt_.warmup_steps, opt_.measure_steps));
  }
  if (!(opt_.eta >= 0.0 && opt_.eta <= 1.0)) {
    throw Error(fmt::format("power profiler: eta {} is outside [0, 1]", opt_.eta));
  }
  if (!(opt_.cooldown_max_s >= 0) || !(opt_.settle_window_s > 0) || !(opt_.settle_c >= 0)) {
    throw Error(fmt::format(
        "power profiler: the cool-down ({} s) must be ≥ 0, its settle window ({} s) positive and "
        "its settle band ({} °C) ≥ 0",
        opt_.cooldown_max_s, opt_.settle_window_s, opt_.settle_c));
  }
  if (!(opt_.max_power_w > 0)) {
    throw Error(fmt::format("power profiler: max_power_w {} W must be positive", opt_.max_power_w));
  }
  for (int64_t w = opt_.max_w; w >= static_cast<int64_t>(opt_.min_w); w -= opt_.step_w) {
    limits_.push_back(static_cast<unsigned>(w));
  }
}

void PowerProfiler::transition(Phase to) {
  // The whole table: (from, to) pairs that are allowed.
  static constexpr std::pair<Phase, Phase> kAllowed[] = {
      {Phase::kStart, Phase::kWarmup},    // first observation at this limit
      {Phase::kWarmup, Phase::kMeasure},  // warm-up over
      {Phase::kWarmup, Phase::kStart},    // interrupted / counter went back
      {Phase::kMeasure, Phase::kWarmup},  // row recorded, next limit
      {Phase::kMeasure, Phase::kDone},    // last row recorded
      {Phase::kMeasure, Phase::kStart},   // interrupted / counter went back
  };
  for (const auto& [from, next] : kAllowed) {
    if (from == phase_ && next == to) {
      phase_ = to;
      return;
    }
  }
  GPURUN_CHECK(false, "power profiler: illegal transition {} -> {}",
               phase_name(static_cast<int>(phase_)), phase_name(static_cast<int>(to)));
}

unsigned PowerProfiler::limit_w() const {
  return done() ? chosen_w_ : limits_[index_];
}

unsigned PowerProfiler::chosen_w() const {
  GPURUN_CHECK(done(), "chosen_w() before profiling is done ({} of {} limits measured)",
               rows_.size(), limits_.size());
  return chosen_w_;
}

void PowerProfiler::interrupt() {
  if (phase_ == Phase::kWarmup || phase_ == Phase::kMeasure) transition(Phase::kStart);
}

void PowerProfiler::start_warmup(const Mark& now) {
  mark_ = now;
  temps_.clear();
  if (now.temp_c) temps_.emplace_back(now.t_s, *now.temp_c);
  transition(Phase::kWarmup);
}

std::optional<Cooldown> PowerProfiler::warmup_over(const Mark& now) {
  if (now.temp_c) {
    temps_.emplace_back(now.t_s, *now.temp_c);
    // Keep one reading at or before the window's start, and every one after it.
    while (temps_.size() >= 2 && temps_[1].first <= now.t_s - opt_.settle_window_s)
      temps_.pop_front();
  }
  if (now.steps - mark_.steps < opt_.warmup_steps) return std::nullopt;
  if (opt_.cooldown_max_s <= 0) return Cooldown::kOff;
  if (temps_.empty()) return Cooldown::kNoTemperature;
  if (temps_.front().first <= now.t_s - opt_.settle_window_s) {
    double lo = temps_.front().second, hi = lo;
    for (const auto& [t, c] : temps_) {
      lo = std::min(lo, c);
      hi = std::max(hi, c);
    }
    if (hi - lo <= opt_.settle_c) return Cooldown::kSettled;
  }
  if (now.t_s - mark_.t_s >= opt_.cooldown_max_s) return Cooldown::kTimeout;
  return std::nullopt;
}

void PowerProfiler::observe(double t_s, int64_t steps_done, double energy_j,
                            std::optional<double> temp_c) {
  if (done()) return;
  const Mark now{t_s, steps_done, energy_j, temp_c};
  if (last_ &&
      (now.steps < last_->steps || now.energy_j < last_->energy_j || now.t_s < last_->t_s)) {
    interrupt();
  }
  last_ = now;
  switch (phase_) {
    case Phase::kStart:
      start_warmup(now);
      return;
    case Phase::kWarmup:
      if (const std::optional<Cooldown> how = warmup_over(now)) {
        warmup_s_ = now.t_s - mark_.t_s;
        measure_temp_c_ = now.temp_c;
        measure_cooldown_ = *how;
        mark_ = now;
        transition(Phase::kMeasure);
      }
      return;
    case Phase::kMeasure: {
      const int64_t n = now.steps - mark_.steps;
      const double seconds = now.t_s - mark_.t_s;
      if (n < opt_.measure_steps || !(seconds > 0)) return;
      ProfileRow r;
      r.limit_w = limits_[index_];
      r.steps = n;
      r.seconds = seconds;
      r.energy_j = now.energy_j - mark_.energy_j;
      r.steps_per_s = static_cast<double>(n) / seconds;
      r.avg_power_w = r.energy_j / seconds;
      // Zeus' cost of one step (cost.hpp): η·E/n + (1−η)·MaxPower·T/n.
      r.cost_per_step = zeus_cost(r.energy_j, seconds, opt_.max_power_w, opt_.eta) / n;
      r.warmup_s = warmup_s_;
      r.temp_c = measure_temp_c_;
      r.cooldown = measure_cooldown_;
      rows_.push_back(r);
      unread_.push_back(r);
      if (index_ + 1 < limits_.size()) {
        ++index_;
        start_warmup(now);  // the next limit's warm-up starts here
      } else {
        // rows_ are in descending limit order: a later row wins only when clearly cheaper.
        const ProfileRow* best = &rows_.front();
        for (const ProfileRow& row : rows_) {
          if (row.cost_per_step < best->cost_per_step * (1 - 1e-9)) best = &row;
        }
        chosen_w_ = best->limit_w;
        transition(Phase::kDone);
      }
      return;
    }
    case Phase::kDone:
      return;
  }
}

std::optional<ProfileRow> PowerProfiler::take_finished_row() {
  if (unread_.empty()) return std::nullopt;
  ProfileRow r = unread_.front();
  unread_.pop_front();
  return r;
}

// ---- cache ----

namespace {

namespace json = boost::json;

[[noreturn]] void bad_cache(const std::filesystem::path& path, const std::string& what) {
  throw Error(fmt::format("profile cache {}: {}; fix or delete the file", path.string(), what));
}

// The parsed file, or an empty cache when it does not exist.
// The file's bytes, or nullopt when it does not exist. Never blocks (a FIFO), never grows
// without bound (/dev/zero): read_regular_file.
std::optional<FileContent> read_cache_file(const std::filesystem::path& path) {
  try {
    return read_regular_file_if_exists(path, kDefaultMaxFileBytes, "the profile cache");
  } catch (const FileError& e) {
    throw Error(
        fmt::format("the profile cache {} ([energy] profile_cache) cannot be read: {}; "
                    "name a JSON file there, or delete it",
                    path.string(), e.problem()));
  }
}

json::object parse_cache(const std::filesystem::path& path,
                         const std::optional<FileContent>& file) {
  if (!file) {
    json::object o;
    o["version"] = 1;
    o["entries"] = json::array();
    return o;
  }
  json::error_code ec;
  json::value v = json::parse(file->bytes, ec);
  if (ec) bad_cache(path, fmt::format("not JSON ({})", ec.message()));
  json::object* o = v.if_object();
  if (!o) bad_cache(path, "expected a JSON object");
  const json::value* entries = o->if_contains("entries");
  if (!entries || !entries->is_array()) bad_cache(path, "\"entries\" is missing or not an array");
  std::size_t i = 0;
  for (const json::value& e : entries->get_array()) {
    ++i;
    const json::object* eo = e.if_object();
    auto fail = [&](const char* field, const char* want) {
      bad_cache(path, fmt::format("entry {}: \"{}\" is missing or not {}", i, field, want));
    };
    if (!eo) bad_cache(path, fmt::format("entry {} is not an object", i));
    for (const char* f : {"program", "key", "gpu_model"}) {
      const json::value* s = eo->if_contains(f);
      if (!s || !s->is_string()) fail(f, "a string");
    }
    const json::value* gpus = eo->if_contains("gpus");
    if (!gpus || !gpus->is_int64()) fail("gpus", "an integer");
    const json::value* eta = eo->if_contains("eta");
    if (!eta || !eta->is_number()) fail("eta", "a number");
    const json::value* w = eo->if_contains("chosen_w");
    if (!w || !(w->is_int64() || w->is_uint64()) || w->to_number<int64_t>() <= 0 ||
        w->to_number<int64_t>() > 100000) {
      fail("chosen_w", "a whole number of watts");
    }
  }
  return std::move(*o);
}

bool matches(const json::object& e, const ProfileKey& key) {
  return e.at("program").get_string() == key.program && e.at("key").get_string() == key.key &&
         e.at("gpu_model").get_string() == key.gpu_model && e.at("gpus").get_int64() == key.gpus &&
         e.at("eta").to_number<double>() == key.eta;
}

}  // namespace

std::optional<unsigned> cached_limit(const std::filesystem::path& path, const ProfileKey& key) {
  const json::object cache = parse_cache(path, read_cache_file(path));
  for (const json::value& e : cache.at("entries").get_array()) {
    if (matches(e.get_object(), key)) {
      return static_cast<unsigned>(e.get_object().at("chosen_w").to_number<int64_t>());
    }
  }
  return std::nullopt;
}

void store_limit(const std::filesystem::path& path, const ProfileKey& key, unsigned chosen_w,
                 const std::vector<ProfileRow>& rows) {
  json::object entry;
  entry["program"] = key.program;
  entry["key"] = key.key;
  entry["gpu_model"] = key.gpu_model;
  entry["gpus"] = static_cast<int64_t>(key.gpus);
  entry["eta"] = key.eta;
  entry["chosen_w"] = static_cast<int64_t>(chosen_w);
  json::array jrows;
  for (const ProfileRow& r : rows) jrows.push_back(json::parse(r.to_json_fields()));
  entry["rows"] = std::move(jrows);
  // Jobs sharing one cache: replaced only if it still holds what was read (else read again),
  // so another job's entry written meanwhile is kept.
  constexpr int kAttempts = 5;
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    const std::optional<FileContent> before = read_cache_file(path);
    json::object cache = parse_cache(path, before);
    json::array& entries = cache["entries"].as_array();
    bool replaced = false;
    for (json::value& e : entries) {
      if (matches(e.get_object(), key)) {
        e = entry;
        replaced = true;
        break;
      }
    }
    if (!replaced) entries.push_back(entry);
    try {
      if (replace_file_if_unchanged(path, before, json::serialize(cache) + "\n", 0644)) return;
    } catch (const FileError& e) {
      throw Error(fmt::format("cannot write the profile cache: {}", e.what()));
    }
  }
  throw Error(
      fmt::format("the profile cache {} changed {} times while gpurun wrote it (other "
                  "jobs write it): this run's limit was not saved",
                  path.string(), kAttempts));
}

}  // namespace gpurun::energy
