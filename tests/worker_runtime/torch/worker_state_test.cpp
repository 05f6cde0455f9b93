// The worker-side state machine's transition table and Step's loss weights.
#include <doctest/doctest.h>

#include <vector>

#include "gpurun/runtime.hpp"

using gpurun::WorkerState;

TEST_CASE("worker state machine: exactly the documented transitions are legal") {
  const std::vector<WorkerState> all = {WorkerState::kActive, WorkerState::kOffloading,
                                        WorkerState::kParked, WorkerState::kRejoining,
                                        WorkerState::kExited};
  // ACTIVE → OFFLOADING → PARKED → REJOINING → ACTIVE, and EXITED from every live state.
  const std::vector<std::pair<WorkerState, WorkerState>> legal = {
      {WorkerState::kActive, WorkerState::kOffloading},
      {WorkerState::kOffloading, WorkerState::kParked},
      {WorkerState::kParked, WorkerState::kRejoining},
      {WorkerState::kRejoining, WorkerState::kActive},
      {WorkerState::kRejoining, WorkerState::kOffloading},  // an abandoned join, left out
      {WorkerState::kActive, WorkerState::kExited},
      {WorkerState::kOffloading, WorkerState::kExited},
      {WorkerState::kParked, WorkerState::kExited},
      {WorkerState::kRejoining, WorkerState::kExited}};
  int n = 0;
  for (WorkerState from : all) {
    for (WorkerState to : all) {
      const bool expected =
          std::find(legal.begin(), legal.end(), std::make_pair(from, to)) != legal.end();
      INFO(gpurun::to_string(from) << " -> " << gpurun::to_string(to));
      CHECK(gpurun::worker_transition_allowed(from, to) == expected);
      n += expected;
    }
  }
  CHECK(n == 9);
  CHECK(std::string(gpurun::to_string(WorkerState::kRejoining)) == "REJOINING");
}

TEST_CASE("step weights make the averaged gradient the mean over the global batch") {
  // 3 ranks, global batch 10: rank shares 4, 3, 3; rank 0 split in micro-batches 3 + 1.
  gpurun::Step s0, s1;
  s0.global_samples = s1.global_samples = 10;
  s0.world_size = s1.world_size = 3;
  s0.micro_batches = {{1, 2, 3}, {4}};
  s1.micro_batches = {{5, 6, 7}};
  CHECK(s0.samples() == 4);
  CHECK(s0.weight(0) == doctest::Approx(0.9));
  CHECK(s0.weight(1) == doctest::Approx(0.3));
  CHECK(s1.weight(0) == doctest::Approx(0.9));
  // mean over world of sum_i weight_i * mean_loss_i = sum of per-sample losses / 10:
  // with every per-sample loss 1: (0.9 + 0.3 + 0.9 + 0.9) / 3 = 1.
  CHECK((s0.weight(0) + s0.weight(1) + s1.weight(0) * 2) / 3 == doctest::Approx(1.0));
}
