// gpurun::read_regular_file — the one way gpurun reads a file it is told about (config.toml,
// leases.json, status.json, the energy profile cache and history, the power journal, event
// logs, a run directory's owner file): non-blocking, a regular file only, a bounded size.
// A FIFO nobody writes, /dev/zero, a directory or a symlink loop is an error naming the path
// and what it is — never a hang, never unbounded memory. Policy: docs/errors.md.
// Also: FileIdentity and replace_file_if_unchanged, the check that keeps a read-modify-write
// (`gpurun set`, `lend`, `reclaim`) from crossing a concurrent edit.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "gpurun/error.hpp"
#include "gpurun/unique_fd.hpp"

namespace gpurun {

/// The default bound of read_regular_file: 16 MiB.
inline constexpr std::size_t kDefaultMaxFileBytes = std::size_t{16} << 20;

/// A file that cannot be read as a regular file of at most the bound. what() is the whole
/// sentence ("cannot read the leases file /r/leases.json: it is a FIFO, not a regular file");
/// problem() only the part after the path ("it is a FIFO, not a regular file").
class FileError : public Error {
 public:
  FileError(std::string message, std::string path, std::string problem)
      : Error(std::move(message)), path_(std::move(path)), problem_(std::move(problem)) {}
  const std::string& path() const { return path_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string path_;
  std::string problem_;
};

/// Which version of a file a path named: device, inode, size and modification time (ns).
/// Two reads of one unchanged file give equal identities; a rename over it or a write to it
/// (which moves mtime or size) gives another one.
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t size_bytes = 0;
  int64_t mtime_ns = 0;
  friend bool operator==(const FileIdentity&, const FileIdentity&) = default;
};

/// What read_regular_file read: the bytes and the identity of the file they came from (by
/// fstat of the open descriptor, so both describe the same file).
struct FileContent {
  std::string bytes;
  FileIdentity identity;
};

/// "a FIFO", "a directory", "a character device", "a block device", "a socket", "a symbolic
/// link", "a regular file" (st_mode's type bits).
std::string file_type_name(mode_t mode);

/// An open regular file: its descriptor (O_RDONLY|O_NONBLOCK|O_CLOEXEC) and identity.
struct RegularFile {
  UniqueFd fd;
  FileIdentity identity;
};

/// The checks of read_regular_file without the read, for a reader that streams (an event log)
/// or maps (a snapshot) a file too large to hold: stat(), refuse what is not a regular file,
/// open non-blocking, fstat() again. nullopt when `path` does not exist and `missing_ok`.
/// Throws FileError as read_regular_file (no size bound: the caller reads with its own).
std::optional<RegularFile> open_regular_file(const std::filesystem::path& path,
                                             std::string_view what = "the file",
                                             bool missing_ok = false);

/// Reads the whole of `path` (symlinks followed). The path is stat()ed first, so a device or
/// a FIFO is never even opened; then opened O_RDONLY|O_NONBLOCK|O_CLOEXEC and fstat()ed
/// again (a swap after the stat is caught). Reads at most `max_bytes` (a file that grows
/// while read is cut there and refused). Blocks only on regular-file I/O (never on a FIFO,
/// a terminal or a device). `what` names the file in messages ("the config file").
/// Throws FileError: "cannot read {what} {path}: {problem}", the problem one of
/// "it is a FIFO, not a regular file" (directory, character device, …), "a symlink loop
/// (Too many levels of symbolic links)", "unreadable: Permission denied", "it does not
/// exist", "it is N bytes, more than the limit of M bytes".
FileContent read_regular_file(const std::filesystem::path& path,
                              std::size_t max_bytes = kDefaultMaxFileBytes,
                              std::string_view what = "the file");

/// As read_regular_file, for the callers where a missing file is fine: nullopt when `path`
/// does not exist (ENOENT). Every other problem throws FileError as above.
std::optional<FileContent> read_regular_file_if_exists(const std::filesystem::path& path,
                                                       std::size_t max_bytes = kDefaultMaxFileBytes,
                                                       std::string_view what = "the file");

/// The identity of what `path` names now (stat, symlinks followed); nullopt when it does not
/// exist or cannot be stat()ed. Never throws.
std::optional<FileIdentity> file_identity(const std::filesystem::path& path);
/// The identity of the open file `fd` (fstat); nullopt when fstat fails. Never throws.
std::optional<FileIdentity> file_identity(int fd);

/// Test seam of replace_file_if_unchanged: runs at a named step ("before_check": the new
/// file is written, nothing compared yet; "before_rename": the check passed, the rename is
/// next; after an exchange: "exchanged": gpurun's version is at the path, the displaced file
/// not yet compared; "before_wait": the displaced file is the version read, the wait for its
/// writers is next; "swapped_back": it was not, and is back at the path). A test edits or
/// reads the file there to make a crossing deterministic. Empty: nothing.
using ReplaceHook = std::function<void(std::string_view step)>;

/// The last step of a read-modify-write: writes `content` to a temp file next to `path`
/// (`<path>.gpurun-tmp.<pid>.<n>`, mode `mode`) and renames it over `path` only if `path`
/// still holds what was read: `expected` (nullopt: the file was missing and must still be)
/// compared by identity and content (a re-read just before the rename). Where the file system
/// can, the rename is an exchange (renameat2 RENAME_EXCHANGE): the file it displaced is
/// compared at once, and an edit found there is put back at once (an editor that reads the
/// path meanwhile sees gpurun's version only for those microseconds); when it matched, it is
/// compared again once no process has it open for writing (a read lease, waited for up to
/// ~100 ms: `echo x >> file` caught between its open and its write). Returns true when
/// `content` is at the path when it returns; false when the file changed under the caller
/// (an edit put back, or a save renamed over gpurun's version: re-read and retry). Blocks on file
/// I/O. Throws FileError naming the path when the temp file cannot be written, the rename fails, or
/// two edits crossed gpurun's and each other so that they cannot both be kept ("it was edited twice
/// …": the other version is left in the temp file, named).
bool replace_file_if_unchanged(const std::filesystem::path& path,
                               const std::optional<FileContent>& expected, std::string_view content,
                               mode_t mode, const ReplaceHook& hook = {});

}  // namespace gpurun
