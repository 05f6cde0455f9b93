// gpurun::rt::Communicator — the collectives the worker runtime needs (all-reduce,
// broadcast, all-gather of small integers, barrier) over one fixed group of processes.
// One communicator per group per generation; created from a rendezvous through the
// supervisor's store; never reused across generations. Backends: Gloo (CPU tensors),
// NCCL (CUDA tensors). Internal header: not part of the public API.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "comm/abort_key.hpp"
#include "gpurun/error.hpp"
#include "gpurun/store/client.hpp"

namespace gpurun::rt {

/// Declared in <gpurun/error.hpp> (public: users catch it); named here as before.
using ::gpurun::CommError;

enum class CommBackend { kGloo, kNccl };
/// "gloo" / "nccl".
const char* to_string(CommBackend b);

struct CommOptions {
  /// Supervisor store (GPURUN_STORE_ADDR/PORT); the factory opens its own connection.
  store::ClientOptions store;
  /// Namespace of this group's rendezvous keys, unique per (generation, purpose), e.g.
  /// "gpurun/gen/3/comm/train". Keys under it are deleted by the group once every
  /// member has connected, so the store does not grow with generations.
  std::string prefix;
  int rank = 0;  ///< 0 <= rank < size
  int size = 1;
  /// CPU for Gloo; cuda:<index> for NCCL (the device the tensors live on).
  at::Device device = at::kCPU;
  /// Deadline of the rendezvous and of every collective. A collective still running
  /// after it throws CommError (Gloo: I/O timeout; NCCL: the runtime aborts the
  /// communicator).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// gpurun's abandon signal for this generation (gpurun/gen/<g>/abort): every wait of the
  /// rendezvous (and NCCL's init and synchronize) polls it and throws CommError naming
  /// gpurun's reason once it is set. Empty: only the timeout ends a wait.
  AbortKey abort;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual CommBackend backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual at::Device device() const = 0;

  /// In-place element-wise sum over all ranks. `t`: contiguous, on device(), dtype
  /// float32/float64/float16/bfloat16/int32/int64, same shape on every rank.
  /// Gloo: blocks until done. NCCL: enqueued on the current CUDA stream of device()
  /// (ordered with later work on that stream); returns without waiting.
  /// Throws CommError (peer failure, timeout, abort), gpurun::Error (bad tensor).
  virtual void all_reduce_sum(at::Tensor& t) = 0;

  /// Copies `t` of rank `root` into `t` of every other rank (in place). Same tensor rules
  /// and blocking behaviour as all_reduce_sum; any dtype (bytes are copied).
  virtual void broadcast(at::Tensor& t, int root) = 0;

  /// Every rank's `value`, indexed by rank. Blocks (also on NCCL) until all ranks gave
  /// theirs. Used for checksums and small control data; not for bulk traffic.
  virtual std::vector<int64_t> all_gather_int64(int64_t value) = 0;

  /// Blocks until every rank reached it.
  virtual void barrier() = 0;

  /// Waits until every collective enqueued so far is complete (NCCL: synchronises the
  /// stream it used, with the timeout; Gloo: no-op). Throws CommError on failure/timeout.
  virtual void synchronize() = 0;

  /// Tears the communicator down without waiting for peers (a peer failed or we leave
  /// after an error). Never throws; later calls throw CommError.
  virtual void abort() noexcept = 0;
};

/// True for the dtypes all_reduce_sum takes on every backend: float32, float64, float16,
/// bfloat16, int32, int64.
bool all_reduce_dtype_supported(at::ScalarType dtype) noexcept;

/// True when this build has the backend (Gloo needs libgloo, NCCL a CUDA build).
bool comm_backend_available(CommBackend b);

/// Creates the communicator of one group: all `size` members call it with the same prefix
/// and their own rank; a group of one (size 1) meets no one and opens no connection (every
/// collective is the identity); blocks until every member has joined (or options.timeout passes:
/// CommError naming the prefix and the ranks that did not arrive, where known).
/// Throws gpurun::Error when the backend is not built in (naming the CMake option).
std::unique_ptr<Communicator> make_communicator(CommBackend backend, const CommOptions& options);

}  // namespace gpurun::rt
