// gpurun::rt::ControlClient — what the runtime needs of the control protocol's worker side
// (docs/control-protocol.md): join a generation, report at a boundary and wait for the
// decision, park in hold mode. Real: control::WorkerControl over the supervisor's store
// (make_worker_control_client). Fake: gpurun::testing::InMemoryControl
// (worker_runtime/testing/in_memory_control.hpp), threads as ranks. Internal header.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "gpurun/control/decision.hpp"

namespace gpurun::control {
class WorkerControl;
}

namespace gpurun::rt {

/// Same contract as control::WorkerControl's methods of the same names (blocking; one per
/// worker; not thread-safe).
class ControlClient {
 public:
  virtual ~ControlClient() = default;
  /// Reads the start record of the generation this worker was started in, writes its
  /// `joined` key; returns that decision. Throws ProtocolError when the slot is no member.
  virtual const control::Decision& join() = 0;
  /// At a boundary: report (epoch, step), block until the round's decision, return it.
  /// `has_state` false: a joiner without the state reports after its set-up was abandoned.
  /// `snapshot`: the state source's outcome after a `snapshot` decision ("ok" or the error).
  virtual control::Decision report_and_wait(int64_t epoch, int64_t step, bool has_state,
                                            std::string snapshot) = 0;
  /// Hold mode, after a leave: write `parked`, block until woken. The decision to join
  /// (joined key already written), or nullopt when told to exit.
  virtual std::optional<control::Decision> park_and_wait() = 0;
  /// A warm joiner (started before any decision named it): join() is not called; once the
  /// program is ready (its first epochs()/steps()), wait_admission() says so and blocks until
  /// gpurun admits it: the decision to join (joined key written), or nullopt: exit.
  virtual bool warm() const { return false; }
  virtual std::optional<control::Decision> wait_admission() { return std::nullopt; }
  /// The last decision read (start record, boundary decision or wake).
  virtual const control::Decision& current() const = 0;
  /// This rank's phase timestamps of the resize into `generation` (JSON object text) for
  /// gpurun's `resize` event. Default: dropped (fakes without a supervisor).
  virtual void publish_timing(int64_t /*generation*/, const std::string& /*json*/) {}
};

/// The real client: forwards to `control` (never null).
std::unique_ptr<ControlClient> make_worker_control_client(
    std::unique_ptr<control::WorkerControl> control);

}  // namespace gpurun::rt
