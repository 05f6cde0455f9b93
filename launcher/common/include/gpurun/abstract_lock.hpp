// gpurun::AbstractLock — a machine-wide lock: an abstract Unix socket `@name`, bound and
// listening while held. No directory, file permissions or environment take part, so every
// process on the machine (root or not) contends for the same name, and the kernel frees it
// when its holder exits (kill -9 included). Used for a GPU's power limit (energy/power_guard)
// and for the c10d store host on one machine (app/main.cpp).
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

namespace gpurun {

/// The socket address of `@name` (`len` set); false when the name is too long.
inline bool abstract_address(const std::string& name, sockaddr_un& addr, socklen_t& len) {
  addr = sockaddr_un{};
  addr.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof addr.sun_path) return false;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return true;
}

/// Takes the lock `@name`: the bound, listening socket (close-on-exec; the lock is held until
/// it is closed or the process ends), or -1 with errno set (EADDRINUSE: another process
/// holds it; ENAMETOOLONG: the name does not fit). Non-blocking.
inline int take_abstract_lock(const std::string& name) {
  sockaddr_un addr{};
  socklen_t len = 0;
  if (!abstract_address(name, addr, len)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) == 0 && ::listen(fd, 16) == 0)
    return fd;
  const int err = errno;
  ::close(fd);
  errno = err;
  return -1;
}

}  // namespace gpurun
