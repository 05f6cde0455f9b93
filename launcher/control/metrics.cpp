#include "control/metrics.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "gpurun/control/node_messages.hpp"

namespace gpurun::control {

namespace json = boost::json;

namespace {

/// A label value as the text format wants it: \\, \" and \n escaped.
std::string escape_label(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

/// A sample value: shortest round-trip text; NaN and ±Inf as the format spells them.
std::string value_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

using Labels = std::vector<std::pair<std::string, std::string>>;

/// The text of one metric family: HELP and TYPE once, then each sample.
class Family {
 public:
  Family(std::string& out, std::string_view name, std::string_view type, std::string_view help)
      : out_(out), name_(name) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const Labels& labels, double value, std::string_view suffix = {}) {
    out_ += name_;
    out_ += suffix;
    if (!labels.empty()) {
      out_ += '{';
      for (size_t i = 0; i < labels.size(); ++i)
        out_ += fmt::format("{}{}=\"{}\"", i ? "," : "", labels[i].first,
                            escape_label(labels[i].second));
      out_ += '}';
    }
    out_ += ' ';
    out_ += value_text(value);
    out_ += '\n';
  }

 private:
  std::string& out_;
  std::string name_;
};

/// A slot's identity labels: job, slot, node, and for this node's monitored GPUs DCGM
/// exporter's gpu, UUID, modelName and Hostname (another node's slot gets none of this node's).
Labels slot_labels(const MetricsSnapshot& snap, int slot) {
  Labels l{
      {"job", snap.job}, {"slot", std::to_string(slot)}, {"node", std::to_string(slot_node(slot))}};
  if (slot_node(slot) != 0) return l;
  if (auto it = snap.gpus.find(slot); it != snap.gpus.end()) {
    if (it->second.index >= 0) l.emplace_back("gpu", std::to_string(it->second.index));
    if (!it->second.uuid.empty()) l.emplace_back("UUID", it->second.uuid);
    if (!it->second.model.empty()) l.emplace_back("modelName", it->second.model);
  }
  if (!snap.hostname.empty()) l.emplace_back("Hostname", snap.hostname);
  return l;
}

Labels with(Labels l, std::string key, std::string value) {
  l.emplace_back(std::move(key), std::move(value));
  return l;
}

bool has(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

bool has_kind(const std::vector<std::string>& kinds, const std::string& k) {
  return std::find(kinds.begin(), kinds.end(), k) != kinds.end();
}

void render_slots(std::string& out, const MetricsSnapshot& snap) {
  std::map<int, Labels> labels;
  for (const SlotStatus& s : snap.run.slots) labels[s.gpu] = slot_labels(snap, s.gpu);
  {
    Family f(out, "gpurun_slot_state", "gauge",
             "Whether the GPU slot is in this state (1) or not (0): starting, active, "
             "offloading, rejoining, warming, standby, parked, lent, yielded, paused, exited, "
             "failed.");
    for (const SlotStatus& s : snap.run.slots) {
      const std::string now = metrics_slot_state(s, snap);
      for (const std::string& state : metrics_slot_states())
        f.sample(with(labels[s.gpu], "state", state), state == now ? 1 : 0);
    }
  }
  {
    Family f(out, "gpurun_slot_rank", "gauge",
             "The slot's rank in the current generation; -1 when it has none.");
    for (const SlotStatus& s : snap.run.slots) f.sample(labels[s.gpu], s.rank);
  }
  {
    Family f(out, "gpurun_slot_info", "gauge",
             "Always 1: the slot's identity with its rank and state as labels, to join on "
             "(UUID, gpu) with DCGM exporter's series.");
    for (const SlotStatus& s : snap.run.slots)
      f.sample(with(with(labels[s.gpu], "rank", std::to_string(s.rank)), "state",
                    metrics_slot_state(s, snap)),
               1);
  }
  if (!snap.energy) return;
  const std::map<int, SlotEnergyStatus>& e = snap.energy->slots;
  const auto each = [&](Family& f, auto value) {
    for (const auto& [slot, se] : e) {
      const std::optional<double> v = value(se);
      if (!v) continue;
      auto it = labels.find(slot);
      f.sample(it != labels.end() ? it->second : slot_labels(snap, slot), *v);
    }
  };
  {
    Family f(out, "gpurun_gpu_energy_joules_total", "counter",
             "Energy the GPU drew while the job trained on it (charged time: the event log's "
             "energy windows, plus the open window), joules.");
    each(f, [](const SlotEnergyStatus& s) { return std::optional<double>(s.job_energy_j); });
  }
  {
    Family f(out, "gpurun_gpu_epoch_energy_joules", "gauge",
             "Energy charged to the job on the GPU since the current epoch began, joules.");
    each(f, [](const SlotEnergyStatus& s) { return std::optional<double>(s.epoch_energy_j); });
  }
  {
    Family f(out, "gpurun_gpu_power_watts", "gauge", "The GPU's last power reading, watts.");
    each(f, [](const SlotEnergyStatus& s) { return std::optional<double>(s.power_w); });
  }
  {
    Family f(out, "gpurun_gpu_power_limit_watts", "gauge",
             "The power limit gpurun set on the GPU, watts (absent: gpurun left it unchanged).");
    each(f, [](const SlotEnergyStatus& s) {
      return s.power_limit_w ? std::optional<double>(*s.power_limit_w) : std::nullopt;
    });
  }
}

void render_resizes(std::string& out, const MetricsSnapshot& snap, const ResizeMetrics& r) {
  const Labels job{{"job", snap.job}};
  const ResizeMetrics::Kind none{0, 0, std::vector<uint64_t>(ResizeMetrics::buckets().size())};
  const auto kind = [&](const std::string& k) -> const ResizeMetrics::Kind& {
    auto it = r.by_kind().find(k);
    return it != r.by_kind().end() ? it->second : none;
  };
  std::vector<std::string> kinds = ResizeMetrics::kinds();
  for (const auto& [k, unused] : r.by_kind())
    if (!has_kind(kinds, k)) kinds.push_back(k);
  {
    Family f(out, "gpurun_resizes_total", "counter",
             "Resizes by kind (grow, shrink, swap, pause, resume, recovery, resize): the event "
             "log's resize events.");
    for (const std::string& k : kinds) f.sample(with(job, "kind", k), kind(k).count);
  }
  {
    Family f(out, "gpurun_resize_duration_seconds", "histogram",
             "Each resize's time from its origin (the config seen, or the decision) to training "
             "again (a pause: the last leaver gone): the resize event's total_ms, seconds.");
    for (const std::string& k : kinds) {
      const ResizeMetrics::Kind& c = kind(k);
      const Labels l = with(job, "kind", k);
      for (size_t i = 0; i < ResizeMetrics::buckets().size(); ++i)
        f.sample(with(l, "le", value_text(ResizeMetrics::buckets()[i])), c.bucket_count[i],
                 "_bucket");
      f.sample(with(l, "le", "+Inf"), c.count, "_bucket");
      f.sample(l, c.sum_s, "_sum");
      f.sample(l, c.count, "_count");
    }
  }
  {
    Family f(out, "gpurun_resize_phase_seconds_total", "counter",
             "Time of each resize phase (the resize event's phases_ms: decision, spawned, ready, "
             "comm, state, checksum, resumed, ...), summed over every resize, seconds.");
    for (const auto& [phase, s] : r.phase_seconds()) f.sample(with(job, "phase", phase), s);
  }
}

void render_energy(std::string& out, const MetricsSnapshot& snap) {
  if (!snap.energy) return;
  const Labels job{{"job", snap.job}};
  const EnergyStatus& e = *snap.energy;
  Family(out, "gpurun_energy_epochs_total", "counter", "Epochs the energy monitor finished.")
      .sample(job, static_cast<double>(e.epochs));
  Family(out, "gpurun_energy_cost_joules_total", "counter",
         "Zeus cost of the finished epochs, eta * E + (1 - eta) * MaxPower * T, joules.")
      .sample(job, e.cost_total_j);
  Family(out, "gpurun_energy_predicted_next_epoch_cost_joules", "gauge",
         "Zeus cost the next epoch is predicted to have (0 before the first epoch), joules.")
      .sample(job, e.predicted_next_cost_j);
  if (e.threshold_j)
    Family(out, "gpurun_energy_cost_threshold_joules", "gauge",
           "The early-stop threshold: the job stops when cost plus the predicted next epoch's "
           "would pass it, joules.")
        .sample(job, *e.threshold_j);
  Family(out, "gpurun_energy_early_stopped", "gauge",
         "1 once the energy monitor stopped the job early by its cost threshold, else 0.")
      .sample(job, e.stopped_early ? 1 : 0);
}

}  // namespace

const std::vector<std::string>& metrics_slot_states() {
  static const std::vector<std::string> states{"starting", "active",  "offloading", "rejoining",
                                               "warming",  "standby", "parked",     "lent",
                                               "yielded",  "paused",  "exited",     "failed"};
  return states;
}

std::string metrics_slot_state(const SlotStatus& s, const MetricsSnapshot& snap) {
  if (s.state == SlotState::kParked || s.state == SlotState::kStandby) {
    if (has(snap.lent, s.gpu)) return "lent";
    if (has(snap.yielded, s.gpu)) return "yielded";
    if (snap.run.elastic && snap.run.current_active.empty() && snap.run.desired_active.empty())
      return "paused";
  }
  std::string name(to_string(s.state));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name;
}

const std::vector<double>& ResizeMetrics::buckets() {
  static const std::vector<double> b{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
  return b;
}

const std::vector<std::string>& ResizeMetrics::kinds() {
  static const std::vector<std::string> k{"grow",   "shrink",   "swap",  "pause",
                                          "resume", "recovery", "resize"};
  return k;
}

void ResizeMetrics::on_event(std::string_view event, const std::string& record) {
  if (event != "resize") return;
  json::error_code ec;
  const json::value v = json::parse(record, ec);
  const json::object* o = ec ? nullptr : v.if_object();
  const json::value* kind = o ? o->if_contains("kind") : nullptr;
  const json::value* total = o ? o->if_contains("total_ms") : nullptr;
  if (!kind || !kind->is_string() || !total || !total->is_number()) {
    ++bad_;
    return;
  }
  const double s = total->to_number<double>() / 1000.0;
  Kind& k = kinds_[std::string(kind->as_string())];
  if (k.bucket_count.empty()) k.bucket_count.assign(buckets().size(), 0);
  ++k.count;
  k.sum_s += s;
  for (size_t i = 0; i < buckets().size(); ++i)
    if (s <= buckets()[i]) ++k.bucket_count[i];
  if (const json::value* p = o->if_contains("phases_ms"); p && p->is_object())
    for (const auto& [mark, ms] : p->as_object())
      if (ms.is_number()) phases_[std::string(mark)] += ms.to_number<double>() / 1000.0;
}

double StepRate::observe(uint64_t steps, uint64_t time_ns, uint64_t now_ns) {
  const auto window_ns = static_cast<uint64_t>(window_s_ * 1e9);
  if (time_ns != 0 && (points_.empty() || time_ns > points_.back().first)) {
    if (!points_.empty() && steps < points_.back().second) points_.clear();  // a restart
    points_.emplace_back(time_ns, steps);
  }
  while (points_.size() > 2 && points_[1].first + window_ns <= points_.back().first)
    points_.pop_front();
  if (points_.size() < 2 || points_.back().first + window_ns <= now_ns) return 0;
  const auto& [t0, s0] = points_.front();
  const auto& [t1, s1] = points_.back();
  return static_cast<double>(s1 - s0) / (static_cast<double>(t1 - t0) / 1e9);
}

std::string render_metrics(const MetricsSnapshot& snap, const ResizeMetrics& resizes) {
  std::string out;
  out.reserve(8192);
  const Labels job{{"job", snap.job}};
  Family(out, "gpurun_generation", "gauge",
         "The job's generation: it grows by one at each resize (0 for a plain run).")
      .sample(job, static_cast<double>(snap.run.generation));
  Family(out, "gpurun_world_size", "gauge",
         "Processes training now: the active set's size (elastic), the world size (plain run).")
      .sample(job, snap.world_size);
  render_slots(out, snap);
  render_resizes(out, snap, resizes);
  if (snap.steps) {
    Family(out, "gpurun_steps_total", "counter",
           "The highest global optimizer step a worker published (the progress file).")
        .sample(job, static_cast<double>(snap.steps->steps));
    Family(out, "gpurun_step_rate", "gauge",
           "Optimizer steps per second over the last 10 s of published steps; 0 when none.")
        .sample(job, snap.steps->rate);
  }
  render_energy(out, snap);
  return out;
}

}  // namespace gpurun::control
