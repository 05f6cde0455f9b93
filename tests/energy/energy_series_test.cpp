#include "energy/energy_series.hpp"

#include <doctest/doctest.h>

using gpurun::energy::EnergySeries;
using gpurun::energy::Sample;

TEST_CASE("energy_at interpolates inside a 100 ms counter step and extrapolates at the ends") {
  EnergySeries s;
  // Counter updates every 100 ms: 1000 J, 1030 J, 1060 J (300 W). First power reading 200 W
  // (used only before the first sample), last 300 W.
  CHECK(s.add({100.0, 1000.0, 200.0}));
  CHECK(s.add({100.1, 1030.0, 300.0}));
  CHECK(s.add({100.2, 1060.0, 300.0}));
  CHECK(s.size() == 3);
  CHECK(s.last_t() == doctest::Approx(100.2));

  // At a sample: its counter.
  CHECK(s.energy_at(100.1) == doctest::Approx(1030.0));
  // Halfway through the first step: 1000 + 0.5·30 = 1015 J.
  CHECK(s.energy_at(100.05) == doctest::Approx(1015.0));
  // Window edges inside two different steps: at 100.025: 1000 + 0.25·30 = 1007.5 J;
  // at 100.175: 1030 + 0.75·30 = 1052.5 J; difference 45 J (= 300 W · 0.15 s).
  CHECK(s.energy_between(100.025, 100.175) == doctest::Approx(45.0));
  // After the last sample, the last power: 1060 + 300·(100.5 − 100.2) = 1150 J.
  CHECK(s.energy_at(100.5) == doctest::Approx(1150.0));
  // Before the first, the first power: 1000 − 200·(100.0 − 99.5) = 900 J.
  CHECK(s.energy_at(99.5) == doctest::Approx(900.0));
  // A window straddling the last sample: (1060 − 1052.5) + 300·0.1 = 37.5 J.
  CHECK(s.energy_between(100.175, 100.3) == doctest::Approx(37.5));
}

TEST_CASE("a counter that goes backwards (driver reload) is bridged with the power readings") {
  EnergySeries s;
  // Raw counter: 5000, 5100 (100 W), then reset to 40 at t=2 (power 300 W), then 240 at t=3.
  s.add({0.0, 5000.0, 100.0});
  s.add({1.0, 5100.0, 100.0});
  s.add({2.0, 40.0, 300.0});
  s.add({3.0, 240.0, 200.0});
  CHECK(s.resets() == 1);
  // The gap 1→2 is estimated by the trapezoid (100 + 300)/2 · 1 s = 200 J, so the continuous
  // counter is 5000, 5100, 5300, 5500 (the last step 40 → 240 is +200 J as measured).
  CHECK(s.energy_between(1.0, 2.0) == doctest::Approx(200.0));
  CHECK(s.energy_between(2.0, 3.0) == doctest::Approx(200.0));
  // Whole run: 100 + 200 + 200 = 500 J (a naive difference would be 240 − 5000 = −4760 J).
  CHECK(s.energy_between(0.0, 3.0) == doctest::Approx(500.0));
  // No negative energy anywhere: halfway into the gap, 5100 + 0.5·200 = 5200 J.
  CHECK(s.energy_at(1.5) == doctest::Approx(5200.0));
}

TEST_CASE("power_integral is the trapezoid over the power readings") {
  EnergySeries s;
  // Power 100 W at t=0, 300 W at t=2 (counter deliberately different: 0 and 1000 J).
  s.add({0.0, 0.0, 100.0});
  s.add({2.0, 1000.0, 300.0});
  // ∫0..2 = (100 + 300)/2 · 2 = 400 J (the counter says 1000 J: the cross-check differs).
  CHECK(s.power_integral(0.0, 2.0) == doctest::Approx(400.0));
  CHECK(s.energy_between(0.0, 2.0) == doctest::Approx(1000.0));
  // ∫0.5..1.5: P(0.5) = 150 W, P(1.5) = 250 W → (150 + 250)/2 · 1 = 200 J.
  CHECK(s.power_integral(0.5, 1.5) == doctest::Approx(200.0));
  // Outside the samples the power is constant: ∫2..3 = 300 J, ∫−1..0 = 100 J.
  CHECK(s.power_integral(2.0, 3.0) == doctest::Approx(300.0));
  CHECK(s.power_integral(-1.0, 0.0) == doctest::Approx(100.0));
  // Straddling the first sample: 100 (before) + ∫0..1 (100 → 200 W: 150 J) = 250 J.
  CHECK(s.power_integral(-1.0, 1.0) == doctest::Approx(250.0));
}

TEST_CASE("drop_before keeps one sample before t and leaves later windows unchanged") {
  EnergySeries s;
  // t = 0..10 s, counter 0, 37, 74, … (37 W), power reading 37 W.
  for (int i = 0; i <= 10; ++i) s.add({double(i), 37.0 * i, 37.0});
  CHECK(s.size() == 11);
  const double before = s.energy_between(5.5, 7.0);  // 37 · 1.5 = 55.5 J
  CHECK(before == doctest::Approx(55.5));
  const double integral_before = s.power_integral(5.5, 9.0);  // 37 · 3.5 = 129.5 J
  s.drop_before(5.5);
  // Samples 5..10 remain: 6 (5 is the one before 5.5).
  CHECK(s.size() == 6);
  CHECK(s.first_t() == doctest::Approx(5.0));
  CHECK(s.energy_between(5.5, 7.0) == doctest::Approx(55.5));
  CHECK(s.power_integral(5.5, 9.0) == doctest::Approx(integral_before));
  // Dropping past the end keeps the last sample only; extrapolation still works:
  // 37 W · 2 s = 74 J between 11 and 13.
  s.drop_before(100.0);
  CHECK(s.size() == 1);
  CHECK(s.energy_between(11.0, 13.0) == doctest::Approx(74.0));
}

TEST_CASE("out-of-order samples are ignored; negative power counts as 0 W; empty series is 0") {
  EnergySeries empty;
  CHECK(empty.energy_at(5.0) == 0.0);
  CHECK(empty.energy_between(0.0, 5.0) == 0.0);
  CHECK(empty.power_integral(0.0, 5.0) == 0.0);
  CHECK(empty.size() == 0);

  EnergySeries s;
  CHECK(s.add({10.0, 100.0, 50.0}));
  CHECK_FALSE(s.add({9.0, 200.0, 50.0}));  // clock stepped back: ignored
  CHECK(s.size() == 1);
  CHECK(s.add({10.0, 100.0, 50.0}));  // equal time is allowed
  CHECK(s.add({11.0, 150.0, -5.0}));  // negative power reading → 0 W
  // After the last sample with 0 W: no energy added by extrapolation.
  CHECK(s.energy_between(11.0, 20.0) == doctest::Approx(0.0));
  // The counter itself still counts: 100 → 150 J between 10 and 11.
  CHECK(s.energy_between(10.0, 11.0) == doctest::Approx(50.0));
}

TEST_CASE("energy_so_far: closed windows plus the open one never go down when power drops") {
  // The monitor's job counter (/metrics' gpurun_gpu_energy_joules_total): the closed windows'
  // energy plus energy_so_far(open window's start, now). 600 W until 0.1 s, then 100 W.
  EnergySeries s;
  s.add({0.0, 0.0, 600.0});
  s.add({0.1, 60.0, 600.0});
  double closed = 0, t0 = 0, last = 0;
  const auto counter = [&](double now) {
    const double c = closed + s.energy_so_far(t0, now);
    CHECK(c >= last);  // a scrape never shows less than the one before
    last = c;
    return c;
  };
  // At 0.15 s, before the next sample: up to the last sample only (60 J), where energy_between
  // would extrapolate at 600 W (90 J) and take it back once the 100 W sample comes.
  CHECK(counter(0.15) == doctest::Approx(60.0));
  CHECK(s.energy_between(0.0, 0.15) == doctest::Approx(90.0));
  // A boundary closes the window at 0.15 s (extrapolated: 90 J) before the next sample.
  closed += s.energy_between(t0, 0.15);
  t0 = 0.15;
  CHECK(counter(0.15) == doctest::Approx(90.0));
  CHECK(counter(0.18) == doctest::Approx(90.0));  // 0: the last sample is before the window
  s.add({0.2, 70.0, 100.0});                      // the power dropped: 10 J in 0.1 s
  CHECK(counter(0.2) == doctest::Approx(95.0));   // 90 + (70 − 65): 65 J interpolated at 0.15 s
  s.add({0.3, 80.0, 100.0});
  CHECK(counter(0.3) == doctest::Approx(105.0));
  CHECK(EnergySeries().energy_so_far(0, 1) == 0);
}
