#include "energy/energy_series.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace gpurun::energy {

namespace {

double clamp_power(double w) {
  return std::isfinite(w) && w > 0 ? w : 0.0;
}

}  // namespace

bool EnergySeries::add(const Sample& s) {
  const double p = clamp_power(s.power_w);
  if (samples_.empty()) {
    samples_.push_back({s.t_s, s.energy_j + offset_j_, p, 0.0});
    last_raw_j_ = s.energy_j;
    return true;
  }
  const Point& prev = samples_.back();
  if (!(s.t_s >= prev.t_s)) return false;  // clock stepped back (or NaN): ignore
  const double dt = s.t_s - prev.t_s;
  const double trapezoid_j = (prev.power_w + p) / 2 * dt;
  double energy_j = s.energy_j + offset_j_;
  if (s.energy_j < last_raw_j_) {
    // Counter reset: bridge the gap with the power readings, count on from there.
    energy_j = prev.energy_j + trapezoid_j;
    offset_j_ = energy_j - s.energy_j;
    ++resets_;
  }
  last_raw_j_ = s.energy_j;
  samples_.push_back({s.t_s, energy_j, p, prev.power_integral_j + trapezoid_j});
  return true;
}

EnergySeries::Around EnergySeries::around(double t_s) const {
  // first.t_s < t_s < last.t_s: b is the first point after t, a the one before (a.t ≤ t < b.t).
  auto b = std::upper_bound(samples_.begin(), samples_.end(), t_s,
                            [](double t, const Point& p) { return t < p.t_s; });
  auto a = std::prev(b);
  return {&*a, &*b, (t_s - a->t_s) / (b->t_s - a->t_s)};
}

double EnergySeries::energy_at(double t_s) const {
  if (samples_.empty()) return 0.0;
  const Point& first = samples_.front();
  const Point& last = samples_.back();
  if (t_s <= first.t_s) return first.energy_j - first.power_w * (first.t_s - t_s);
  if (t_s >= last.t_s) return last.energy_j + last.power_w * (t_s - last.t_s);
  const Around s = around(t_s);
  return s.a->energy_j + s.f * (s.b->energy_j - s.a->energy_j);
}

double EnergySeries::energy_between(double t0_s, double t1_s) const {
  return energy_at(t1_s) - energy_at(t0_s);
}

double EnergySeries::energy_so_far(double t0_s, double t1_s) const {
  if (samples_.empty()) return 0;
  return std::max(0.0, energy_between(t0_s, std::min(t1_s, last_t())));
}

double EnergySeries::integral_to(double t_s) const {
  const Point& first = samples_.front();
  const Point& last = samples_.back();
  if (t_s <= first.t_s) return first.power_integral_j - first.power_w * (first.t_s - t_s);
  if (t_s >= last.t_s) return last.power_integral_j + last.power_w * (t_s - last.t_s);
  const Around s = around(t_s);
  const double p_t = s.a->power_w + s.f * (s.b->power_w - s.a->power_w);
  return s.a->power_integral_j + (s.a->power_w + p_t) / 2 * (t_s - s.a->t_s);
}

double EnergySeries::power_integral(double t0_s, double t1_s) const {
  if (samples_.empty()) return 0.0;
  return integral_to(t1_s) - integral_to(t0_s);
}

void EnergySeries::drop_before(double t_s) {
  // Keep the last point with t < t_s: it is the left neighbour of t_s for interpolation.
  while (samples_.size() >= 2 && samples_[1].t_s < t_s) samples_.pop_front();
}

}  // namespace gpurun::energy
