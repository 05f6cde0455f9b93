#include "energy/cost.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/json.hpp>

#include "gpurun/check.hpp"

namespace gpurun::energy {

namespace detail {

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{}", v);  // shortest representation that reads back to v
}

std::string json_string(const std::string& s) {
  return boost::json::serialize(boost::json::value(s));
}

}  // namespace detail

double zeus_cost(double energy_j, double seconds, double max_power_w, double eta) {
  GPURUN_CHECK(eta >= 0.0 && eta <= 1.0, "eta {} is outside [0, 1]", eta);
  return eta * energy_j + (1.0 - eta) * max_power_w * seconds;
}

std::string WindowRecord::to_json_fields() const {
  using detail::json_number;
  std::string out = "{\"kind\": " + detail::json_string(kind);
  out += fmt::format(", \"generation\": {}, \"epoch\": {}, \"step\": {}", generation, epoch, step);
  out += ", \"t0\": " + json_number(t0_s) + ", \"t1\": " + json_number(t1_s);
  out += ", \"seconds\": " + json_number(seconds());
  out += fmt::format(", \"active\": [{}]", fmt::join(active, ", "));
  out += ", \"gpus\": [";
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    const GpuWindow& g = gpus[i];
    if (i) out += ", ";
    out += fmt::format(
        "{{\"slot\": {}, \"energy_j\": {}, \"power_integral_j\": {}, \"avg_power_w\": {}}}", g.slot,
        json_number(g.energy_j), json_number(g.power_integral_j), json_number(g.avg_power_w));
  }
  out += "]";
  out += ", \"energy_j\": " + json_number(energy_j);
  out += ", \"avg_power_w\": " + json_number(avg_power_w);
  out += ", \"max_power_w\": " + json_number(max_power_w);
  out += ", \"eta\": " + json_number(eta);
  out += ", \"cost\": " + json_number(cost);
  out += ", \"power_limit_w\": " + (power_limit_w ? std::to_string(*power_limit_w) : "null");
  out += "}";
  return out;
}

WindowRecord account_window(const std::string& kind, int64_t generation, int64_t epoch,
                            int64_t step, double t0_s, double t1_s,
                            const std::vector<int>& active_slots,
                            const std::map<int, const EnergySeries*>& series,
                            const std::map<int, double>& max_limit_w, double eta,
                            std::optional<unsigned> power_limit_w) {
  GPURUN_CHECK(t1_s >= t0_s, "window ends (t1 {}) before it starts (t0 {})", t1_s, t0_s);
  WindowRecord r;
  r.kind = kind;
  r.generation = generation;
  r.epoch = epoch;
  r.step = step;
  r.t0_s = t0_s;
  r.t1_s = t1_s;
  r.eta = eta;
  r.power_limit_w = power_limit_w;
  r.active = active_slots;
  std::sort(r.active.begin(), r.active.end());
  r.active.erase(std::unique(r.active.begin(), r.active.end()), r.active.end());

  const double seconds = r.seconds();
  for (int slot : r.active) {
    auto s = series.find(slot);
    GPURUN_CHECK(s != series.end() && s->second != nullptr, "active slot {} has no energy series",
                 slot);
    auto m = max_limit_w.find(slot);
    GPURUN_CHECK(m != max_limit_w.end(), "active slot {} has no maximum power limit", slot);
    GpuWindow g;
    g.slot = slot;
    g.energy_j = s->second->energy_between(t0_s, t1_s);
    g.power_integral_j = s->second->power_integral(t0_s, t1_s);
    g.avg_power_w = seconds > 0 ? g.energy_j / seconds : 0.0;
    r.energy_j += g.energy_j;
    r.max_power_w += m->second;
    r.gpus.push_back(g);
  }
  r.avg_power_w = seconds > 0 ? r.energy_j / seconds : 0.0;
  r.cost = zeus_cost(r.energy_j, seconds, r.max_power_w, eta);
  return r;
}

}  // namespace gpurun::energy
