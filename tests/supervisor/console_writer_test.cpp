#include "supervisor/console_writer.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

using namespace gpurun::supervisor;

namespace {

/// A pipe whose read end the test drains only when it chooses to (a console nobody reads).
struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    r = fds[0];
    w = fds[1];
  }
  ~Pipe() {
    if (r >= 0) ::close(r);
    if (w >= 0) ::close(w);
  }
  /// Everything readable now (the read end switched to non-blocking).
  std::string drain() {
    ::fcntl(r, F_SETFL, ::fcntl(r, F_GETFL) | O_NONBLOCK);
    std::string out;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(r, buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
};

/// "line 000042 xxxx…\n", 1000 bytes.
std::string numbered(int i) {
  char head[32];
  std::snprintf(head, sizeof head, "line %06d ", i);
  std::string line(head);
  line.resize(999, 'x');
  return line + "\n";
}

}  // namespace

TEST_CASE(
    "console writer: a reader that does not read never blocks write(); what it missed "
    "is counted and said once") {
  Pipe out, err;
  ConsoleWriter::Options o;
  o.out_fd = out.w;
  o.err_fd = err.w;
  o.max_pending_bytes = 256 * 1024;
  ConsoleWriter writer(o);
  writer.set_drop_hint("the log files have them");
  // 4 MB of lines into a 64 KiB pipe nobody reads: a blocking write would hang here (the
  // test's ctest TIMEOUT ends it); the writer queues 256 KiB and drops the rest.
  constexpr int kLines = 4000;
  int accepted = 0;
  for (int i = 0; i < kLines; ++i)
    accepted += writer.write(1, numbered(i), ConsoleWriter::Origin::kWorker) ? 1 : 0;
  CHECK(accepted < kLines);
  CHECK(writer.dropped_lines() == static_cast<uint64_t>(kLines - accepted));
  CHECK(writer.dropped_bytes() == static_cast<uint64_t>(kLines - accepted) * 1000);

  // The reader comes back: everything queued arrives, whole lines in order, then the notice.
  std::string shown;
  std::string said;
  for (int tries = 0; said.find('\n') == std::string::npos; ++tries) {
    REQUIRE_MESSAGE(tries < 300, "no notice after 30 s; stdout had " << shown.size() << " bytes");
    pollfd p[2] = {{out.r, POLLIN, 0}, {err.r, POLLIN, 0}};
    ::poll(p, 2, 100);
    shown += out.drain();
    said += err.drain();
  }
  REQUIRE(writer.flush(std::chrono::milliseconds::max()));
  shown += out.drain();
  CHECK(shown.size() == static_cast<size_t>(accepted) * 1000);
  for (int i = 0; i < accepted; ++i) {
    CAPTURE(i);
    REQUIRE(shown.compare(static_cast<size_t>(i) * 1000, 1000, numbered(i)) == 0);
  }
  CHECK(said ==
        "gpurun: warning: the console was not read for a while (a paused pager, Ctrl-S, "
        "a slow pipe): " +
            std::to_string(kLines - accepted) + " lines (" +
            std::to_string((kLines - accepted) * 1000) +
            " bytes) of output were not shown; the log files have them\n");
  // Output after the reader is back is shown again.
  CHECK(writer.write(1, "after\n", ConsoleWriter::Origin::kWorker));
  CHECK(writer.write(2, "gpurun: after\n"));
  REQUIRE(writer.flush(std::chrono::milliseconds::max()));
  CHECK(out.drain() == "after\n");
  CHECK(err.drain() == "gpurun: after\n");
}

TEST_CASE("console writer: stop() with a reader that never reads returns and joins") {
  Pipe out;
  ConsoleWriter::Options o;
  o.out_fd = out.w;
  o.err_fd = out.w;  // one destination: one thread, stdout and stderr in order
  o.max_pending_bytes = 1 << 20;
  ConsoleWriter writer(o);
  for (int i = 0; i < 200; ++i) writer.write(i % 2 == 0 ? 1 : 2, numbered(i));
  // The thread is blocked in write(2) on the full pipe: stop() interrupts it.
  const uint64_t abandoned = writer.stop(std::chrono::milliseconds(50));
  CHECK(abandoned > 0);
  CHECK_FALSE(writer.write(1, "late\n"));  // after stop: dropped, never blocks
  const std::string shown = out.drain();
  // Every byte was either shown or abandoned (a write cut short counts in both).
  CHECK(shown.size() + abandoned >= 200u * 1000);
  CHECK(shown.size() + abandoned <= 201u * 1000);
  for (size_t i = 0; i + 1000 <= shown.size(); i += 1000)
    REQUIRE(shown.compare(i, 1000, numbered(static_cast<int>(i / 1000))) == 0);
}

TEST_CASE("console writer: a reader that is gone (EPIPE) is dropped; the other stream goes on") {
  Pipe out, err;
  ::close(out.r);
  out.r = -1;
  ConsoleWriter::Options o;
  o.out_fd = out.w;
  o.err_fd = err.w;
  ConsoleWriter writer(o);
  writer.write(1, "to nobody\n");
  writer.write(2, "gpurun: to the terminal\n");
  REQUIRE(writer.flush(std::chrono::milliseconds::max()));
  CHECK(err.drain() == "gpurun: to the terminal\n");
}

TEST_CASE("console writer: a regular file gets every line of a burst, none dropped") {
  char path[] = "/tmp/gpurun-console-writer-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  Pipe err;
  ConsoleWriter::Options o;
  o.out_fd = fd;
  o.err_fd = err.w;
  o.max_pending_bytes = 1000;  // one line: a burst outruns any writer thread
  {
    ConsoleWriter writer(o);
    for (int i = 0; i < 4000; ++i)
      CHECK(writer.write(1, numbered(i), ConsoleWriter::Origin::kWorker));
    CHECK(writer.dropped_lines() == 0);
  }  // the destructor writes the rest
  std::string shown(4000 * 1000, '\0');
  CHECK(::pread(fd, shown.data(), shown.size(), 0) == static_cast<ssize_t>(shown.size()));
  for (int i = 0; i < 4000; ++i) {
    CAPTURE(i);
    REQUIRE(shown.compare(static_cast<size_t>(i) * 1000, 1000, numbered(i)) == 0);
  }
  ::close(fd);
  ::unlink(path);
}

TEST_CASE("console writer: gpurun's own lines are kept when a worker's are dropped") {
  Pipe out;
  // The pipe full before the writer starts: its thread blocks on its first write, so nothing
  // queued drains until the test reads (no race with the thread).
  ::fcntl(out.w, F_SETFL, ::fcntl(out.w, F_GETFL) | O_NONBLOCK);
  const std::string fill(4096, 'f');
  size_t prefilled = 0;
  for (ssize_t n; (n = ::write(out.w, fill.data(), fill.size())) > 0;)
    prefilled += static_cast<size_t>(n);
  ::fcntl(out.w, F_SETFL, ::fcntl(out.w, F_GETFL) & ~O_NONBLOCK);
  ConsoleWriter::Options o;
  o.out_fd = out.w;
  o.err_fd = out.w;  // `2>&1 |`: one destination
  o.max_pending_bytes = 64 * 1024;
  ConsoleWriter writer(o);
  int dropped = 0;
  for (int i = 0; i < 1000; ++i)
    dropped += writer.write(1, numbered(i), ConsoleWriter::Origin::kWorker) ? 0 : 1;
  REQUIRE(dropped > 0);
  CHECK(writer.write(2, "gpurun: rank 0 failed\n"));  // gpurun's own: queued past the bound
  CHECK_FALSE(writer.write(1, numbered(1000), ConsoleWriter::Origin::kWorker));
  std::string shown;
  for (int tries = 0; shown.find("gpurun: warning:") == std::string::npos; ++tries) {
    REQUIRE_MESSAGE(tries < 300, "no notice after 30 s");
    pollfd p{out.r, POLLIN, 0};
    ::poll(&p, 1, 100);
    shown += out.drain();
  }
  REQUIRE(writer.flush(std::chrono::milliseconds::max()));
  shown += out.drain();
  CHECK(shown.substr(0, prefilled) == std::string(prefilled, 'f'));
  CHECK(shown.find("gpurun: rank 0 failed\n") != std::string::npos);
  CHECK(shown.find("not shown") != std::string::npos);
}
