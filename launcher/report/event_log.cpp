#include "report/event_log.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "gpurun/error.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::report::detail {

namespace fs = std::filesystem;
namespace json = boost::json;

/// Longest line read_log takes: gpurun writes records of at most 64 KiB.
constexpr size_t kMaxLogLineBytes = size_t{1} << 20;

namespace {

/// Where a record came from, for messages: "run.jsonl:12: `energy_epoch` event: ...".
struct Where {
  const std::string& file;
  size_t line;
  std::string event;
  std::string operator()(std::string_view what) const {
    return event.empty() ? fmt::format("{}:{}: {}", file, line, what)
                         : fmt::format("{}:{}: `{}` event: {}", file, line, event, what);
  }
};

std::string_view kind_name(const json::value& v) {
  return v.is_null() ? "null" : json::to_string(v.kind());
}

const json::value& field(const json::object& o, std::string_view key, const Where& at) {
  const auto* v = o.if_contains(key);
  if (!v) throw Error(at(fmt::format("field `{}` is missing", key)));
  return *v;
}

double number(const json::value& v, std::string_view key, const Where& at) {
  if (v.is_double()) return v.get_double();
  if (v.is_int64()) return static_cast<double>(v.get_int64());
  if (v.is_uint64()) return static_cast<double>(v.get_uint64());
  throw Error(at(fmt::format("field `{}` must be a number, got {}", key, kind_name(v))));
}

double number(const json::object& o, std::string_view key, const Where& at) {
  return number(field(o, key, at), key, at);
}

/// Missing or null: nullopt.
std::optional<double> optional_number(const json::object& o, std::string_view key,
                                      const Where& at) {
  const auto* v = o.if_contains(key);
  if (!v || v->is_null()) return std::nullopt;
  return number(*v, key, at);
}

/// A length of time (s): a number of 0 or more (a negative one would draw a bar backwards).
double duration_s(const json::object& o, std::string_view key, const Where& at) {
  const double d = number(o, key, at);
  if (!(d >= 0)) throw Error(at(fmt::format("field `{}` must be 0 s or more, got {}", key, d)));
  if (!std::isfinite(d))  // 1e400 parses as infinity
    throw Error(at(fmt::format("field `{}` must be a finite number of seconds, got {}", key, d)));
  return d;
}

long integer(const json::object& o, std::string_view key, const Where& at) {
  const double d = number(o, key, at);
  if (d != static_cast<double>(static_cast<long>(d)))
    throw Error(at(fmt::format("field `{}` must be a whole number, got {}", key, d)));
  return static_cast<long>(d);
}

std::string string(const json::object& o, std::string_view key, const Where& at) {
  const auto& v = field(o, key, at);
  if (!v.is_string())
    throw Error(at(fmt::format("field `{}` must be a string, got {}", key, kind_name(v))));
  return std::string(v.get_string());
}

int slot_of(std::string_view text, const Where& at) {
  int v = 0;
  if (text.size() > 6 || !all_digits(text))
    throw Error(at(fmt::format("`gpu_energy_j` key '{}' is not a slot number", text)));
  for (char c : text) v = v * 10 + (c - '0');
  return v;
}

void add_energy_epoch(Run& run, const json::object& o, const Where& at) {
  Row r;
  r.epoch = integer(o, "epoch", at);
  if (auto a = optional_number(o, "attempt", at)) r.attempt = static_cast<long>(*a);
  r.seconds = duration_s(o, "seconds", at);
  r.energy_j = number(o, "energy_j", at);
  r.active = number(o, "active_gpus", at);
  r.cost = number(o, "cost", at);
  r.cost_total = number(o, "cost_total", at);
  r.avg_power_w = r.seconds > 0 ? r.energy_j / r.seconds : 0;
  const auto& g = field(o, "gpu_energy_j", at);
  if (!g.is_object())
    throw Error(at(
        fmt::format("field `gpu_energy_j` must be an object (slot -> J), got {}", kind_name(g))));
  for (const auto& kv : g.get_object())
    r.gpu_j[slot_of(kv.key(), at)] = number(kv.value(), "gpu_energy_j", at);
  if (auto t = optional_number(o, "threshold", at)) run.threshold = t;
  run.epochs.push_back(std::move(r));
}

void add_energy_window(Run& run, const json::object& o, const Where& at) {
  Row r;
  r.seconds = duration_s(o, "seconds", at);
  r.energy_j = number(o, "energy_j", at);
  r.cost = number(o, "cost", at);
  r.avg_power_w = r.seconds > 0 ? r.energy_j / r.seconds : 0;
  const auto& active = field(o, "active", at);
  if (!active.is_array())
    throw Error(
        at(fmt::format("field `active` must be an array of slots, got {}", kind_name(active))));
  r.active = static_cast<double>(active.get_array().size());
  const auto& gpus = field(o, "gpus", at);
  if (!gpus.is_array())
    throw Error(at(fmt::format("field `gpus` must be an array, got {}", kind_name(gpus))));
  for (const auto& g : gpus.get_array()) {
    if (!g.is_object())
      throw Error(at(fmt::format("`gpus` entries must be objects, got {}", kind_name(g))));
    r.gpu_j[static_cast<int>(integer(g.get_object(), "slot", at))] +=
        number(g.get_object(), "energy_j", at);
  }
  // Start: t0 relative to the first window; without t0, right after the previous window.
  const auto t0 = optional_number(o, "t0", at);
  if (run.windows.empty()) run.first_t0 = t0.value_or(0);
  r.start_s =
      t0 ? *t0 - run.first_t0
         : (run.windows.empty() ? 0 : run.windows.back().start_s + run.windows.back().seconds);
  r.cost_total = (run.windows.empty() ? 0 : run.windows.back().cost_total) + r.cost;
  run.windows.push_back(std::move(r));
}

void add_record(Run& run, const json::object& o, const std::string& file, size_t line) {
  const Where at0{file, line, ""};
  const auto* ev = o.if_contains("event");
  if (!ev || !ev->is_string()) throw Error(at0("the record has no string field `event`"));
  const Where at{file, line, std::string(ev->get_string())};
  const std::string& e = at.event;
  if (e == "start") {
    if (!run.epochs.empty() || !run.windows.empty() || !run.profile.empty() || !run.scale.empty()) {
      const int runs = run.runs + 1;
      run = Run{};
      run.runs = runs;
      run.run_line = line;
    }
  } else if (e == "energy_epoch") {
    add_energy_epoch(run, o, at);
  } else if (e == "energy") {
    add_energy_window(run, o, at);
  } else if (e == "power_profile") {
    run.profile.push_back({number(o, "limit_w", at), number(o, "steps_per_s", at),
                           number(o, "avg_power_w", at), number(o, "cost_per_step", at)});
  } else if (e == "power_limit") {
    const double limit = number(o, "limit_w", at);
    std::string source = string(o, "source", at);
    // "profiling" limits are trials, "restore" gives the GPU its old limit back.
    if (source != "profiling" && source != "restore") {
      run.chosen_limit_w = limit;
      run.chosen_source = std::move(source);
    }
  } else if (e == "scale_profile") {
    run.scale.push_back({static_cast<int>(integer(o, "gpus", at)), number(o, "seconds", at),
                         number(o, "energy_j", at), number(o, "cost", at)});
  } else if (e == "scale_choice") {
    run.scale_choice = static_cast<int>(integer(o, "gpus", at));
  } else if (e == "early_stop") {
    run.stop_epoch = integer(o, "epoch", at);
    const auto* reason = o.if_contains("reason");
    run.stop_reason = reason && reason->is_string() ? std::string(reason->get_string()) : "";
    if (auto t = optional_number(o, "threshold", at)) run.threshold = t;
  }
}

}  // namespace

/// Reads `path` line by line. A line that is not a JSON object throws Error naming
/// path:line:column — except an unterminated last line (a killed run), which only warns.
Run read_log(const std::string& path) {
  // A FIFO, /dev/zero or a directory is refused before a byte is read (read_regular_file's
  // checks); a regular file is streamed, each line at most kMaxLogLineBytes.
  std::optional<RegularFile> file;
  try {
    file = open_regular_file(path, "the event log");
  } catch (const FileError& e) {
    throw Error(e.what());
  }
  const int fd = file->fd.get();
  Run run;
  std::string text;
  size_t line = 0;
  std::string buffer;
  size_t start = 0;
  bool at_end = false;
  bool unterminated = false;
  // The next line into `text` (without its '\n'); false at the end.
  const auto next_line = [&]() -> bool {
    while (true) {
      const size_t nl = buffer.find('\n', start);
      if (nl != std::string::npos) {
        text.assign(buffer, start, nl - start);
        start = nl + 1;
        return true;
      }
      if (buffer.size() - start > kMaxLogLineBytes)
        throw Error(
            fmt::format("{}:{}: the line is more than the limit of {} bytes: not an "
                        "event log",
                        path, line + 1, kMaxLogLineBytes));
      if (at_end) {
        if (start == buffer.size()) return false;
        text.assign(buffer, start);
        start = buffer.size();
        unterminated = true;
        return true;
      }
      buffer.erase(0, start);
      start = 0;
      char chunk[65536];
      const ssize_t n = ::read(fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        throw Error(fmt::format("reading the event log {} failed: {}", path, std::strerror(errno)));
      if (n == 0) at_end = true;
      buffer.append(chunk, static_cast<size_t>(n > 0 ? n : 0));
    }
  };
  while (next_line()) {
    ++line;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    json::stream_parser p;
    boost::system::error_code jec;
    const size_t used = p.write(text.data(), text.size(), jec);
    if (!jec) p.finish(jec);
    if (jec) {
      const size_t column = std::min(used, text.size()) + 1;
      if (unterminated) {
        std::fprintf(stderr,
                     "gpurun report: warning: %s:%zu: ignoring the truncated last line (%s at "
                     "column %zu; was the run killed while writing it?)\n",
                     path.c_str(), line, jec.message().c_str(), column);
        break;
      }
      throw Error(fmt::format("{}:{}:{}: the line is not valid JSON ({})", path, line, column,
                              jec.message()));
    }
    const json::value v = p.release();
    if (!v.is_object())
      throw Error(fmt::format("{}:{}: the line is a JSON {}, not an event object", path, line,
                              kind_name(v)));
    add_record(run, v.get_object(), path, line);
  }
  return run;
}

}  // namespace gpurun::report::detail
