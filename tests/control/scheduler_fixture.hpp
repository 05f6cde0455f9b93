// The harness of the Scheduler suites (scheduler_test.cpp, scheduler_warm_test.cpp,
// scheduler_failures_test.cpp, scheduler_deadlines_test.cpp): configs and a Harness that
// drives a Scheduler like the controller does, with fake pids and an in-memory key set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "control/scheduler.hpp"

namespace gpurun::control::testing {

using namespace std::chrono_literals;

/// Without standbys (most cases test what happens without one); standby(): with them.
inline Config cfg(std::optional<std::vector<int>> active, ParkMode mode = ParkMode::kRelease) {
  Config c;
  c.active_gpus = std::move(active);
  c.park_mode = mode;
  c.boundary_deadline = 2s;
  c.standby = false;
  return c;
}
inline Config standby(std::optional<std::vector<int>> active, ParkMode mode = ParkMode::kRelease) {
  Config c = cfg(std::move(active), mode);
  c.standby = true;
  return c;
}

/// Drives a Scheduler like the controller does, with fake pids (1000 + n).
struct Harness {
  Scheduler s;
  std::vector<Effect> log;          // every effect so far
  std::vector<Decision> decisions;  // every decision written (decision or start keys)
  std::vector<int> spawned;         // gpus spawned, in order
  std::vector<int> killed;
  std::vector<std::string> wakes;  // wake keys written
  std::set<std::string> store;     // keys present in the store (workers' writes included)
  int next_pid = 1000;
  /// A warm joiner is ready as soon as it is spawned (false: the test says when, ready()).
  bool auto_ready = true;
  std::map<int, int64_t> warm;  // gpu -> id of its last warm joiner
  std::vector<int> standbys;    // gpus a standby was spawned for, in order

  explicit Harness(Config c, int slots = 4, std::optional<std::vector<int>> launch = std::nullopt)
      : s(ids(slots), c, std::move(launch)) {
    s.config_loaded(c, "config.toml");
    s.start_attempt(0);
    drain();
  }
  static std::vector<int> ids(int n) {
    std::vector<int> v;
    for (int i = 0; i < n; ++i) v.push_back(i);
    return v;
  }
  void drain() {
    for (auto batch = s.take_effects(); !batch.empty(); batch = s.take_effects()) {
      for (auto& e : batch) {
        log.push_back(e);
        if (e.kind == Effect::Kind::kSpawn) {
          spawned.push_back(e.gpu);
          s.on_spawned(e.gpu, next_pid++);
          if (e.warm >= 0) {
            warm[e.gpu] = e.warm;
            if (e.standby)
              standbys.push_back(e.gpu);  // waits for its go key (no ready before)
            else if (auto_ready)
              s.on_ready(e.gpu, e.warm);  // a joiner that starts at once
          }
        } else if (e.kind == Effect::Kind::kKill) {
          killed.push_back(e.gpu);
        } else if (e.kind == Effect::Kind::kDeleteKey) {
          store.erase(e.key);
        } else if (e.kind == Effect::Kind::kWriteKey) {
          store.insert(e.key);
          if (e.key.find("/decision") != std::string::npos)
            decisions.push_back(Decision::from_json(e.text()));
          else if (e.key.find("/start") != std::string::npos &&
                   (decisions.empty() || decisions.back().to_json() != e.text()))
            decisions.push_back(Decision::from_json(e.text()));
          else if (e.key.find("/wake/") != std::string::npos)
            wakes.push_back(e.key);
          else if (auto go = go_of(e.key); go && auto_ready)
            s.on_ready(go->first, go->second);  // a standby told to go gets ready at once
        }
      }
    }
  }
  /// (gpu, warm id) when `key` is the go key of a standby spawned here.
  std::optional<std::pair<int, int64_t>> go_of(const std::string& key) const {
    for (const auto& [gpu, w] : warm)
      if (key == keys::go(gpu, w)) return std::make_pair(gpu, w);
    return std::nullopt;
  }
  SlotState state(int gpu) const { return s.slots().at(gpu).state; }
  /// The warm joiner of `gpu` wrote its ready key.
  void ready(int gpu) {
    store.insert(keys::ready(gpu, warm.at(gpu)));
    s.on_ready(gpu, warm.at(gpu));
    drain();
  }
  void join_all() {
    const auto active = s.active();
    for (size_t r = 0; r < active.size(); ++r) {
      const SlotState st = s.slots().at(active[r]).state;
      if (st != SlotState::kStarting && st != SlotState::kRejoining) continue;
      store.insert(keys::joined(s.generation(), static_cast<int>(r)));
      s.on_joined(s.generation(), static_cast<int>(r), s.slots().at(active[r]).pid);
    }
    drain();
  }
  void report(int gpu, int64_t epoch, const std::string& snapshot = "") {
    Report r;
    r.snapshot = snapshot;
    r.gpu = gpu;
    r.rank = s.slots().at(gpu).rank;
    r.generation = s.generation();
    r.round = s.round();
    r.epoch = epoch;
    r.pid = s.slots().at(gpu).pid;
    store.insert(keys::report(r.generation, r.round, r.rank));
    s.on_report(r);
    drain();
  }
  /// Every member reports boundary `epoch`; returns the decision made. A `snapshot` decision
  /// (a pause) is followed by the re-reports, the source giving `snapshot_outcome`, and the
  /// decision after them is returned; with an empty outcome the `snapshot` one is.
  Decision boundary(int64_t epoch, const std::string& snapshot_outcome = "ok") {
    const size_t before = decisions.size();
    for (int gpu : s.active()) report(gpu, epoch);
    REQUIRE(decisions.size() == before + 1);
    if (decisions.back().kind == Decision::Kind::kSnapshot && !snapshot_outcome.empty()) {
      const int src = decisions.back().state_source.gpu;
      for (int gpu : s.active()) report(gpu, epoch, gpu == src ? snapshot_outcome : "");
      REQUIRE(decisions.size() == before + 2);
    }
    return decisions.back();
  }
  size_t events(const std::string& name) const {
    size_t n = 0;
    for (auto& e : log) n += e.kind == Effect::Kind::kEvent && e.key == name;
    return n;
  }
};

/// Whether any console line (kSay) so far contains `text`.
inline bool said(const Harness& h, const std::string& text) {
  for (const Effect& e : h.log)
    if (e.kind == Effect::Kind::kSay && e.value.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace gpurun::control::testing
