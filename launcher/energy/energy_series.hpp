// gpurun::energy::EnergySeries — one GPU's energy samples over time, and the energy of any
// window between two instants: the pure arithmetic under the supervisor's energy monitor
// (docs/energy.md). No I/O, no clock, no threads: the caller samples NVML and passes times.
#pragma once

#include <cstddef>
#include <deque>

namespace gpurun::energy {

/// One reading of one GPU.
struct Sample {
  double t_s = 0;       ///< when it was read, Unix seconds (CLOCK_REALTIME)
  double energy_j = 0;  ///< NVML's cumulative energy counter, J (moves in ~100 ms steps)
  double power_w = 0;   ///< instantaneous board power, W
};

/// The samples of one GPU, with the counter made continuous and monotone.
///
/// Energy of a window: the counter, linearly interpolated between the two samples around each
/// edge (energy_at). The counter only changes every ~100 ms on current GPUs, so an edge is
/// placed to within one update; the trapezoid integral of the power readings
/// (power_integral) is kept beside it as a cross-check.
///
/// Counter reset (driver reload, GPU reset: a reading below the previous one): the series
/// keeps an offset so that the stored counter never goes down. The energy of the gap between
/// the last reading before the reset and the first after it is estimated from the power
/// readings (trapezoid, (p_prev + p_new) / 2 · Δt); later readings count from there. So no
/// window ever has negative energy, and at most one sample interval is estimated from power.
///
/// Not thread-safe; every method is O(log n) or O(1) amortised, never blocks, never throws
/// (except std::bad_alloc).
class EnergySeries {
 public:
  /// Appends a reading. Times must not decrease: a reading older than the last one (the
  /// realtime clock stepped back) is ignored and add() returns false. A negative power
  /// reading is taken as 0 W. A counter below the previous reading is a reset (see above).
  bool add(const Sample& s);

  /// The continuous counter at `t`, J: linear between the samples around t; before the first
  /// sample extrapolated back with the first power reading, after the last forward with the
  /// last one (E_last + P_last · (t − t_last)). 0 for an empty series. Only differences are
  /// meaningful.
  double energy_at(double t_s) const;

  /// energy_at(t1) − energy_at(t0), J; ≥ 0 when t1 ≥ t0 (negative when t1 < t0).
  double energy_between(double t0_s, double t1_s) const;

  /// energy_between(t0, min(t1, last_t())), at least 0, J: a window's energy so far, never
  /// extrapolated past the last sample. A counter of closed windows plus this one never
  /// goes down, whatever the power does after the last sample (/metrics'
  /// gpurun_gpu_energy_joules_total: Prometheus takes a drop for a reset). 0 when empty.
  double energy_so_far(double t0_s, double t1_s) const;

  /// ∫ power dt over [t0, t1] by the trapezoid rule over the power readings, J; power is
  /// linear between readings and constant (first / last reading) outside them. 0 for an empty
  /// series; negative when t1 < t0.
  double power_integral(double t0_s, double t1_s) const;

  /// Forgets the samples before `t` except the last one before it, so energy_at(t') for every
  /// t' ≥ t is unchanged. Bounds memory: call it with the start of the oldest open window.
  void drop_before(double t_s);

  /// Time of the last sample, Unix s; 0 for an empty series.
  double last_t() const { return samples_.empty() ? 0.0 : samples_.back().t_s; }
  /// Time of the first kept sample, Unix s; 0 for an empty series.
  double first_t() const { return samples_.empty() ? 0.0 : samples_.front().t_s; }
  std::size_t size() const { return samples_.size(); }
  bool empty() const { return samples_.empty(); }
  /// How many counter resets add() has bridged.
  int resets() const { return resets_; }

 private:
  struct Point {
    double t_s;
    double energy_j;          // continuous counter: raw reading + offset_j_
    double power_w;           // clamped to >= 0
    double power_integral_j;  // trapezoid integral of power from the first sample ever added
  };
  // The two points around t (first.t_s < t < last.t_s) and t's fraction of the way from a to b.
  struct Around {
    const Point* a;
    const Point* b;
    double f;
  };
  Around around(double t_s) const;
  // The integral of the power readings from the first stored point to t (negative before it).
  double integral_to(double t_s) const;

  std::deque<Point> samples_;
  double offset_j_ = 0;    // added to raw readings
  double last_raw_j_ = 0;  // last raw counter reading, to detect a reset
  int resets_ = 0;
};

}  // namespace gpurun::energy
