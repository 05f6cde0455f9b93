// gpurun::HelperProcess (launcher/common/include/gpurun/helper_process.hpp): what a helper
// program sees when it starts (signals, group, descriptors, environment), its output, a wait
// past its timeout and the kill of its group, and a program that cannot start.
#include "gpurun/helper_process.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

using gpurun::HelperError;
using gpurun::HelperGroup;
using gpurun::HelperOptions;
using gpurun::HelperProcess;
using gpurun::HelperStream;
using namespace std::chrono_literals;

namespace {

/// The signal set `field` ("SigBlk", "SigIgn") of /proc/self/status of a program that the
/// helper runs (grep reports its own), bit n-1 for signal n, without glibc's internal signals
/// 32 and 33 (posix_spawn's child sets them SIG_IGN while gpurun has handlers for them).
unsigned long long child_signal_set(const char* field, HelperOptions o = {}) {
  o.argv = {"/bin/grep", std::string("^") + field + ":", "/proc/self/status"};
  o.stdout_stream = HelperStream::pipe();
  HelperProcess p(o);
  const std::string line = p.read_stdout();
  CHECK(p.wait() == 0);
  const auto colon = line.find(':');
  REQUIRE(colon != std::string::npos);
  constexpr unsigned long long kGlibcInternal = (1ULL << 31) | (1ULL << 32);
  return std::stoull(line.substr(colon + 1), nullptr, 16) & ~kGlibcInternal;
}

/// Restores a signal's disposition and this thread's mask at the end of a test.
struct SignalState {
  sigset_t mask;
  struct sigaction pipe_action {};
  SignalState() {
    ::pthread_sigmask(SIG_SETMASK, nullptr, &mask);
    ::sigaction(SIGPIPE, nullptr, &pipe_action);
  }
  ~SignalState() {
    ::pthread_sigmask(SIG_SETMASK, &mask, nullptr);
    ::sigaction(SIGPIPE, &pipe_action, nullptr);
  }
};

/// The one-letter state of `pid` in /proc (R, S, Z, ...), or '-' once it is gone.
char process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return '-';
  const auto paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() ? '-' : text[paren + 2];
}

}  // namespace

TEST_CASE("helper: it starts with an empty signal mask and default dispositions") {
  // The supervisor blocks signals in its threads and ignores SIGPIPE: the helper must not.
  const SignalState restore;
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR1);
  sigaddset(&block, SIGTERM);
  REQUIRE(::pthread_sigmask(SIG_BLOCK, &block, nullptr) == 0);
  ::signal(SIGPIPE, SIG_IGN);
  CHECK(child_signal_set("SigBlk") == 0);
  CHECK(child_signal_set("SigIgn") == 0);

  // blocked_signals: those, and only those, start blocked (their dispositions are gpurun's).
  HelperOptions o;
  o.blocked_signals = {SIGPIPE, SIGHUP};
  const unsigned long long want = (1ULL << (SIGPIPE - 1)) | (1ULL << (SIGHUP - 1));
  CHECK(child_signal_set("SigBlk", o) == want);
  CHECK(child_signal_set("SigIgn", o) == 1ULL << (SIGPIPE - 1));
}

TEST_CASE("helper: its process group: gpurun's, its own, or its own session") {
  HelperOptions o;
  o.argv = {"/bin/sleep", "30"};
  {
    HelperProcess p(o);
    CHECK(::getpgid(p.pid()) == ::getpgrp());
  }
  o.group = HelperGroup::kOwnGroup;
  {
    HelperProcess p(o);
    // posix_spawn returns once the child exec'd: its group is set by then.
    CHECK(::getpgid(p.pid()) == p.pid());
    CHECK(::getsid(p.pid()) == ::getsid(0));
  }
  o.group = HelperGroup::kOwnSession;
  {
    HelperProcess p(o);
    CHECK(::getsid(p.pid()) == p.pid());
    CHECK(::getpgid(p.pid()) == p.pid());
    const int status = p.kill_and_wait();
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);
  }
}

TEST_CASE("helper: stdout captured through a pipe; stderr to stdout, to a file, to /dev/null") {
  HelperOptions o;
  o.argv = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3"};
  o.stdout_stream = HelperStream::pipe();
  o.stderr_stream = HelperStream::to_stdout();
  {
    HelperProcess p(o);
    CHECK(p.read_stdout() == "out\nerr\n");
    const int status = p.wait();
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 3);
    CHECK(p.try_wait() == status);  // the same status again
  }
  char dir[] = "/tmp/helper_process_test.XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string log = std::string(dir) + "/log";
  o.stdout_stream = HelperStream::file(log);
  o.stderr_stream = HelperStream::null();
  {
    HelperProcess p(o);
    CHECK(WEXITSTATUS(p.wait()) == 3);
  }
  std::ifstream in(log);
  CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "out\n");
  ::unlink(log.c_str());
  ::rmdir(dir);

  // stdin from a pipe: the caller writes, the helper reads to EOF.
  HelperOptions c;
  c.argv = {"/bin/cat"};
  c.stdin_stream = HelperStream::pipe();
  c.stdout_stream = HelperStream::pipe();
  HelperProcess cat(c);
  REQUIRE(::write(cat.pipe(0).get(), "abc", 3) == 3);
  cat.pipe(0).reset();
  CHECK(cat.read_stdout() == "abc");
  CHECK(cat.wait() == 0);
}

TEST_CASE("helper: past its timeout it is killed with what it started (its own group)") {
  HelperOptions o;
  o.argv = {"/bin/sh", "-c", "sleep 30 & echo $!; wait"};
  o.group = HelperGroup::kOwnGroup;
  o.stdout_stream = HelperStream::pipe();
  HelperProcess p(o);
  std::string line;
  char c = 0;
  while (::read(p.pipe(1).get(), &c, 1) == 1 && c != '\n') line += c;
  const pid_t grandchild = static_cast<pid_t>(std::stol(line));
  CHECK(p.wait_for(50ms) == std::nullopt);
  CHECK(p.try_wait() == std::nullopt);
  const int status = p.kill_and_wait();
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  // The sleep got the same SIGKILL: it is a zombie (its new parent reaps it) or gone.
  char state = process_state(grandchild);
  for (int i = 0; i < 500 && state != 'Z' && state != '-'; ++i) {
    std::this_thread::sleep_for(10ms);  // the kill is delivered, not yet acted on
    state = process_state(grandchild);
  }
  CHECK_MESSAGE((state == 'Z' || state == '-'), "the sleep the helper started is in state ", state);
}

TEST_CASE("helper: a program that cannot start is an error naming it and the errno text") {
  HelperOptions o;
  o.argv = {"/nonexistent/helper-program", "x"};
  try {
    HelperProcess p(o);
    FAIL("it started");
  } catch (const HelperError& e) {
    CHECK(std::string(e.what()) ==
          "cannot start /nonexistent/helper-program: No such file or directory");
    CHECK(e.error_number() == ENOENT);
  }
  o.argv = {"no-such-helper-program-on-path"};
  o.search_path = true;
  try {
    HelperProcess p(o);
    FAIL("it started");
  } catch (const HelperError& e) {
    CHECK(std::string(e.what()) ==
          "cannot start no-such-helper-program-on-path: No such file or directory");
    CHECK(e.error_number() == ENOENT);
  }
  o.argv = {"/dev/null"};  // exists, not executable
  o.search_path = false;
  try {
    HelperProcess p(o);
    FAIL("it started");
  } catch (const HelperError& e) {
    CHECK(std::string(e.what()) == "cannot start /dev/null: Permission denied");
    CHECK(e.error_number() == EACCES);
  }
}

TEST_CASE("helper: only 0-2 and the descriptors given reach it, under the numbers given") {
  // A descriptor gpurun forgot to mark close-on-exec stays out.
  const int leaked = ::open("/dev/null", O_RDONLY);
  REQUIRE(leaked > 2);
  // Two pipes, each given to the helper under the other's number: a swap.
  int a[2], b[2];
  REQUIRE(::pipe2(a, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(b, O_CLOEXEC) == 0);
  REQUIRE(a[1] <= 9);  // sh redirects single-digit descriptors only
  REQUIRE(b[1] <= 9);
  HelperOptions o;
  o.argv = {"/bin/sh", "-c",
            "echo A >&" + std::to_string(b[1]) + "; echo B >&" + std::to_string(a[1]) +
                "; if test -e /proc/$$/fd/" + std::to_string(leaked) + "; then echo leaked; fi"};
  o.fds = {{a[1], b[1]}, {b[1], a[1]}};
  o.stdout_stream = HelperStream::pipe();
  HelperProcess p(o);
  ::close(a[1]);
  ::close(b[1]);
  CHECK(p.read_stdout() == "");
  CHECK(p.wait() == 0);
  char buf[16] = {};
  CHECK(::read(a[0], buf, sizeof buf) == 2);
  CHECK(std::string(buf, 2) == "A\n");
  CHECK(::read(b[0], buf, sizeof buf) == 2);
  CHECK(std::string(buf, 2) == "B\n");
  for (int fd : {a[0], b[0], leaked}) ::close(fd);
}

TEST_CASE("helper: the environment: gpurun's with replacements, or only the one given") {
  ::setenv("HELPER_TEST_KEPT", "kept", 1);
  ::setenv("HELPER_TEST_REPLACED", "old", 1);
  HelperOptions o;
  o.argv = {"/bin/sh", "-c", "echo \"$HELPER_TEST_KEPT $HELPER_TEST_REPLACED\""};
  o.environment = {"HELPER_TEST_REPLACED=new"};
  o.stdout_stream = HelperStream::pipe();
  {
    HelperProcess p(o);
    CHECK(p.read_stdout() == "kept new\n");
    CHECK(p.wait() == 0);
  }
  o.inherit_environment = false;
  HelperProcess p(o);
  CHECK(p.read_stdout() == " new\n");
  CHECK(p.wait() == 0);
  ::unsetenv("HELPER_TEST_KEPT");
  ::unsetenv("HELPER_TEST_REPLACED");
}

TEST_CASE("helper: the orphan reaper never takes a helper's exit; a released one it may") {
  HelperOptions o;
  o.argv = {"/bin/sh", "-c", "exit 4"};
  for (int i = 0; i < 20; ++i) {
    HelperProcess p(o);
    // As fast as it can, as the spawner's reaper does whenever a worker exits.
    while (!p.try_wait()) gpurun::reap_children_except({});
    CHECK(WEXITSTATUS(*p.try_wait()) == 4);
  }
  HelperProcess p(o);
  const pid_t pid = p.pid();
  p.release();
  // Once it exits the reaper takes it: no zombie is left under that pid.
  char state = process_state(pid);
  for (int i = 0; i < 500 && state != '-'; ++i) {
    gpurun::reap_children_except({});
    std::this_thread::sleep_for(10ms);
    state = process_state(pid);
  }
  CHECK(state == '-');
  CHECK(p.try_wait() == std::nullopt);  // given up: nothing to wait for
}

TEST_CASE("helper: waiting for one reaped elsewhere is an error naming it, with ECHILD") {
  HelperOptions o;
  o.argv = {"/bin/true"};
  HelperProcess p(o);
  REQUIRE(::waitpid(p.pid(), nullptr, 0) == p.pid());  // someone else took its exit
  try {
    p.wait();
    FAIL("waited");
  } catch (const HelperError& e) {
    CHECK(std::string(e.what()) ==
          "waiting for /bin/true (pid " + std::to_string(p.pid()) + ") failed: No child processes");
    CHECK(e.error_number() == ECHILD);
  }
}

TEST_CASE("helper: output_of: a program's stdout when it succeeds, else nothing") {
  CHECK(gpurun::output_of({"sh", "-c", "echo GPU 0; echo ignored >&2"}) == "GPU 0\n");
  CHECK(gpurun::output_of({"sh", "-c", "echo partial; exit 1"}) == std::nullopt);
  CHECK(gpurun::output_of({"no-such-helper-program-on-path", "-L"}) == std::nullopt);
  // Bounded: the answer within the bound; past it, nothing, and what it started is gone too.
  using namespace std::chrono_literals;
  CHECK(gpurun::output_of({"sh", "-c", "echo 2.11.0"}, 10s) == "2.11.0\n");
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(gpurun::output_of({"sh", "-c", "sleep 30 & echo $!; wait"}, 200ms) == std::nullopt);
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
}
