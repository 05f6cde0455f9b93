// gpurun::supervisor fd budget: gpurun holds a few descriptors per worker, so
// --nproc is bounded by RLIMIT_NOFILE. Raise the soft limit, then check up front.
#pragma once

#include <sys/resource.h>

namespace gpurun::supervisor {

/// Descriptors gpurun holds for one worker: stdout and stderr pipes, the process's
/// pidfd and one store connection; plus the stdout.log/stderr.log files when written.
constexpr int kFdsPerWorker = 4;
constexpr int kFdsPerWorkerLogFiles = 2;
/// Descriptors gpurun needs besides its workers: stdio, the Asio reactor, store listeners,
/// event log, control files, and the pipes of the spawn in progress.
constexpr int kFdsReserved = 32;

/// The limits before and after raise_fd_limit().
struct FdLimit {
  rlimit original{};  ///< what gpurun was started with (given back to the workers)
  rlim_t soft = 0;    ///< gpurun's soft limit now
  rlim_t hard = 0;
};

/// Raises this process's RLIMIT_NOFILE soft limit to the hard limit (never fails: on
/// error the limit stays as it was).
FdLimit raise_fd_limit();

/// Descriptors a job of `nproc` workers needs; `log_files`: stdout/stderr files are written.
long long fds_needed(int nproc, bool log_files);

/// Throws UsageError when `nproc` workers cannot fit in `limit.soft`; the message names
/// the limit, the need and the descriptors per worker.
void check_fd_budget(int nproc, bool log_files, const FdLimit& limit);

}  // namespace gpurun::supervisor
