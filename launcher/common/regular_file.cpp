// gpurun::read_regular_file and replace_file_if_unchanged. Reference: docs/errors.md
// ("Files gpurun reads").
#include "gpurun/regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "gpurun/unique_fd.hpp"

namespace gpurun {

namespace fs = std::filesystem;

namespace {

FileIdentity identity_of(const struct stat& st) {
  FileIdentity id;
  id.device = static_cast<uint64_t>(st.st_dev);
  id.inode = static_cast<uint64_t>(st.st_ino);
  id.size_bytes = static_cast<int64_t>(st.st_size);
  id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  return id;
}

std::string errno_problem(int e) {
  switch (e) {
    case ELOOP:
      return fmt::format("a symlink loop ({})", std::strerror(e));
    case ENOENT:
      return "it does not exist";
    case EACCES:
    case EPERM:
      return fmt::format("unreadable: {}", std::strerror(e));
    default:
      return std::strerror(e);
  }
}

std::string limit_text(std::size_t max_bytes) {
  if (max_bytes >= (std::size_t{1} << 20) && max_bytes % (std::size_t{1} << 20) == 0)
    return fmt::format("{} MiB ({} bytes)", max_bytes >> 20, max_bytes);
  if (max_bytes >= 1024 && max_bytes % 1024 == 0)
    return fmt::format("{} KiB ({} bytes)", max_bytes >> 10, max_bytes);
  return fmt::format("{} bytes", max_bytes);
}

FileError read_error(const fs::path& path, std::string_view what, const std::string& problem) {
  return FileError(fmt::format("cannot read {} {}: {}", what, path.string(), problem),
                   path.string(), problem);
}

FileError not_regular(const fs::path& path, std::string_view what, mode_t mode) {
  return read_error(path, what, fmt::format("it is {}, not a regular file", file_type_name(mode)));
}

std::optional<RegularFile> open_impl(const fs::path& path, std::string_view what, bool missing_ok,
                                     std::optional<std::size_t> max_bytes) {
  // stat() first: a FIFO or a device is refused without being opened (opening a device can
  // act: a tape rewinds, a modem line rises).
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT && missing_ok) return std::nullopt;
    throw read_error(path, what, errno_problem(e));
  }
  if (!S_ISREG(st.st_mode)) throw not_regular(path, what, st.st_mode);
  if (max_bytes && static_cast<uint64_t>(st.st_size) > *max_bytes)
    throw read_error(path, what,
                     fmt::format("it is {} bytes, more than the limit of {}", st.st_size,
                                 limit_text(*max_bytes)));
  // O_NONBLOCK: should the path be swapped for a FIFO after the stat, open() does not hang.
  RegularFile f{UniqueFd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)), {}};
  if (!f.fd) {
    const int e = errno;
    if (e == ENOENT && missing_ok) return std::nullopt;
    throw read_error(path, what, errno_problem(e));
  }
  if (::fstat(f.fd.get(), &st) != 0) throw read_error(path, what, errno_problem(errno));
  if (!S_ISREG(st.st_mode)) throw not_regular(path, what, st.st_mode);
  f.identity = identity_of(st);
  return f;
}

std::optional<FileContent> read_impl(const fs::path& path, std::size_t max_bytes,
                                     std::string_view what, bool missing_ok) {
  std::optional<RegularFile> f = open_impl(path, what, missing_ok, max_bytes);
  if (!f) return std::nullopt;
  FileContent out;
  out.identity = f->identity;
  // At most max_bytes + 1 (to tell "too large"), whatever the file grows to while read.
  const std::size_t cap = max_bytes + 1;
  out.bytes.resize(
      std::min<std::size_t>(static_cast<std::size_t>(f->identity.size_bytes) + 1, cap));
  std::size_t got = 0;
  while (true) {
    if (got == out.bytes.size()) {
      if (got >= cap) break;
      out.bytes.resize(std::min(cap, std::max<std::size_t>(got * 2, 4096)));
    }
    const ssize_t n = ::read(f->fd.get(), out.bytes.data() + got, out.bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw read_error(path, what, errno_problem(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > max_bytes)
    throw read_error(
        path, what,
        fmt::format("it grew past the limit of {} while it was read", limit_text(max_bytes)));
  out.bytes.resize(got);
  return out;
}

/// The file at `path` is still `expected` (nullopt: still missing), by identity and content.
bool still_holds(const fs::path& path, const std::optional<FileContent>& expected) {
  try {
    const std::optional<FileContent> now =
        read_impl(path, expected ? expected->bytes.size() : 0, "the file", true);
    if (!expected || !now) return !expected && !now;
    return now->identity == expected->identity && now->bytes == expected->bytes;
  } catch (const FileError&) {
    return false;  // now something else (larger, a FIFO, unreadable): it changed
  }
}

/// Waits (at most ~100 ms) until no process has `file` open for writing — a writer that
/// opened it before the rename and writes after it — so that a comparison sees its write. A
/// read lease (F_SETLEASE F_RDLCK) is granted only when there is no writer; it is released at
/// once. Best effort: returns at once where leases are refused (not the file's owner, NFS).
void wait_for_writers(const std::string& file) {
  const UniqueFd fd(::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd) return;
  for (int i = 0; i < 200; ++i) {
    if (::fcntl(fd.get(), F_SETLEASE, F_RDLCK) == 0) {
      ::fcntl(fd.get(), F_SETLEASE, F_UNLCK);
      return;
    }
    if (errno != EAGAIN) return;
    ::usleep(500);
  }
}

FileError replace_error(const fs::path& path, const std::string& problem) {
  return FileError(fmt::format("cannot replace {}: {}", path.string(), problem), path.string(),
                   problem);
}

/// Writes `content` to a new file `tmp` with `mode`; returns its inode.
uint64_t write_new_file(const std::string& tmp, std::string_view content, mode_t mode) {
  ::unlink(tmp.c_str());  // a leftover of a killed earlier process with this pid
  const UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  const auto fail = [&](int e) {
    ::unlink(tmp.c_str());
    return FileError(fmt::format("cannot write {}: {}", tmp, std::strerror(e)), tmp,
                     std::strerror(e));
  };
  if (!fd) throw fail(errno);
  std::size_t off = 0;
  while (off < content.size()) {
    const ssize_t n = ::write(fd.get(), content.data() + off, content.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw fail(n < 0 ? errno : EIO);
    off += static_cast<std::size_t>(n);
  }
  struct stat st {};
  if (::fchmod(fd.get(), mode & 07777) != 0 || ::fstat(fd.get(), &st) != 0) throw fail(errno);
  return static_cast<uint64_t>(st.st_ino);
}

}  // namespace

std::string file_type_name(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFIFO:
      return "a FIFO";
    case S_IFSOCK:
      return "a socket";
    case S_IFLNK:
      return "a symbolic link";
    default:
      return "not a regular file";
  }
}

std::optional<RegularFile> open_regular_file(const fs::path& path, std::string_view what,
                                             bool missing_ok) {
  return open_impl(path, what, missing_ok, std::nullopt);
}

FileContent read_regular_file(const fs::path& path, std::size_t max_bytes, std::string_view what) {
  return *read_impl(path, max_bytes, what, false);
}

std::optional<FileContent> read_regular_file_if_exists(const fs::path& path, std::size_t max_bytes,
                                                       std::string_view what) {
  return read_impl(path, max_bytes, what, true);
}

std::optional<FileIdentity> file_identity(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return identity_of(st);
}

std::optional<FileIdentity> file_identity(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::nullopt;
  return identity_of(st);
}

bool replace_file_if_unchanged(const fs::path& path, const std::optional<FileContent>& expected,
                               std::string_view content, mode_t mode, const ReplaceHook& hook) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp =
      fmt::format("{}.gpurun-tmp.{}.{}", path.string(), ::getpid(), counter.fetch_add(1));
  const uint64_t ours = write_new_file(tmp, content, mode);
  const auto drop_tmp = [&] { ::unlink(tmp.c_str()); };
  if (hook) hook("before_check");
  if (!still_holds(path, expected)) return drop_tmp(), false;
  if (hook) hook("before_rename");
  if (!expected) {
    // Created only where nothing is: link() fails with EEXIST when a file appeared.
    if (::link(tmp.c_str(), path.c_str()) == 0) return drop_tmp(), true;
    const int e = errno;
    if (e == EEXIST) return drop_tmp(), false;
    if (e != EPERM && e != ENOTSUP && e != EOPNOTSUPP) {
      drop_tmp();
      throw replace_error(path, std::strerror(e));
    }
    // A file system without hard links: a plain rename (the check above stands).
  } else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0) {
    // `tmp` now holds what `path` held at the exchange: the version read, unless an edit
    // landed after the check (an editor's save renamed over it, an in-place write). Compared
    // at once (a stat and a read: microseconds) and, when it differs, put back at once: while
    // gpurun's version is at the path an editor may read it (`sed -i` reads, then renames its
    // copy over the path) and so drop the edit that landed; only the exchange itself is that
    // window now, not the wait for writers below.
    if (hook) hook("exchanged");
    bool kept = still_holds(tmp, expected);
    if (kept) {
      // The version read: gpurun's may stay. A writer that opened the file before the
      // exchange (`echo x >> file` between its open and its write) may still write into the
      // displaced file: waited for, then compared again.
      if (hook) hook("before_wait");
      wait_for_writers(tmp);
      kept = still_holds(tmp, expected);
    }
    if (kept) {
      // Success only for a change that is in the file now: an editor's save renamed over the
      // path after the exchange replaced gpurun's version (the save's edit stays; the caller
      // reads it and applies the change again).
      drop_tmp();
      const std::optional<FileIdentity> now = file_identity(path);
      return now && now->inode == ours;
    }
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) != 0)
      throw replace_error(path, fmt::format("it changed while gpurun replaced it, and its new "
                                            "version, moved to {}, cannot be put back: {}",
                                            tmp, std::strerror(errno)));
    if (hook) hook("swapped_back");
    // `tmp` holds gpurun's version again, with whatever was written into it while it was in
    // place. Two edits that crossed can't be merged: the other one is kept, and said.
    wait_for_writers(tmp);
    std::optional<FileContent> back;
    try {
      back = read_impl(tmp, content.size() + 1, "the file", true);
    } catch (const FileError&) {
    }
    if (!back || back->identity.inode != ours || back->bytes != content)
      throw replace_error(path, fmt::format("it was edited twice while gpurun replaced it, "
                                            "and the edits cannot be merged: {} holds one, {} "
                                            "the other; merge them by hand",
                                            path.string(), tmp));
    return drop_tmp(), false;
  } else if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP && errno != EOPNOTSUPP) {
    const int e = errno;
    drop_tmp();
    throw replace_error(path, std::strerror(e));
  }
  // No exchange on this file system (NFS, old kernels): a plain rename right after the check.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    drop_tmp();
    throw replace_error(path, std::strerror(e));
  }
  return true;
}

}  // namespace gpurun
