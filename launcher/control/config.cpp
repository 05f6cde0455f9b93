// config.toml parsing and validation. Reference: docs/config.md.
#include "control/config.hpp"
#include "control/config_text.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "gpurun/regular_file.hpp"

namespace gpurun::control {

namespace {

namespace fs = std::filesystem;
using namespace config_text;  // the findings' phrasing (config_text.hpp)

constexpr std::string_view kParkAllowed = R"("release", "hold")";
constexpr std::string_view kEveryAllowed = R"("epoch" or a positive integer number of steps)";
constexpr std::string_view kDeadlineAllowed = "a positive number of seconds (default 300)";
constexpr std::string_view kGlobalAllowed =
    "a positive integer (samples per optimizer step, summed over the active GPUs)";
/// Upper bound for [batch] global, in samples per optimizer step (2^31 - 1): orders of magnitude
/// above the global batches used in practice, so a larger value is a slip such as extra zeros. The
/// worker also checks it against the dataset (docs/config.md).
constexpr int64_t kMaxGlobalBatch = 2'147'483'647;
/// Upper bound for [boundary] deadline_s, in seconds (~31 years: "practically never").
constexpr int64_t kMaxDeadlineSeconds = 1'000'000'000;

/// A key the user may write, and how a warning refers to it when suggesting it.
struct KnownKey {
  std::string_view name;
  std::string_view suggestion;
};

constexpr KnownKey kTopLevelKeys[] = {
    {"active_gpus", "'active_gpus'"},
    {"park", "[park]"},
    {"boundary", "[boundary]"},
    {"batch", "[batch]"},
    {"energy", "[energy]"},
    {"policy", "[policy]"},
    {"notify", "[notify]"},
    {"restart", "[restart]"},
    {"mode", "'mode' under [park]"},
    {"every", "'every' under [boundary]"},
    {"deadline_s", "'deadline_s' under [boundary]"},
    {"setup_deadline_s", "'setup_deadline_s' under [boundary]"},
    {"standby", "'standby' under [park]"},
    {"global", "'global' under [batch]"},
    {"min_gpus", "'min_gpus' under [policy]"},
    {"command", "'command' under [notify]"},
};

/// Collects findings with their positions; renders them sorted by position.
class Validator {
 public:
  Validator(const std::string& source, const std::vector<int>& valid_gpu_ids)
      : source_(source), valid_(valid_gpu_ids) {
    std::sort(valid_.begin(), valid_.end());
    valid_.erase(std::unique(valid_.begin(), valid_.end()), valid_.end());
  }

  Config run(const toml::table& root) {
    Config config;
    sets_active_gpus_ = root.contains("active_gpus");
    for (auto&& [key, node] : root) {
      const std::string_view name = key.str();
      if (name == "active_gpus") {
        check_active_gpus(node, config);
      } else if (name == "park") {
        check_park(node, config);
      } else if (name == "boundary") {
        check_boundary(node, config);
      } else if (name == "batch") {
        check_batch(node, config);
      } else if (name == "energy") {
        check_energy(node, config);
      } else if (name == "policy") {
        check_policy(node, config);
      } else if (name == "notify") {
        check_notify(node, config);
      } else if (name == "restart") {
        warn(key.source(), fmt::format("[{}] is not yet used (ignored)", name));
      } else {
        warn_unknown_top_level(key);
      }
    }
    if (!errors_.empty())
      throw ConfigError(fmt::format("{}", fmt::join(capped(errors_, "error"), "\n")));
    config.warnings = capped(warnings_, "warning");
    return config;
  }

 private:
  struct Finding {
    uint32_t line;
    uint32_t column;
    std::string text;
  };

  std::string where(const toml::source_region& at) const {
    return fmt::format("{}:{}:{}", source_, at.begin.line, at.begin.column);
  }

  /// Findings of one kind: the earliest ones in file order (at most 2 * kMaxReportedProblems
  /// held at a time, so a file with 200,000 bad ids costs no 200,000 strings) and how many
  /// others were found.
  struct Findings {
    std::vector<Finding> kept;
    std::size_t dropped = 0;

    void add(Finding f) {
      kept.push_back(std::move(f));
      if (kept.size() < 2 * kMaxReportedProblems) return;
      sort(kept);
      dropped += kept.size() - kMaxReportedProblems;
      kept.resize(kMaxReportedProblems);
    }
    bool empty() const { return kept.empty(); }
  };

  static void sort(std::vector<Finding>& findings) {
    std::stable_sort(findings.begin(), findings.end(), [](const Finding& a, const Finding& b) {
      return std::tie(a.line, a.column) < std::tie(b.line, b.column);
    });
  }

  void error(const toml::source_region& at, std::string_view key, std::string_view problem,
             std::string_view allowed) {
    errors_.add({at.begin.line, at.begin.column,
                 fmt::format("{}: {}: {}; allowed: {}", where(at), key, problem, allowed)});
  }

  void warn(const toml::source_region& at, std::string_view text) {
    warnings_.add({at.begin.line, at.begin.column, fmt::format("{}: {}", where(at), text)});
  }

  /// The first kMaxReportedProblems findings in file order, then one line saying how many
  /// more there are: a generated file with 200,000 bad ids must not flood the console and the
  /// event log with 200,000 lines.
  std::vector<std::string> capped(Findings findings, std::string_view noun) const {
    sort(findings.kept);
    std::size_t more = findings.dropped;
    if (findings.kept.size() > kMaxReportedProblems) {
      more += findings.kept.size() - kMaxReportedProblems;
      findings.kept.resize(kMaxReportedProblems);
    }
    std::vector<std::string> texts;
    texts.reserve(findings.kept.size() + 1);
    for (Finding& f : findings.kept) texts.push_back(std::move(f.text));
    if (more > 0)
      texts.push_back(fmt::format("and {} more {}{} in {} (only the first {} are reported)", more,
                                  noun, more == 1 ? "" : "s", source_, kMaxReportedProblems));
    return texts;
  }

  std::string valid_ids_text() const {
    if (valid_.empty()) return "none (this node has no GPU slots)";
    return fmt::format("{}", fmt::join(valid_, ", "));
  }

  bool is_valid_id(int64_t id) const {
    return id >= 0 && id <= INT32_MAX && std::binary_search(valid_.begin(), valid_.end(), id);
  }

  void check_active_gpus(const toml::node& node, Config& config) {
    if (auto ids = gpu_ids(node, "active_gpus")) config.active_gpus = std::move(*ids);
  }

  /// A list of this node's GPU ids under `key`, sorted; nullopt after an error.
  std::optional<std::vector<int>> gpu_ids(const toml::node& node, std::string_view key) {
    const auto* array = node.as_array();
    if (array == nullptr) {
      error(node.source(), key,
            fmt::format("expected an array of GPU ids, found {}", found_phrase(node)),
            fmt::format("[] or a list of ids from {}", valid_ids_text()));
      return std::nullopt;
    }
    std::vector<int> ids;
    std::map<int64_t, toml::source_position> first_seen;
    for (const toml::node& element : *array) {
      const auto* integer = element.as_integer();
      if (integer == nullptr) {
        error(element.source(), key,
              fmt::format("expected integer GPU ids, found {}", found_phrase(element)),
              valid_ids_text());
        continue;
      }
      const int64_t id = integer->get();
      if (id < 0) {
        error(element.source(), key, fmt::format("GPU id {} is negative", id), valid_ids_text());
      } else if (!is_valid_id(id)) {
        error(element.source(), key, fmt::format("GPU id {} is not available on this node", id),
              valid_ids_text());
      } else if (auto it = first_seen.find(id); it != first_seen.end()) {
        error(element.source(), key,
              fmt::format("GPU id {} is listed twice (first at line {}, column {})", id,
                          it->second.line, it->second.column),
              fmt::format("distinct ids from {}", valid_ids_text()));
      } else {
        first_seen.emplace(id, element.source().begin);
        ids.push_back(static_cast<int>(id));
      }
    }
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  /// The table under a top-level section key, or nullptr after reporting a type error.
  const toml::table* section(const toml::node& node, std::string_view name,
                             std::string_view allowed) {
    const auto* table = node.as_table();
    if (table == nullptr) {
      error(node.source(), name, fmt::format("expected a table, found {}", found_phrase(node)),
            allowed);
    }
    return table;
  }

  void check_policy(const toml::node& node, Config& config) {
    const auto* table =
        section(node, "policy", "[policy] with min_gpus, yield_to_foreign and reclaim_after_s");
    if (table == nullptr) return;
    for (auto&& [key, value] : *table) {
      if (key.str() == "yield_to_foreign") {
        if (const auto* flag = value.as_boolean())
          config.policy.yield_to_foreign = flag->get();
        else
          error(value.source(), "policy.yield_to_foreign",
                fmt::format("expected a boolean, found {}", found_phrase(value)), "true, false");
        continue;
      }
      if (key.str() == "reclaim_after_s") {
        check_seconds(value, "policy.reclaim_after_s", config.policy.reclaim_after,
                      "a positive number of seconds, at most 86400", 86400);
        continue;
      }
      if (key.str() != "min_gpus") {
        warn_unknown_nested("policy", key, {"min_gpus", "yield_to_foreign", "reclaim_after_s"});
        continue;
      }
      const std::string allowed =
          fmt::format("an integer from 0 to {} (the GPUs a config may name)", valid_.size());
      const auto* n = value.as_integer();
      if (n == nullptr)
        error(value.source(), "policy.min_gpus",
              fmt::format("expected an integer, found {}", found_phrase(value)), allowed);
      else if (n->get() < 0 || n->get() > static_cast<int64_t>(valid_.size()))
        error(value.source(), "policy.min_gpus", fmt::format("{} is out of range", n->get()),
              allowed);
      else
        config.policy.min_gpus = static_cast<int>(n->get());
    }
  }

  void check_notify(const toml::node& node, Config& config) {
    const auto* table =
        section(node, "notify", R"([notify] with command = "<shell command>" and timeout_s)");
    if (table == nullptr) return;
    for (auto&& [key, value] : *table) {
      if (key.str() == "command") {
        const auto* t = value.as_string();
        if (t == nullptr || t->get().empty() || t->get().find('\0') != std::string::npos)
          error(value.source(), "notify.command",
                t ? std::string("an empty command")
                  : fmt::format("expected a string, found {}", found_phrase(value)),
                "a shell command (run by /bin/sh -c, the event's JSON on stdin)");
        else
          config.notify.command = t->get();
      } else if (key.str() == "timeout_s") {
        check_seconds(value, "notify.timeout_s", config.notify.timeout,
                      "a positive number of seconds, at most 3600", 3600);
      } else {
        warn_unknown_nested("notify", key, {"command", "timeout_s"});
      }
    }
  }

  void check_park(const toml::node& node, Config& config) {
    const auto* table = section(
        node, "park", R"([park] with mode = "release" or "hold", and standby = true or false)");
    if (table == nullptr) return;
    for (auto&& [key, value] : *table) {
      if (key.str() == "standby") {
        if (const auto* flag = value.as_boolean())
          config.standby = flag->get();
        else
          error(value.source(), "park.standby",
                fmt::format("expected a boolean, found {}", found_phrase(value)), "true, false");
        continue;
      }
      if (key.str() != "mode") {
        warn_unknown_nested("park", key, {"mode", "standby"});
        continue;
      }
      const auto* text = value.as_string();
      if (text == nullptr) {
        error(value.source(), "park.mode",
              fmt::format("expected a string, found {}", found_phrase(value)), kParkAllowed);
      } else if (text->get() == "release") {
        config.park_mode = ParkMode::kRelease;
      } else if (text->get() == "hold") {
        config.park_mode = ParkMode::kHold;
      } else {
        error(value.source(), "park.mode",
              fmt::format("unknown park mode {}", quote_value(text->get())), kParkAllowed);
      }
    }
  }

  void check_boundary(const toml::node& node, Config& config) {
    const auto* table = section(
        node, "boundary",
        R"([boundary] with every = "epoch" or a positive integer, and deadline_s = a positive number of seconds)");
    if (table == nullptr) return;
    for (auto&& [key, value] : *table) {
      if (key.str() == "every") {
        check_every(value, config);
      } else if (key.str() == "deadline_s") {
        check_deadline(value, config);
      } else if (key.str() == "setup_deadline_s") {
        check_seconds(value, "boundary.setup_deadline_s", config.setup_deadline,
                      "a positive number of seconds (default 120)");
      } else {
        warn_unknown_nested("boundary", key, {"every", "deadline_s", "setup_deadline_s"});
      }
    }
  }

  void check_every(const toml::node& value, Config& config) {
    if (const auto* text = value.as_string()) {
      if (text->get() == "epoch") {
        config.boundary = BoundarySpec{};
      } else {
        error(value.source(), "boundary.every",
              fmt::format("unknown value {}", quote_value(text->get())), kEveryAllowed);
      }
    } else if (const auto* integer = value.as_integer()) {
      if (integer->get() > 0) {
        config.boundary = BoundarySpec{.every_epoch = false, .every_steps = integer->get()};
      } else {
        error(value.source(), "boundary.every",
              fmt::format("step count {} is not positive", integer->get()), kEveryAllowed);
      }
    } else {
      error(value.source(), "boundary.every",
            fmt::format(R"(expected "epoch" or an integer, found {})", found_phrase(value)),
            kEveryAllowed);
    }
  }

  void check_deadline(const toml::node& value, Config& config) {
    check_seconds(value, "boundary.deadline_s", config.boundary_deadline);
  }

  // A positive number of seconds (integer or float, at most `max_s`) into `out`, rounded up to
  // whole milliseconds.
  void check_seconds(const toml::node& value, std::string_view key, std::chrono::milliseconds& out,
                     std::string_view allowed = kDeadlineAllowed,
                     int64_t max_s = kMaxDeadlineSeconds) {
    double seconds = 0;
    std::string shown;
    if (const auto* integer = value.as_integer()) {
      seconds = static_cast<double>(integer->get());
      shown = fmt::format("{}", integer->get());
    } else if (const auto* real = value.as_floating_point()) {
      seconds = real->get();
      shown = float_text(real->get());
    } else {
      error(value.source(), key, fmt::format("expected a number, found {}", found_phrase(value)),
            allowed);
      return;
    }
    if (std::isnan(seconds) || seconds <= 0) {
      error(value.source(), key, fmt::format("{} is not positive", shown), allowed);
    } else if (seconds > static_cast<double>(max_s)) {
      error(value.source(), key, fmt::format("{} is larger than {} seconds", shown, max_s),
            allowed);
    } else {
      out = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
    }
  }

  void check_batch(const toml::node& node, Config& config) {
    const auto* table = section(node, "batch", "[batch] with global = a positive integer");
    if (table == nullptr) return;
    for (auto&& [key, value] : *table) {
      if (key.str() != "global") {
        warn_unknown_nested("batch", key, {"global"});
        continue;
      }
      const auto* integer = value.as_integer();
      if (integer == nullptr) {
        error(value.source(), "batch.global",
              fmt::format("expected an integer, found {}", found_phrase(value)), kGlobalAllowed);
      } else if (integer->get() <= 0) {
        error(value.source(), "batch.global", fmt::format("{} is not positive", integer->get()),
              kGlobalAllowed);
      } else if (integer->get() > kMaxGlobalBatch) {
        error(value.source(), "batch.global",
              fmt::format("{} is larger than {} samples per optimizer step", integer->get(),
                          kMaxGlobalBatch),
              kGlobalAllowed);
      } else {
        config.global_batch = integer->get();
      }
    }
  }

  // ---- [energy] (docs/energy.md) ----------------------------------------------------------
  /// A number (integer or float) under [energy], or nullopt after an error.
  std::optional<double> number(const toml::node& value, std::string_view key,
                               std::string_view allowed) {
    if (const auto* integer = value.as_integer()) return static_cast<double>(integer->get());
    if (const auto* real = value.as_floating_point()) {
      if (std::isfinite(real->get())) return real->get();
      error(value.source(), key, fmt::format("{} is not a finite number", float_text(real->get())),
            allowed);
      return std::nullopt;
    }
    error(value.source(), key, fmt::format("expected a number, found {}", found_phrase(value)),
          allowed);
    return std::nullopt;
  }

  std::optional<std::string> text(const toml::node& value, std::string_view key,
                                  std::string_view allowed) {
    if (const auto* t = value.as_string()) {
      if (!t->get().empty()) return t->get();
      error(value.source(), key, "is empty", allowed);
      return std::nullopt;
    }
    error(value.source(), key, fmt::format("expected a string, found {}", found_phrase(value)),
          allowed);
    return std::nullopt;
  }

  std::optional<int64_t> positive_int(const toml::node& value, std::string_view key,
                                      std::string_view allowed) {
    const auto* integer = value.as_integer();
    if (integer == nullptr) {
      error(value.source(), key, fmt::format("expected an integer, found {}", found_phrase(value)),
            allowed);
    } else if (integer->get() <= 0) {
      error(value.source(), key, fmt::format("{} is not positive", integer->get()), allowed);
    } else {
      return integer->get();
    }
    return std::nullopt;
  }

  /// [energy]'s monitor, window and Zeus cost keys: false when `k` is none of them.
  bool energy_monitor_key(std::string_view k, const toml::node& value, EnergyConfig& e) {
    if (k == "monitor") {
      if (const auto* b = value.as_boolean()) {
        e.monitor = b->get();
      } else {
        error(value.source(), "energy.monitor",
              fmt::format("expected true or false, found {}", found_phrase(value)), "true, false");
      }
    } else if (k == "period_s" || k == "window_s") {
      const bool period = k == "period_s";
      const std::string name = fmt::format("energy.{}", k);
      // Readings further apart than 5 s would leave window edges to extrapolation.
      const std::string_view allowed =
          period ? "a number of seconds from 0.01 to 5" : "a number of seconds from 1 to 86400";
      const double lo = period ? 0.01 : 1, hi = period ? 5 : 86400;
      if (auto v = number(value, name, allowed)) {
        if (*v < lo || *v > hi) {
          error(value.source(), name, fmt::format("{} is out of range", float_text(*v)), allowed);
        } else {
          (period ? e.period : e.window) =
              std::chrono::milliseconds(static_cast<int64_t>(std::ceil(*v * 1000.0)));
        }
      }
    } else if (k == "eta_knob") {
      if (auto v = number(value, "energy.eta_knob", "a number from 0 to 1")) {
        if (*v < 0 || *v > 1)
          error(value.source(), "energy.eta_knob",
                fmt::format("{} is outside [0, 1]", float_text(*v)), "a number from 0 to 1");
        else
          e.eta = *v == 0 ? 0.0 : *v;  // -0.0 is 0 (printed "η = 0", not "η = -0")
      }
    } else if (k == "cost_threshold") {
      if (auto v = number(value, "energy.cost_threshold", "a positive number of joules")) {
        if (*v <= 0)
          error(value.source(), "energy.cost_threshold",
                fmt::format("{} is not positive", float_text(*v)), "a positive number of joules");
        else
          e.cost_threshold_j = *v;
      }
    } else if (k == "cost_threshold_factor" || k == "beta_knob") {  // beta_knob: Zeus' name
      const std::string name = fmt::format("energy.{}", k);
      if (auto v = number(value, name, "a number >= 1")) {
        if (*v < 1)
          error(value.source(), name, fmt::format("{} is smaller than 1", float_text(*v)),
                "a number >= 1");
        else
          e.cost_threshold_factor = *v;
      }
    } else if (k == "history" || k == "job" || k == "profile_cache") {
      if (auto v = text(value, fmt::format("energy.{}", k), "a non-empty string"))
        (k == "history" ? e.history : k == "job" ? e.job : e.profile_cache) = *v;
    } else {
      return false;
    }
    return true;
  }

  /// [energy]'s power-limit profiler keys: false when `k` is none of them.
  bool energy_profile_key(std::string_view k, const toml::node& value, EnergyConfig& e) {
    if (k == "power_limit_watts") {
      constexpr std::string_view allowed = R"("auto" or a number of watts from 1 to 10000)";
      if (const auto* t = value.as_string()) {
        if (t->get() == "auto")
          e.auto_limit = true;
        else
          error(value.source(), "energy.power_limit_watts",
                fmt::format("unknown value {}", quote_value(t->get())), allowed);
      } else if (auto v = number(value, "energy.power_limit_watts", allowed)) {
        if (*v < 1 || *v > 10000)
          error(value.source(), "energy.power_limit_watts",
                fmt::format("{} is out of range", float_text(*v)), allowed);
        else
          e.power_limit_w = static_cast<unsigned>(std::lround(*v));
      }
    } else if (k == "profile_warmup_steps" || k == "profile_measure_steps") {
      const std::string name = fmt::format("energy.{}", k);
      if (auto v = positive_int(value, name, "a positive integer"))
        (k == "profile_warmup_steps" ? e.profile_warmup_steps : e.profile_measure_steps) = *v;
    } else if (k == "profile_cooldown_s" || k == "profile_settle_s") {
      const bool cool = k == "profile_cooldown_s";
      const std::string name = fmt::format("energy.{}", k);
      const std::string_view allowed =
          cool ? "a number of seconds from 0 (off) to 3600" : "a number of seconds from 0.1 to 600";
      const double lo = cool ? 0 : 0.1, hi = cool ? 3600 : 600;
      if (auto v = number(value, name, allowed)) {
        if (*v < lo || *v > hi)
          error(value.source(), name, fmt::format("{} is out of range", float_text(*v)), allowed);
        else
          (cool ? e.profile_cooldown_s : e.profile_settle_s) = *v == 0 ? 0.0 : *v;
      }
    } else if (k == "locked_clocks_mhz") {
      constexpr std::string_view allowed = "[min, max] or one number of MHz from 1 to 10000";
      std::vector<const toml::node*> parts;
      if (const auto* arr = value.as_array())
        for (const toml::node& el : *arr) parts.push_back(&el);
      else
        parts = {&value, &value};
      if (parts.size() != 2) {
        error(value.source(), "energy.locked_clocks_mhz",
              fmt::format("expected 2 numbers, found {}", parts.size()), allowed);
      } else {
        const auto lo = positive_int(*parts[0], "energy.locked_clocks_mhz", allowed);
        const auto hi = positive_int(*parts[1], "energy.locked_clocks_mhz", allowed);
        if (lo && hi && (*lo > *hi || *hi > 10000))
          error(value.source(), "energy.locked_clocks_mhz",
                *lo > *hi ? fmt::format("the minimum {} MHz is above the maximum {} MHz", *lo, *hi)
                          : fmt::format("{} MHz is out of range", *hi),
                allowed);
        else if (lo && hi)
          e.locked_clocks_mhz =
              std::make_pair(static_cast<unsigned>(*lo), static_cast<unsigned>(*hi));
      }
    } else {
      return false;
    }
    return true;
  }

  /// [energy]'s GPU-count (scale = "auto") keys: false when `k` is none of them.
  bool energy_scale_key(std::string_view k, const toml::node& value, EnergyConfig& e) {
    if (k == "scale") {
      const auto* t = value.as_string();
      if (t && (t->get() == "auto" || t->get() == "off"))
        e.auto_scale = t->get() == "auto";
      else
        error(value.source(), "energy.scale",
              t ? fmt::format("unknown value {}", quote_value(t->get()))
                : fmt::format("expected a string, found {}", found_phrase(value)),
              R"("auto", "off")");
    } else if (k == "allowed_gpus") {
      if (auto ids = gpu_ids(value, "energy.allowed_gpus")) {
        const auto* arr = value.as_array();
        if (arr && arr->empty())
          error(value.source(), "energy.allowed_gpus", "is empty",
                fmt::format("a list of ids from {}", valid_ids_text()));
        else if (!ids->empty())  // else every id was refused, each said by gpu_ids()
          e.allowed_gpus = std::move(*ids);
      }
    } else if (k == "scale_measure_epochs") {
      if (auto v = positive_int(value, "energy.scale_measure_epochs", "a positive integer"))
        e.scale_measure_epochs = *v;
    } else if (k == "scale_warmup_epochs" || k == "scale_recheck_epochs") {
      const std::string name = fmt::format("energy.{}", k);
      const auto* n = value.as_integer();
      if (n == nullptr || n->get() < 0)
        error(value.source(), name,
              n ? fmt::format("{} is negative", n->get())
                : fmt::format("expected an integer, found {}", found_phrase(value)),
              "an integer >= 0");
      else
        (k == "scale_warmup_epochs" ? e.scale_warmup_epochs : e.scale_recheck_epochs) = n->get();
    } else {
      return false;
    }
    return true;
  }

  void check_energy(const toml::node& node, Config& config) {
    const auto* table = section(node, "energy", "[energy] with the keys of docs/energy.md");
    if (table == nullptr) return;
    EnergyConfig& e = config.energy;
    e.present = true;
    std::optional<toml::source_region> settle_at;
    for (auto&& [key, value] : *table) {
      const std::string_view k = key.str();
      if (k == "profile_settle_s") settle_at = value.source();
      if (!energy_monitor_key(k, value, e) && !energy_profile_key(k, value, e) &&
          !energy_scale_key(k, value, e))
        warn_unknown_nested(
            "energy", key,
            {"monitor", "period_s", "window_s", "eta_knob", "cost_threshold",
             "cost_threshold_factor", "history", "job", "power_limit_watts", "profile_warmup_steps",
             "profile_measure_steps", "profile_cooldown_s", "profile_settle_s", "profile_cache",
             "scale", "allowed_gpus", "scale_warmup_epochs", "scale_measure_epochs",
             "scale_recheck_epochs"});
    }
    if (const toml::node* beta = table->get("beta_knob");
        beta && table->contains("cost_threshold_factor"))
      error(beta->source(), "energy.beta_knob",
            "is given beside cost_threshold_factor, its other name (Zeus' β)",
            "one of beta_knob and cost_threshold_factor");
    if (settle_at && e.profile_cooldown_s > 0 && e.profile_settle_s > e.profile_cooldown_s)
      warn(*settle_at,
           fmt::format("energy.profile_settle_s = {} s is longer than profile_cooldown_s = {} s: "
                       "no temperature can settle in time, so every cool-down waits the whole {} s",
                       float_text(e.profile_settle_s), float_text(e.profile_cooldown_s),
                       float_text(e.profile_cooldown_s)));
  }

  // A file without active_gpus means every slot: a misspelt or misplaced active_gpus there
  // would train on everything, so it is an error (an edit is then rejected and the last good
  // config stays in force), not a warning.
  static constexpr std::string_view kUnsetMeansAll =
      "this file sets no top-level active_gpus, which would mean every slot";

  void warn_unknown_top_level(const toml::key& key) {
    if (!sets_active_gpus_ && looks_like(key.str(), "active_gpus")) {
      error(key.source(), printable(key.str()),
            fmt::format("unknown key; did you mean 'active_gpus'? ({})", kUnsetMeansAll),
            "active_gpus = [ids] at the top level");
      return;
    }
    std::string text = fmt::format("unknown key '{}' (ignored)", printable(key.str()));
    for (const KnownKey& known : kTopLevelKeys) {
      if (looks_like(key.str(), known.name)) {
        text += fmt::format("; did you mean {}?", known.suggestion);
        break;
      }
    }
    warn(key.source(), text);
  }

  void warn_unknown_nested(std::string_view table, const toml::key& key,
                           std::initializer_list<std::string_view> known_here) {
    std::string text = fmt::format("unknown key '{}.{}' (ignored)", table, printable(key.str()));
    bool hinted = false;
    for (std::string_view known : known_here) {
      if (looks_like(key.str(), known)) {
        text += fmt::format("; did you mean '{}.{}'?", table, known);
        hinted = true;
        break;
      }
    }
    if (!hinted && key.str() == "active_gpus") {
      if (!sets_active_gpus_) {
        error(key.source(), fmt::format("{}.active_gpus", table),
              fmt::format("active_gpus is a top-level key but belongs to [{}] here ({})", table,
                          kUnsetMeansAll),
              "active_gpus = [ids] above the first [table] header");
        return;
      }
      text += fmt::format(
          "; active_gpus is a top-level key: move it above the first [table] header (here it "
          "belongs to [{}])",
          table);
    }
    warn(key.source(), text);
  }

  const std::string& source_;
  bool sets_active_gpus_ = false;  ///< the file has a top-level active_gpus key
  std::vector<int> valid_;
  Findings errors_;
  Findings warnings_;
};

}  // namespace

std::string describe(const Config& config) {
  const std::string gpus = config.active_gpus
                               ? fmt::format("[{}]", fmt::join(*config.active_gpus, ", "))
                               : std::string("all");
  const std::string boundary = config.boundary.every_epoch
                                   ? std::string("epoch")
                                   : fmt::format("{} steps", config.boundary.every_steps);
  const std::string batch =
      config.global_batch ? fmt::format("{}", *config.global_batch) : std::string("none");
  // setup_deadline_s only when set (the line stays as it was for the common case)
  const std::string setup =
      config.setup_deadline == Config{}.setup_deadline
          ? std::string()
          : fmt::format(" setup_deadline_s={}",
                        static_cast<double>(config.setup_deadline.count()) / 1000.0);
  // [policy] only when set, like setup_deadline_s
  std::string policy;
  if (config.policy.min_gpus > 0)
    policy += fmt::format(" policy.min_gpus={}", config.policy.min_gpus);
  if (config.policy.yield_to_foreign)
    policy += fmt::format(" policy.yield_to_foreign=true reclaim_after_s={}",
                          static_cast<double>(config.policy.reclaim_after.count()) / 1000.0);
  return fmt::format("active_gpus={} park={}{} boundary={} deadline_s={}{} batch.global={}{}", gpus,
                     to_string(config.park_mode), config.standby ? "" : " standby=off", boundary,
                     static_cast<double>(config.boundary_deadline.count()) / 1000.0, setup, batch,
                     policy);
}

Config parse_config(std::string_view text, const std::string& source,
                    const std::vector<int>& valid_gpu_ids) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}:{}: syntax error: {}", source, e.source().begin.line,
                                  e.source().begin.column, e.description()));
  }
  return Validator(source, valid_gpu_ids).run(root);
}

Config load_config(const std::filesystem::path& path, const std::vector<int>& valid_gpu_ids) {
  try {
    const FileContent file = read_regular_file(path, kMaxConfigBytes, "the config file");
    return parse_config(file.bytes, path.string(), valid_gpu_ids);
  } catch (const FileError& e) {
    throw ConfigError(e.what());
  }
}

}  // namespace gpurun::control
