#include "energy/early_stop.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "gpurun/error.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::energy {

namespace {

using detail::json_number;

std::string slot_map_json(const std::map<int, double>& m) {
  std::string out = "{";
  for (const auto& [slot, j] : m) {
    if (out.size() > 1) out += ", ";
    out += fmt::format("\"{}\": {}", slot, json_number(j));
  }
  return out + "}";
}

// "2.0" for a whole factor (as users write β), else the shortest form ("1.25").
std::string format_factor(double f) {
  return f == std::floor(f) ? fmt::format("{:.1f}", f) : fmt::format("{}", f);
}

}  // namespace

std::string format_joules(double j, int decimals) {
  if (std::isfinite(j) && std::abs(j) < 1e12) return fmt::format("{:.{}f}", j, decimals);
  return fmt::format("{:.6g}", j);
}

std::string EpochRecord::to_json_fields(std::optional<double> threshold_j) const {
  std::string out = fmt::format("{{\"epoch\": {}", epoch);
  out += ", \"seconds\": " + json_number(seconds);
  out += ", \"energy_j\": " + json_number(energy_j);
  out += ", \"gpu_energy_j\": " + slot_map_json(gpu_energy_j);
  out += ", \"active_gpus\": " + json_number(active_gpus);
  out += ", \"max_power_w\": " + json_number(max_power_w);
  out += ", \"cost\": " + json_number(cost);
  out += ", \"cost_total\": " + json_number(cost_total);
  out += ", \"predicted_next_cost\": " + json_number(predicted_next_cost);
  out += ", \"threshold\": " + (threshold_j ? json_number(*threshold_j) : std::string("null"));
  return out + "}";
}

void CostTracker::add_window(const WindowRecord& w) {
  const double s = w.seconds();
  open_.seconds += s;
  open_.energy_j += w.energy_j;
  open_.cost += w.cost;
  open_.gpu_seconds += static_cast<double>(w.active.size()) * s;
  open_.max_power_ws += w.max_power_w * s;
  for (const GpuWindow& g : w.gpus) open_.gpu_energy_j[g.slot] += g.energy_j;
  if (s > 0) {  // a zero-length window does not make an epoch mixed
    Config c{w.active, w.power_limit_w};
    bool seen = false;
    for (const Config& have : open_.configs) seen = seen || have == c;
    if (!seen) open_.configs.push_back(std::move(c));
  }
}

EpochRecord CostTracker::end_epoch(int64_t epoch) {
  EpochRecord r;
  r.epoch = epoch;
  r.seconds = open_.seconds;
  r.energy_j = open_.energy_j;
  r.gpu_energy_j = open_.gpu_energy_j;
  r.active_gpus = open_.seconds > 0 ? open_.gpu_seconds / open_.seconds : 0.0;
  r.max_power_w = open_.seconds > 0 ? open_.max_power_ws / open_.seconds : 0.0;
  r.cost = open_.cost;
  cost_total_ += r.cost;
  r.cost_total = cost_total_;

  finished_.seconds += r.seconds;
  finished_.energy_j += r.energy_j;
  finished_.cost += r.cost;
  finished_.epochs += 1;
  for (const auto& [slot, j] : r.gpu_energy_j) finished_.gpu_energy_j[slot] += j;

  epoch_config_.push_back(open_.configs.size() == 1 ? std::optional<Config>(open_.configs[0])
                                                    : std::nullopt);
  if (epoch_config_.back()) r.steady_active = epoch_config_.back()->active;
  epochs_.push_back(r);
  open_ = Open{};
  r.predicted_next_cost = predicted_next_cost();
  epochs_.back().predicted_next_cost = r.predicted_next_cost;
  return r;
}

void CostTracker::abandon_epoch() {
  cost_total_ += open_.cost;
  finished_.seconds += open_.seconds;
  finished_.energy_j += open_.energy_j;
  finished_.cost += open_.cost;
  for (const auto& [slot, j] : open_.gpu_energy_j) finished_.gpu_energy_j[slot] += j;
  open_ = Open{};
}

double CostTracker::predicted_next_cost() const {
  if (epochs_.empty()) return 0.0;
  const std::optional<Config>& last = epoch_config_.back();
  if (!last) return epochs_.back().cost;  // mixed: only the last epoch says anything
  double sum = 0;
  int n = 0;
  for (std::size_t i = epochs_.size(); i-- > 0;) {
    if (epoch_config_[i] != last) break;
    sum += epochs_[i].cost;
    ++n;
  }
  return sum / n;
}

CostSummary CostTracker::summary() const {
  CostSummary s = finished_;
  s.seconds += open_.seconds;
  s.energy_j += open_.energy_j;
  s.cost += open_.cost;
  for (const auto& [slot, j] : open_.gpu_energy_j) s.gpu_energy_j[slot] += j;
  return s;
}

std::optional<std::string> CostTracker::stop_reason(const CostThreshold& threshold) const {
  if (epochs_.empty()) return std::nullopt;
  const double predicted = predicted_next_cost();
  const double total = cost_total_ + predicted;
  if (!(total > threshold.cost_j)) return std::nullopt;
  return fmt::format(
      "the predicted total cost after epoch {} ({} J) would pass the threshold ({} J{}): "
      "{} J so far + {} J predicted for the next epoch",
      epochs_.back().epoch + 2, format_joules(total), format_joules(threshold.cost_j),
      threshold.origin.empty() ? std::string() : " = " + threshold.origin,
      format_joules(cost_total_), format_joules(predicted));
}

std::optional<double> best_cost(const std::filesystem::path& history, const std::string& job) {
  // A FIFO must not hang the job's start, nor /dev/zero grow it: read_regular_file.
  std::optional<FileContent> file;
  try {
    file = read_regular_file_if_exists(history, kMaxHistoryBytes, "the energy history");
  } catch (const FileError& e) {
    throw Error(fmt::format(
        "the energy history {} ([energy] history) cannot be read: {}; name a JSON-lines file "
        "(at most {} MiB), or start a new one",
        history.string(), e.problem(), kMaxHistoryBytes >> 20));
  }
  if (!file) return std::nullopt;
  const std::string& text = file->bytes;
  std::istringstream in(text);
  std::optional<double> best;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", history.string(), lineno);
    boost::system::error_code ec;
    boost::json::value v = boost::json::parse(line, ec);
    if (ec) throw Error(fmt::format("{}: not a JSON line ({})", where, ec.message()));
    const boost::json::object* o = v.if_object();
    if (!o) throw Error(fmt::format("{}: expected a JSON object (a history entry)", where));
    const boost::json::value* j = o->if_contains("job");
    const boost::json::value* c = o->if_contains("cost");
    const boost::json::value* done = o->if_contains("completed");
    if (!j || !j->is_string())
      throw Error(fmt::format("{}: \"job\" is missing or not a string", where));
    if (!c || !c->is_number() || !std::isfinite(c->to_number<double>()))
      throw Error(fmt::format("{}: \"cost\" is missing or not a finite number", where));
    if (!done || !done->is_bool())
      throw Error(fmt::format("{}: \"completed\" is missing or not true/false", where));
    if (j->get_string() != job || !done->get_bool()) continue;
    const double cost = c->to_number<double>();
    if (!best || cost < *best) best = cost;
  }
  return best;
}

void append_history(const std::filesystem::path& history, const HistoryEntry& e) {
  std::string line = "{\"job\": " + detail::json_string(e.job);
  line += ", \"cost\": " + json_number(e.cost);
  line += ", \"energy_j\": " + json_number(e.energy_j);
  line += ", \"seconds\": " + json_number(e.seconds);
  line += fmt::format(", \"epochs\": {}, \"completed\": {}}}\n", e.epochs, e.completed);
  // O_NONBLOCK: a FIFO without a reader must not hang gpurun's exit.
  const int fd =
      ::open(history.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) {
    throw Error(fmt::format("cannot open the energy history {} for appending: {}", history.string(),
                            std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format(
        "the energy history {} ([energy] history) is not a regular file but {}: this run is not "
        "appended to it",
        history.string(), file_type_name(st.st_mode)));
  }
  ssize_t n;
  do {
    n = ::write(fd, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
  const int write_errno = errno;
  const bool closed = ::close(fd) == 0;
  if (n != static_cast<ssize_t>(line.size())) {
    throw Error(fmt::format("cannot append to the energy history {}: {}", history.string(),
                            n < 0 ? std::strerror(write_errno) : "short write (disk full?)"));
  }
  if (!closed) {
    throw Error(fmt::format("cannot append to the energy history {}: close: {}", history.string(),
                            std::strerror(errno)));
  }
}

std::optional<CostThreshold> threshold_from(std::optional<double> absolute_j, double factor,
                                            std::optional<double> best,
                                            const std::string& history_name) {
  if (absolute_j) return CostThreshold{*absolute_j, {}};
  if (best && std::isfinite(factor) && factor > 0) {
    return CostThreshold{factor * *best,
                         fmt::format("{} × best {} J from {}", format_factor(factor),
                                     format_joules(*best), history_name)};
  }
  return std::nullopt;
}

}  // namespace gpurun::energy
