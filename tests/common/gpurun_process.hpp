// Test helpers shared by the integration tests that run the real gpurun binary:
// a scratch directory, one child process with its output captured to files, and poll_until,
// the one polling loop of these tests (a test waits for a thing, never for a time).
#pragma once

#include <ftw.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "poll.hpp"  // poll_until, the one polling wait

namespace gpurun::testing {
/// 0 when a TCP connection to numeric `host`:`port` is accepted (and closed at once), else the
/// errno of connect.
inline int connect_errno(const std::string& host, const std::string& port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  REQUIRE(::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) == 0);
  const int s = ::socket(res->ai_family, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  const int rc = ::connect(s, res->ai_addr, res->ai_addrlen);
  const int err = rc == 0 ? 0 : errno;
  ::close(s);
  ::freeaddrinfo(res);
  return err;
}

/// A loopback TCP port that was free a moment ago (bind port 0, read it back, close), as text
/// for --master-port.
inline std::string free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(s);
  return std::to_string(ntohs(addr.sin_port));
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// A unique scratch directory (mkdtemp under the temp dir), removed at the end of the test.
/// Recursive delete with nftw. Not std::filesystem::remove_all: the LibTorch 2.11 wheel's
/// libtorch.so exports its own copy of that function, which crashes when called from a test
/// linked against it.
inline void remove_tree(const std::string& root) {
  ::nftw(
      root.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) {
        ::remove(p);  // best effort, like remove_all with an error_code: go on
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "gpurun-it") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { remove_tree(path.string()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
};

/// A FIFO that workers wait on (sh: `read -r go < PATH`) until the test calls release(): held
/// open read-write here (close-on-exec), so a reader never blocks in open() and released lines
/// wait in the pipe for a reader that comes later. Replaces a worker's poll for a file.
class GoFifo {
 public:
  /// `create` false: `p` was made with make() earlier (before the workers started).
  explicit GoFifo(std::filesystem::path p, bool create = true) : path_(std::move(p)) {
    if (create) make(path_);
    fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    REQUIRE(fd_ >= 0);
  }
  ~GoFifo() { ::close(fd_); }
  GoFifo(const GoFifo&) = delete;
  GoFifo& operator=(const GoFifo&) = delete;
  /// One line for each of `readers` readers (a shell's `read` takes one), now or later.
  void release(int readers = 64) {
    const std::string lines(static_cast<std::size_t>(readers), '\n');
    REQUIRE(::write(fd_, lines.data(), lines.size()) == static_cast<ssize_t>(lines.size()));
  }
  const std::filesystem::path& path() const { return path_; }
  static void make(const std::filesystem::path& p) { REQUIRE(::mkfifo(p.c_str(), 0600) == 0); }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

/// One child process running `argv` (argv[0] is the executable path) with `env` added
/// to this process's environment and stdout/stderr written to the files `out`/`err`.
/// Killed with SIGKILL by the destructor if it is still running.
struct ChildProcess {
  pid_t pid = -1;
  std::filesystem::path out, err;
  std::optional<int> status;  // raw waitpid status

  /// `nofile`: RLIMIT_NOFILE {soft, hard} to start the child with.
  ChildProcess(std::vector<std::string> argv, const std::map<std::string, std::string>& env,
               std::filesystem::path out_file, std::filesystem::path err_file,
               std::optional<rlimit> nofile = std::nullopt)
      : out(std::move(out_file)), err(std::move(err_file)) {
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(o, 1);
      ::dup2(e, 2);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      if (nofile && ::setrlimit(RLIMIT_NOFILE, &*nofile) != 0) ::_exit(125);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(126);
    }
  }
  ~ChildProcess() {
    if (!status && pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  /// Waits up to `limit`; true when the child exited.
  bool wait(std::chrono::milliseconds limit) {
    return poll_until(
        [this] {
          int st = 0;
          if (!status && ::waitpid(pid, &st, WNOHANG) == pid) status = st;
          return status.has_value();
        },
        limit);
  }
  /// Shell-style exit code (128+signal for a signal death); -1 if still running.
  int code() const {
    if (!status) return -1;
    return WIFSIGNALED(*status) ? 128 + WTERMSIG(*status) : WEXITSTATUS(*status);
  }
  std::string stdout_text() const { return slurp(out); }
  std::string stderr_text() const { return slurp(err); }
};

}  // namespace gpurun::testing
