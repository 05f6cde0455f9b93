// gpurun::detail::make_runtime — the Runtime's internal constructor: environment, control
// client and communicator factory given from outside, so that the worker state machine runs
// in one process with threads as ranks (tests/testing/, tests/worker_runtime/
// inprocess_runtime_test.cpp). Runtime::from_env() is make_runtime() with the real seams.
// Seams table: docs/worker-runtime.md#testing-in-one-process. Internal header.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "gpurun/control/progress.hpp"
#include "gpurun/runtime.hpp"
#include "gpurun/worker/worker_session.hpp"
#include "runtime/runtime_env.hpp"

namespace gpurun::rt {
/// Makes the communicator of one group (same contract as rt::make_communicator, which is the
/// real factory: Gloo on CPU, NCCL on CUDA).
using CommFactory = std::function<std::unique_ptr<Communicator>(CommBackend, const CommOptions&)>;
/// Called after every state change, on the thread that made it (tests; may be empty).
using StateObserver = std::function<void(WorkerState from, WorkerState to, const std::string& why)>;
}  // namespace gpurun::rt

namespace gpurun::detail {

struct RuntimeSeams {
  RuntimeOptions options;
  rt::RuntimeEnv env;
  /// Null: not elastic (a static world from env.rank/env.world, or a world of one).
  /// Otherwise the worker engine's session (real: over gpurun's store; tests: over
  /// testing::InMemoryStore); make_runtime() opens it (a joiner reads its start record).
  std::unique_ptr<control::WorkerSession> control;
  /// Empty: rt::make_communicator.
  rt::CommFactory make_comm;
  /// Step progress for the supervisor (GPURUN_PROGRESS_FILE); may be null.
  std::unique_ptr<control::ProgressWriter> progress;
  rt::StateObserver on_state;
  /// A standby told to exit before a config needed it ends its process here; empty:
  /// std::exit(0) (tests with threads as ranks throw instead).
  std::function<void()> standby_exit;
  /// What an elastic process sets up beside its start (Impl::start_warm_up); empty: the
  /// checksum's kernels and rt::warm_cuda_libraries on a CUDA device, nothing on a CPU one.
  /// Set (tests): run on any device, on the warm-up thread.
  std::function<void(const at::Device&)> warm_up;
  /// Called on the rank's thread just before it waits for a warm-up thread that has not been
  /// joined yet (Impl::finish_warm_up). Empty: nothing. Tests: a warm-up that ends only once
  /// it is waited for, so "the first step's end joins it" is seen without a timing guess.
  std::function<void()> warm_up_waited;
  /// Sets a generation's torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, …: the engine's
  /// kTrain `env`, control::generation_env) in the process environment, at every generation
  /// this process trains in. Runtime::from_env(): rt::export_env (::setenv). Empty: not set
  /// (tests whose ranks are threads share one environment; ThreadJob sets it for one slot).
  std::function<void(const std::vector<control::EnvVar>&)> export_env;
};

/// Builds the runtime from its seams: device (env.cuda: cuda:<env.local_slot>), joins the
/// generation when elastic. Throws like Runtime::from_env().
std::unique_ptr<Runtime> make_runtime(RuntimeSeams seams);

}  // namespace gpurun::detail
