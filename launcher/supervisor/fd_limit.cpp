#include "supervisor/fd_limit.hpp"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "gpurun/error.hpp"

namespace gpurun::supervisor {

FdLimit raise_fd_limit() {
  FdLimit l;
  if (::getrlimit(RLIMIT_NOFILE, &l.original) != 0) {
    l.original.rlim_cur = l.original.rlim_max = RLIM_INFINITY;
    l.soft = l.hard = RLIM_INFINITY;
    return l;
  }
  l.soft = l.original.rlim_cur;
  l.hard = l.original.rlim_max;
  if (l.soft < l.hard) {
    rlimit raised{l.hard, l.hard};
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) l.soft = l.hard;
  }
  return l;
}

long long fds_needed(int nproc, bool log_files) {
  const int per = kFdsPerWorker + (log_files ? kFdsPerWorkerLogFiles : 0);
  return static_cast<long long>(nproc) * per + kFdsReserved;
}

void check_fd_budget(int nproc, bool log_files, const FdLimit& limit) {
  const long long need = fds_needed(nproc, log_files);
  if (limit.soft == RLIM_INFINITY || need <= static_cast<long long>(limit.soft)) return;
  const int per = kFdsPerWorker + (log_files ? kFdsPerWorkerLogFiles : 0);
  throw UsageError(fmt::format(
      "--nproc {} needs about {} file descriptors ({} per worker{} + {}) but the limit "
      "(RLIMIT_NOFILE, hard limit {}) is {}; raise it (ulimit -n {}) or lower --nproc to at "
      "most {}",
      nproc, need, per, log_files ? " with log files" : "", kFdsReserved,
      limit.hard == RLIM_INFINITY ? std::string("unlimited") : std::to_string(limit.hard),
      limit.soft, need, std::max(0LL, (static_cast<long long>(limit.soft) - kFdsReserved) / per)));
}

}  // namespace gpurun::supervisor
