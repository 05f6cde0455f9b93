#include "supervisor/run_dir.hpp"
#include "supervisor/worker_env.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

using namespace gpurun::supervisor;
namespace fs = std::filesystem;

namespace {
/// A scratch TMPDIR for the test, restored and removed at the end.
struct ScratchTmp {
  fs::path path;
  std::string old;
  bool had_old = false;
  ScratchTmp() {
    std::string tmpl = (fs::temp_directory_path() / "gpurun-rdtest-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
    if (const char* t = std::getenv("TMPDIR")) old = t, had_old = true;
    ::setenv("TMPDIR", path.c_str(), 1);
  }
  ~ScratchTmp() {
    if (had_old)
      ::setenv("TMPDIR", old.c_str(), 1);
    else
      ::unsetenv("TMPDIR");
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

int dead_pid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}
}  // namespace

TEST_CASE("run dir: --log-dir gets a unique <run_id>_XXXXXX per run") {
  ScratchTmp tmp;
  const std::string logs = (tmp.path / "logs" / "deeper").string();
  RunDir a = make_run_dir(logs, "job");
  RunDir b = make_run_dir(logs, "job");
  CHECK(a.path != b.path);
  CHECK_FALSE(a.temporary);
  for (const RunDir* d : {&a, &b}) {
    CHECK(fs::is_directory(d->path));
    CHECK(fs::path(d->path).parent_path() == fs::absolute(logs));
    CHECK(fs::path(d->path).filename().string().rfind("job_", 0) == 0);
  }
  release_run_dir(a, false);  // never removes a --log-dir directory
  CHECK(fs::is_directory(a.path));
}

TEST_CASE("run dir: temporary dirs live under $TMPDIR/gpurun-<uid>/runs and stale ones go") {
  ScratchTmp tmp;
  const std::string base = temp_run_base();
  CHECK(base == (tmp.path / ("gpurun-" + std::to_string(::getuid())) / "runs").string());
  RunDir mine = make_run_dir(std::nullopt, "a/b c");
  CHECK(mine.temporary);
  CHECK(fs::path(mine.path).parent_path() == base);
  CHECK(fs::path(mine.path).filename().string().rfind("gpurun-a_b_c-", 0) == 0);
  CHECK(fs::exists(fs::path(mine.path) / "owner"));
  {  // the owner file names our pid namespace
    std::ifstream owner(fs::path(mine.path) / "owner");
    std::string pid, started, ns;
    owner >> pid >> started >> ns;
    CHECK(ns == fs::read_symlink("/proc/self/ns/pid").string());
  }

  // A dir whose owner died (kill -9 of gpurun), one without owner (kept logs), and ours.
  const fs::path stale = fs::path(base) / "gpurun-none-dead00";
  fs::create_directories(stale / "attempt_0");
  std::ofstream(stale / "owner") << dead_pid() << " 12345\n";
  const fs::path reused = fs::path(base) / "gpurun-none-reuse0";  // live pid, other start time
  fs::create_directories(reused);
  std::ofstream(reused / "owner") << 1 << " 999999999999\n";
  const fs::path kept = fs::path(base) / "gpurun-none-kept00";
  fs::create_directories(kept);
  // A gpurun of another pid namespace (a container or `unshare -p` sharing /tmp): its pid
  // cannot be looked up here, so its run dir is never taken for a dead owner's. Before, a
  // node of the network-namespace tests deleted the run dirs of every gpurun beside it.
  const fs::path other_ns = fs::path(base) / "gpurun-none-otherns";
  fs::create_directories(other_ns);
  std::ofstream(other_ns / "owner") << dead_pid() << " 12345 pid:[1]\n";
  // Ours names our namespace: a dead owner of ours is still found.
  const fs::path dead_ns = fs::path(base) / "gpurun-none-deadns";
  fs::create_directories(dead_ns);
  std::ofstream(dead_ns / "owner")
      << dead_pid() << " 12345 " << fs::read_symlink("/proc/self/ns/pid").string() << "\n";
  // The dead owner had paused an elastic job: its state snapshot (in /dev/shm) goes too;
  // the live run's stays.
  const std::string stale_snapshot = snapshot_path(stale.string());
  const std::string live_snapshot = snapshot_path(mine.path);
  std::ofstream(stale_snapshot) << "state";
  std::ofstream(live_snapshot) << "state";
  CHECK(remove_stale_run_dirs(base) == 3);
  CHECK(fs::exists(other_ns));
  CHECK_FALSE(fs::exists(dead_ns));
  CHECK_FALSE(fs::exists(stale_snapshot));
  CHECK(fs::exists(live_snapshot));
  remove_snapshot(mine.path);
  CHECK_FALSE(fs::exists(live_snapshot));
  CHECK_FALSE(fs::exists(stale));
  CHECK_FALSE(fs::exists(reused));
  CHECK(fs::exists(kept));
  CHECK(fs::exists(mine.path));

  RunDir keep = make_run_dir(std::nullopt, "k");
  release_run_dir(keep, true);
  CHECK(fs::is_directory(keep.path));
  CHECK_FALSE(fs::exists(fs::path(keep.path) / "owner"));
  CHECK(remove_stale_run_dirs(base) == 0);
  release_run_dir(mine, false);
  CHECK_FALSE(fs::exists(mine.path));
}
