#include "control/config_watcher.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>
#include "gpurun_process.hpp"

namespace gpurun::control {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using gpurun::testing::TempDir;

/// open(O_TRUNC) + write + close: how most programs (and `echo >`) rewrite a file in place.
void write_in_place(const fs::path& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  REQUIRE(::close(fd) == 0);
}

/// Editor-style save: write a temp file next to it, then rename it over the original.
void write_via_rename(const fs::path& path, std::string_view text) {
  const fs::path temp = path.parent_path() / ("." + path.filename().string() + ".swp");
  write_in_place(temp, text);
  fs::rename(temp, path);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void shell(const std::string& command) {
  CAPTURE(command);
  REQUIRE(std::system(command.c_str()) == 0);
}

/// Only inotify can report changes here: the poll backstop is pushed out of the test's reach.
WatcherOptions inotify_only() {
  WatcherOptions options;
  options.debounce = 100ms;
  options.poll_interval = 1h;
  return options;
}

/// A watcher on a FakeClock whose on_change counts calls and records what the file held at
/// that moment; the io_context runs on the test thread, and only when the test says. File
/// events still come through inotify on the io_context: the kernel queues them inside the
/// write, rename or close that causes them, so pump() (run every ready handler) handles all
/// of what the test has done by then. The debounce and poll timers run only in advance().
class Watch {
 public:
  Watch(fs::path path, WatcherOptions options)
      : path_(std::move(path)), debounce_(options.debounce) {
    options.clock = &clock_;
    watcher_ = std::make_unique<ConfigWatcher>(io_, path_, std::move(options), [this] {
      ++calls_;
      seen_ = read_file(path_);
    });
  }

  /// Handles every file event and posted call already queued; never waits.
  void pump() {
    io_.restart();
    while (io_.poll() > 0) {
    }
  }
  /// pump(), then moves the clock by `d`, running the timers due by then, then pump().
  void advance(std::chrono::milliseconds d) {
    pump();
    clock_.advance(d);
    pump();
  }
  /// Handles the queued events, then advances the clock a debounce period at a time until
  /// `n` calls were made, for at most twice the longest hold-back (10 debounce periods while
  /// the file is open for writing); returns whether they were.
  bool run_until_calls(int n) {
    pump();
    for (int step = 0; calls_ < n && step < 22; ++step) advance(debounce_);
    return calls_ >= n;
  }
  /// Moves the clock by three debounce periods: long enough for any pending call to happen.
  void settle() { advance(3 * debounce_); }
  void run_for(std::chrono::milliseconds d) { advance(d); }
  gpurun::FakeClock& clock() { return clock_; }

  ConfigWatcher& watcher() { return *watcher_; }
  void destroy_watcher() { watcher_.reset(); }
  int calls() const { return calls_; }
  const std::string& seen() const { return seen_; }

 private:
  boost::asio::io_context io_;
  gpurun::FakeClock clock_;  // outlives the watcher and its timers
  fs::path path_;
  std::chrono::milliseconds debounce_;
  std::unique_ptr<ConfigWatcher> watcher_;
  int calls_ = 0;
  std::string seen_;
};

TEST_CASE("watcher: in-place write is seen once, after the writer is done") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  write_in_place(file, "active_gpus = [0, 1]\n");
  Watch w(file, inotify_only());
  REQUIRE(w.watcher().using_inotify());
  w.settle();
  CHECK(w.calls() == 0);  // no call without a change

  write_in_place(file, "active_gpus = [1]\n");
  REQUIRE(w.run_until_calls(1));
  w.settle();
  CHECK(w.calls() == 1);
  CHECK(w.seen() == "active_gpus = [1]\n");
}

TEST_CASE("watcher: temp file + rename (editor save) is seen") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  write_in_place(file, "active_gpus = [0, 1]\n");
  Watch w(file, inotify_only());
  REQUIRE(w.watcher().using_inotify());

  write_via_rename(file, "active_gpus = [0]\n");
  REQUIRE(w.run_until_calls(1));
  CHECK(w.seen() == "active_gpus = [0]\n");

  // The watch survives the replaced inode: a second save is seen too.
  write_via_rename(file, "active_gpus = []\n");
  REQUIRE(w.run_until_calls(2));
  CHECK(w.seen() == "active_gpus = []\n");
}

TEST_CASE("watcher: a finished save takes effect after `settle`, not the whole debounce") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  write_in_place(file, "active_gpus = [0, 1]\n");
  WatcherOptions options = inotify_only();
  options.debounce = 1h;  // only the writer-done window can call before the clock moves 1 h
  options.settle = 25ms;
  Watch w(file, options);
  REQUIRE(w.watcher().using_inotify());

  write_via_rename(file, "active_gpus = [0]\n");  // an editor's save: renamed into place
  w.advance(options.settle - 1ms);
  CHECK(w.calls() == 0);
  w.advance(1ms);
  REQUIRE(w.calls() == 1);
  CHECK(w.seen() == "active_gpus = [0]\n");
  write_in_place(file, "active_gpus = []\n");  // `echo >`: written, then closed
  w.advance(options.settle - 1ms);
  CHECK(w.calls() == 1);
  w.advance(1ms);
  REQUIRE(w.calls() == 2);
  CHECK(w.seen() == "active_gpus = []\n");
}

TEST_CASE("watcher: cp over the file is seen") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  const fs::path other = dir.path / "other.toml";
  write_in_place(file, "active_gpus = [0, 1]\n");
  write_in_place(other, "active_gpus = [3]\n");
  Watch w(file, inotify_only());
  REQUIRE(w.watcher().using_inotify());

  shell("cp '" + other.string() + "' '" + file.string() + "'");
  REQUIRE(w.run_until_calls(1));
  w.settle();
  CHECK(w.calls() == 1);
  CHECK(w.seen() == "active_gpus = [3]\n");
}

TEST_CASE("watcher: sed -i is seen") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  write_in_place(file, "[park]\nmode = \"release\"\n");
  Watch w(file, inotify_only());
  REQUIRE(w.watcher().using_inotify());

  shell("sed -i 's/release/hold/' '" + file.string() + "'");
  REQUIRE(w.run_until_calls(1));
  CHECK(w.seen() == "[park]\nmode = \"hold\"\n");
}

TEST_CASE("watcher: Kubernetes ConfigMap symlink swap is seen, repeatedly") {
  // dir/config.toml -> ..data/config.toml, dir/..data -> ..ts1 (what the kubelet builds).
  TempDir dir;
  const fs::path& d = dir.path;
  fs::create_directory(d / "..ts1");
  write_in_place(d / "..ts1" / "config.toml", "active_gpus = [0]\n");
  fs::create_directory_symlink("..ts1", d / "..data");
  fs::create_symlink("..data/config.toml", d / "config.toml");

  const auto swap_to = [&](const std::string& ts, std::string_view text) {
    fs::create_directory(d / ts);
    write_in_place(d / ts / "config.toml", text);
    fs::create_directory_symlink(ts, d / "..data_tmp");
    fs::rename(d / "..data_tmp", d / "..data");  // atomic re-point, as the kubelet does
  };

  Watch w(d / "config.toml", inotify_only());
  REQUIRE(w.watcher().using_inotify());

  swap_to("..ts2", "active_gpus = [1]\n");
  fs::remove_all(d / "..ts1");
  REQUIRE(w.run_until_calls(1));
  CHECK(w.seen() == "active_gpus = [1]\n");

  swap_to("..ts3", "active_gpus = [2]\n");
  fs::remove_all(d / "..ts2");
  REQUIRE(w.run_until_calls(2));
  CHECK(w.seen() == "active_gpus = [2]\n");

  // An in-place edit of the file the chain currently resolves to is seen too.
  write_in_place(d / "..ts3" / "config.toml", "active_gpus = [3]\n");
  REQUIRE(w.run_until_calls(3));
  CHECK(w.seen() == "active_gpus = [3]\n");
}

TEST_CASE("watcher: a burst of 20 writes yields exactly one call") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  write_in_place(file, "active_gpus = []\n");
  WatcherOptions options = inotify_only();
  options.debounce = 200ms;
  options.settle = options.debounce;  // each write closes the file: the burst is the window
  Watch w(file, options);
  REQUIRE(w.watcher().using_inotify());

  const auto start = w.clock().now();
  std::string last;
  for (int i = 0; i < 20; ++i) {
    last = "# write " + std::to_string(i) + "\nactive_gpus = [" + std::to_string(i % 4) + "]\n";
    write_in_place(file, last);
    w.run_for(1ms);  // the watcher sees each write as it happens, 1 ms apart
  }
  const auto burst = w.clock().now() - start;
  CAPTURE(std::chrono::duration_cast<std::chrono::milliseconds>(burst).count());
  REQUIRE(burst < options.debounce);  // otherwise the burst was too slow to test debouncing

  REQUIRE(w.run_until_calls(1));
  w.settle();
  CHECK(w.calls() == 1);
  CHECK(w.seen() == last);
}

TEST_CASE("watcher: a file still open for writing is not reported half-written") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  write_in_place(file, "active_gpus = [0, 1, 2, 3]\n");
  WatcherOptions options = inotify_only();
  options.debounce = 50ms;
  Watch w(file, options);
  REQUIRE(w.watcher().using_inotify());

  // A slow writer: truncates, writes half, pauses longer than the debounce, then finishes.
  const int fd = ::open(file.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  REQUIRE(fd >= 0);
  const std::string_view head = "active_gpus = [";
  const std::string_view tail = "1]\n";
  REQUIRE(::write(fd, head.data(), head.size()) == static_cast<ssize_t>(head.size()));
  w.settle();
  CHECK(w.calls() == 0);
  REQUIRE(::write(fd, tail.data(), tail.size()) == static_cast<ssize_t>(tail.size()));
  REQUIRE(::close(fd) == 0);
  REQUIRE(w.run_until_calls(1));
  w.settle();
  CHECK(w.calls() == 1);
  CHECK(w.seen() == "active_gpus = [1]\n");
}

TEST_CASE("watcher: other files in the same directory are ignored") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  write_in_place(file, "active_gpus = [0]\n");
  Watch w(file, inotify_only());
  REQUIRE(w.watcher().using_inotify());

  for (int i = 0; i < 5; ++i) write_in_place(dir.path / "events.jsonl", "{}\n");
  write_via_rename(dir.path / "notes.toml", "x = 1\n");
  w.settle();
  CHECK(w.calls() == 0);

  write_in_place(file, "active_gpus = [1]\n");  // and the real file still is not
  REQUIRE(w.run_until_calls(1));
}

TEST_CASE("watcher: a file created later, and a deleted file, are reported") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  Watch w(file, inotify_only());
  REQUIRE(w.watcher().using_inotify());

  write_via_rename(file, "active_gpus = [2]\n");
  REQUIRE(w.run_until_calls(1));
  CHECK(w.seen() == "active_gpus = [2]\n");

  fs::remove(file);
  REQUIRE(w.run_until_calls(2));
  CHECK(w.seen().empty());
}

TEST_CASE("watcher: request_reload (SIGHUP) calls on_change without any change") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  write_in_place(file, "active_gpus = [0]\n");
  Watch w(file, inotify_only());
  w.settle();
  REQUIRE(w.calls() == 0);

  w.watcher().request_reload();
  REQUIRE(w.run_until_calls(1));
  w.settle();
  CHECK(w.calls() == 1);
  CHECK(w.seen() == "active_gpus = [0]\n");

  w.watcher().request_reload();
  w.watcher().request_reload();
  REQUIRE(w.run_until_calls(3));  // each request is honoured
}

TEST_CASE("watcher: polling fallback sees replaced and rewritten files") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  write_in_place(file, "active_gpus = [0]\n");
  WatcherOptions options;
  options.force_polling = true;
  options.debounce = 50ms;
  options.poll_interval = 50ms;
  Watch w(file, options);
  CHECK_FALSE(w.watcher().using_inotify());
  w.settle();
  CHECK(w.calls() == 0);

  write_via_rename(file, "active_gpus = [1]\n");
  REQUIRE(w.run_until_calls(1));
  CHECK(w.seen() == "active_gpus = [1]\n");

  SUBCASE("same size and mtime, different content: caught by the content hash") {
    struct stat before {};
    REQUIRE(::stat(file.c_str(), &before) == 0);
    write_in_place(file, "active_gpus = [2]\n");
    const struct timespec times[2] = {before.st_atim, before.st_mtim};
    REQUIRE(::utimensat(AT_FDCWD, file.c_str(), times, 0) == 0);
    REQUIRE(w.run_until_calls(2));
    CHECK(w.seen() == "active_gpus = [2]\n");
  }
  SUBCASE("deleted file") {
    fs::remove(file);
    REQUIRE(w.run_until_calls(2));
    CHECK(w.seen().empty());
  }
}

TEST_CASE("watcher: no call after the watcher is destroyed") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  write_in_place(file, "active_gpus = [0]\n");
  WatcherOptions options = inotify_only();
  options.poll_interval = 20ms;
  Watch w(file, options);
  write_in_place(file, "active_gpus = [1]\n");
  w.run_for(10ms);  // the change is noticed, the debounced call still pending
  w.watcher().request_reload();
  w.destroy_watcher();
  write_in_place(file, "active_gpus = [2]\n");
  w.settle();
  w.settle();
  CHECK(w.calls() == 0);
}

TEST_CASE("watcher: inotify plus the poll backstop report one change once") {
  TempDir dir;
  const fs::path file = dir.path / "config.toml";
  write_in_place(file, "active_gpus = [0]\n");
  WatcherOptions options;
  options.debounce = 50ms;
  options.poll_interval = 20ms;  // polls several times while the change is pending and after
  Watch w(file, options);
  REQUIRE(w.watcher().using_inotify());

  write_via_rename(file, "active_gpus = [1]\n");
  REQUIRE(w.run_until_calls(1));
  w.run_for(300ms);
  CHECK(w.calls() == 1);
}

}  // namespace
}  // namespace gpurun::control
