#include "supervisor/console.hpp"

#include <unistd.h>

#include <cerrno>

namespace gpurun::supervisor {

void FdConsole::write(StreamId stream, std::string_view text) {
  const int fd = static_cast<int>(stream);
  if (broken_[fd]) return;
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        ::usleep(1000);  // a non-blocking terminal: retry, keep the line whole
        continue;
      }
      broken_[fd] = true;  // EPIPE, EBADF, ...: the console is gone
      return;
    }
    text.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace gpurun::supervisor
