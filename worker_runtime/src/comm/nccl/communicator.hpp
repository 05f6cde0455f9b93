// gpurun::rt NCCL communicator factory (CUDA builds only). The class lives in the .cpp so
// that nccl.h and the CUDA headers stay out of every other translation unit.
#pragma once

#include <memory>

#include "comm/communicator.hpp"

namespace gpurun::rt {

/// Rendezvous of one NCCL group on options.device (cuda:<index>): rank 0 creates the
/// ncclUniqueId and SETs it at "<prefix>/nccl_id"; the others GET it (waiting up to
/// options.timeout). Every rank then initialises a non-blocking communicator and polls it
/// until ready or options.timeout (then aborts it). Rank 0 deletes the id key once its
/// communicator is ready (every rank read the id by then), or when it fails.
///
/// Blocks until the communicator is ready. Throws CommError (a rank did not arrive, NCCL
/// error, timeout; naming the prefix and rank), gpurun::Error (device is not CUDA).
/// Setting NCCL_* environment variables (e.g. NCCL_NVLS_ENABLE=0) is the caller's job.
///
/// The communicator: all_reduce_sum and broadcast are enqueued on the current CUDA stream
/// of the device and return at once; all_gather_int64, barrier and synchronize block (with
/// the timeout; on timeout or an asynchronous NCCL error the communicator is aborted and
/// CommError thrown). abort() may be called from any thread.
std::unique_ptr<Communicator> make_nccl_communicator(const CommOptions& options);

}  // namespace gpurun::rt
