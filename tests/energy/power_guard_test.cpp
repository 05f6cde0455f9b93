// PowerGuard (energy/power_guard.hpp): the real `gpurun __power-guard` helper restoring power
// limits of fake GPUs, on a clean exit and after kill -9 of the process that owns the guard.
#include "energy/power_guard.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "check_text.hpp"
#include "energy/power_journal.hpp"
#include "energy/simulated_nvml/simulated_nvml_state.hpp"
#include "gpurun/abstract_lock.hpp"
#include "gpurun/error.hpp"
#include "gpurun_process.hpp"

namespace fake = gpurun::energy::simulated_nvml;
using namespace gpurun::energy;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using gpurun::testing::slurp;
using gpurun::testing::TempDir;

namespace {

/// Two fake H200s (limit 700 W) and an open Nvml on them.
struct Gpus {
  TempDir dir{"gpurun-guard"};
  std::string path = (dir.path / "state").string();
  std::string err_path = (dir.path / "guard.err").string();
  std::unique_ptr<Nvml> nvml;
  explicit Gpus(const fake::State& s = fake::h200s(2, fake::unix_now())) {
    fake::write_state(path, s);
    ::setenv("GPURUN_NVML_LIBRARY", GPURUN_FAKE_NVML, 1);
    ::setenv("GPURUN_FAKE_NVML_STATE", path.c_str(), 1);
    ::setenv("GPURUN_POWER_JOURNAL", (dir.path / "journal.json").c_str(), 1);  // not the machine's
    std::string why_not;
    nvml = Nvml::open(why_not);
    REQUIRE_MESSAGE(nvml != nullptr, why_not);
  }
  NvmlDevice dev(unsigned i) const { return nvml->device_by_index(i); }
  double limit_w(unsigned i) const { return fake::current_limit_w(path, i); }

  /// A PowerGuard whose helper writes its stderr to err_path.
  std::unique_ptr<PowerGuard> guard() const {
    const int saved = ::dup(2);
    const int f = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    REQUIRE(f >= 0);
    ::dup2(f, 2);
    ::close(f);
    auto g = std::make_unique<PowerGuard>(GPURUN_BINARY);
    ::dup2(saved, 2);
    ::close(saved);
    return g;
  }
};

/// True when `pid` has exited (gone, or a zombie nobody reaped yet).
bool exited(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto close_paren = line.rfind(')');
  return close_paren == std::string::npos || line.substr(close_paren + 2, 1) == "Z";
}

/// Waits until `pid` has exited (a zombie counts), at most `timeout`: the kernel says so on a
/// pidfd (pidfd_open, Linux 5.3), whoever the parent is. True when it has.
bool wait_exited(pid_t pid, std::chrono::milliseconds timeout) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    const int e = errno;
    if (e == ESRCH) return true;  // reaped already
    FAIL("pidfd_open(" << pid << ") failed: " << std::strerror(e));
  }
  pollfd p{fd, POLLIN, 0};
  const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  ::close(fd);
  return n == 1 || exited(pid);
}

}  // namespace

TEST_CASE("power guard: remembered limits come back when the guard is destroyed") {
  Gpus gpus;
  {
    auto guard = gpus.guard();
    for (unsigned i : {0u, 1u}) {
      guard->remember({gpus.nvml->uuid(gpus.dev(i)), gpus.nvml->power_limit_mw(gpus.dev(i))});
      gpus.nvml->set_power_limit_mw(gpus.dev(i), 450000 + i * 50000);
    }
    CHECK(gpus.limit_w(0) == 450.0);
    CHECK(gpus.limit_w(1) == 500.0);
    CHECK(guard->finish() == 0);
    CHECK(guard->finish() == 0);  // idempotent
  }
  CHECK(gpus.limit_w(0) == 700.0);
  CHECK(gpus.limit_w(1) == 700.0);
  const std::string err = slurp(gpus.err_path);
  CHECK(err.find("gpurun power guard: restored " + fake::test_uuid(0) + " to 700 W\n") !=
        std::string::npos);
  CHECK(err.find("gpurun power guard: restored " + fake::test_uuid(1) + " to 700 W\n") !=
        std::string::npos);
}

TEST_CASE("power guard: the spawner's orphan reaper never takes the guard's exit status") {
  // The reaper (posix_spawner.cpp) waits for every child of gpurun that is not a worker,
  // whenever a worker exits. A guard that died (kill -9) and waits to be reaped is left to
  // finish(), which reports how it ended.
  Gpus gpus;
  auto guard = gpus.guard();
  REQUIRE(::kill(guard->pid(), SIGKILL) == 0);
  REQUIRE(wait_exited(guard->pid(), 5000ms));
  gpurun::reap_children_except({});
  CHECK(guard->finish() == 128 + SIGKILL);  // -1: its exit was taken by the reaper
}

TEST_CASE("power guard: a forgotten GPU is left alone; a second remember keeps the original") {
  Gpus gpus;
  {
    auto guard = gpus.guard();
    const std::string u0 = gpus.nvml->uuid(gpus.dev(0)), u1 = gpus.nvml->uuid(gpus.dev(1));
    guard->remember({u0, 700000});
    gpus.nvml->set_power_limit_mw(gpus.dev(0), 400000);
    guard->forget(u0);  // gpurun says it handled GPU 0 itself
    guard->remember({u1, 700000});
    gpus.nvml->set_power_limit_mw(gpus.dev(1), 450000);
    guard->remember({u1, 450000});  // e.g. a later profiling step: the original stays 700 W
    gpus.nvml->set_power_limit_mw(gpus.dev(1), 300000);
  }
  CHECK(gpus.limit_w(0) == 400.0);
  CHECK(gpus.limit_w(1) == 700.0);
  CHECK(slurp(gpus.err_path).find(fake::test_uuid(0)) == std::string::npos);
}

TEST_CASE("power guard: a failed restore is reported and gives exit status 1") {
  Gpus gpus;
  auto guard = gpus.guard();
  guard->remember({fake::test_uuid(0), 700000});
  gpus.nvml->set_power_limit_mw(gpus.dev(0), 500000);
  fake::update_state(gpus.path, [](fake::State& s) {
    s.errors.push_back({"nvmlDeviceSetPowerManagementLimit", 4, {}});
  });
  CHECK(guard->finish() == 1);
  CHECK(gpus.limit_w(0) == 500.0);
  CHECK(slurp(gpus.err_path)
            .find("gpurun power guard: could not restore " + fake::test_uuid(0) +
                  " to 700 W: nvmlDeviceSetPowerManagementLimit on GPU " + fake::test_uuid(0)) !=
        std::string::npos);
}

TEST_CASE("power guard: the helper has its own session and ignores SIGINT, SIGTERM, SIGHUP") {
  Gpus gpus;
  auto guard = gpus.guard();
  const pid_t pid = guard->pid();
  REQUIRE(pid > 1);
  CHECK(::getsid(pid) == pid);
  CHECK(::getsid(pid) != ::getsid(0));
  // An answer comes once power_guard_main() has set SIG_IGN (it does before it reads).
  guard->remember({fake::test_uuid(1), 700000});
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) REQUIRE(::kill(pid, sig) == 0);
  // A fatal signal ends the helper at its next return from the kernel, before it could read
  // and answer another command: an answer after the kills means they were ignored.
  CHECK_NOTHROW(guard->remember({fake::test_uuid(1), 700000}));  // still answers
  CHECK_FALSE(exited(pid));
  gpus.nvml->set_power_limit_mw(gpus.dev(1), 600000);
  CHECK(guard->finish() == 0);
  CHECK(gpus.limit_w(1) == 700.0);
}

TEST_CASE("power guard: a helper that is gone makes remember() throw, not kill the caller") {
  Gpus gpus;
  auto guard = gpus.guard();
  const pid_t pid = guard->pid();
  REQUIRE(pid > 1);
  REQUIRE(::kill(pid, SIGKILL) == 0);  // our own child, started by this test just above
  REQUIRE(wait_exited(pid, 5000ms));
  CHECK_FALSE(guard->alive());
  CHECK_THROWS_AS(guard->remember({fake::test_uuid(0), 700000}), gpurun::Error);
  CHECK(guard->finish() == 128 + SIGKILL);
}

TEST_CASE("power guard: one guard at a time holds a GPU, until it has restored it") {
  Gpus gpus;
  auto first = gpus.guard();
  CHECK(first->alive());
  first->remember({fake::test_uuid(0), 700000});
  auto second = gpus.guard();
  // A second job would take the first one's limit for the original: refused, naming the holder.
  CHECK_THROWS_WITH_AS(second->remember({fake::test_uuid(0), 450000}),
                       doctest::Contains((fake::test_uuid(0) +
                                          " is power-managed by another gpurun (its guard, pid " +
                                          std::to_string(first->pid()))
                                             .c_str()),
                       gpurun::Error);
  second->remember({fake::test_uuid(1), 700000});  // another GPU is free
  first->forget(fake::test_uuid(0));               // restored by its gpurun: the GPU is free
  CHECK_NOTHROW(second->remember({fake::test_uuid(0), 700000}));
}

TEST_CASE(
    "power guard: the lock is the GPU's, machine-wide: guards started with different lock "
    "directories or TMPDIRs still exclude each other") {
  Gpus gpus;
  TempDir a("gpurun-guard"), b("gpurun-guard");
  ::setenv("GPURUN_POWER_LOCK_DIR", a.path.c_str(), 1);  // what earlier versions keyed it by
  ::setenv("TMPDIR", a.path.c_str(), 1);
  auto first = gpus.guard();
  first->remember({fake::test_uuid(0), 700000});
  ::setenv("GPURUN_POWER_LOCK_DIR", b.path.c_str(), 1);
  ::setenv("TMPDIR", b.path.c_str(), 1);
  auto second = gpus.guard();
  // Refused: otherwise job 2 would take job 1's limit for the original and "restore" it,
  // leaving the GPU capped after both ended.
  CHECK_THROWS_WITH_AS(second->remember({fake::test_uuid(0), 400000}),
                       doctest::Contains((fake::test_uuid(0) +
                                          " is power-managed by another gpurun (its guard, pid " +
                                          std::to_string(first->pid()) + ", holds @gpurun-power/")
                                             .c_str()),
                       gpurun::Error);
  ::unsetenv("GPURUN_POWER_LOCK_DIR");
  ::unsetenv("TMPDIR");
  // The first guard's death frees the GPU at once (the kernel closes its lock).
  CHECK(first->finish() == 0);
  CHECK_NOTHROW(second->remember({fake::test_uuid(0), 700000}));
}

TEST_CASE("power guard: kill -9 of the process owning the guard still restores the limit") {
  Gpus gpus;
  int ready[2];
  REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
  const pid_t owner = ::fork();
  REQUIRE(owner >= 0);
  if (owner == 0) {
    // The owner, standing in for gpurun: guard, remember, lower the limit, then wait to die.
    ::close(ready[0]);
    const int f = ::open(gpus.err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (f >= 0) ::dup2(f, 2);
    try {
      PowerGuard guard(GPURUN_BINARY);
      std::string why_not;
      auto nvml = Nvml::open(why_not);
      if (!nvml) ::_exit(3);
      const NvmlDevice d = nvml->device_by_index(1);
      guard.remember({nvml->uuid(d), nvml->power_limit_mw(d)});
      nvml->set_power_limit_mw(d, 350000);
      const pid_t helper = guard.pid();
      if (::write(ready[1], &helper, sizeof helper) != sizeof helper) ::_exit(4);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(5);
    }
  }
  ::close(ready[1]);
  pid_t helper = -1;
  pollfd p{ready[0], POLLIN, 0};
  REQUIRE(::poll(&p, 1, 10000) == 1);
  REQUIRE(::read(ready[0], &helper, sizeof helper) == sizeof helper);
  ::close(ready[0]);
  REQUIRE(helper > 1);
  CHECK(gpus.limit_w(1) == 350.0);
  CHECK(::getsid(helper) == helper);

  REQUIRE(::kill(owner, SIGKILL) == 0);  // the child forked above
  int status = 0;
  REQUIRE(::waitpid(owner, &status, 0) == owner);
  CHECK(WIFSIGNALED(status));

  // The helper restores the limits it holds, then exits.
  CHECK(wait_exited(helper, 5000ms));
  CHECK(gpus.limit_w(1) == 700.0);
  CHECK(gpus.limit_w(0) == 700.0);
  CHECK(slurp(gpus.err_path)
            .find("gpurun power guard: restored " + fake::test_uuid(1) + " to 700 W") !=
        std::string::npos);
}

TEST_CASE("power guard: `gpurun __power-guard` run by hand refuses without its pipes") {
  TempDir dir("gpurun-guard");
  gpurun::testing::ChildProcess p({GPURUN_BINARY, "__power-guard"}, {}, dir.path / "out",
                                  dir.path / "err");
  REQUIRE(p.wait(10000ms));
  CHECK(p.code() == 2);
  CHECK(p.stderr_text().find("started without its pipes") != std::string::npos);
}

TEST_CASE("power journal: the first original wins, entries are per host and GPU, removal") {
  Gpus gpus;
  const fs::path j = gpus.dir.path / "j" / "journal.json";
  JournalEntry e{"host-a", "GPU-1", 700000, false, 11, 1};
  update_journal(j, e);
  e.original_mw = 400000;  // a later "original" is the job's own change: not kept
  e.clocks_locked = true;
  update_journal(j, e);
  update_journal(j, JournalEntry{"host-b", "GPU-1", 650000, false, 12, 2});
  auto all = read_journal(j);
  REQUIRE(all.size() == 2);
  CHECK(all[0].original_mw == 700000);
  CHECK(all[0].clocks_locked);
  update_journal(j, JournalEntry{"host-a", "GPU-1"}, /*remove=*/true);
  all = read_journal(j);
  REQUIRE(all.size() == 1);
  CHECK(all[0].host == "host-b");
  // A removal naming a guard drops only that guard's entry (gpurun after its guard died must
  // not drop an entry another job's guard wrote since).
  update_journal(j, JournalEntry{"host-b", "GPU-1", 0, false, 99, 3}, /*remove=*/true);
  CHECK(read_journal(j).size() == 1);
  update_journal(j, JournalEntry{"host-b", "GPU-1", 0, false, 12, 3}, /*remove=*/true);
  CHECK(read_journal(j).empty());
  std::ofstream(j) << "{\"entries\": [{\"host\": 3}]}";
  CHECK_THROWS_WITH_AS(read_journal(j), doctest::Contains("journal.json"), gpurun::Error);
}

TEST_CASE("power journal: recovery restores a GPU no guard holds, and skips one a guard holds") {
  Gpus gpus;
  const fs::path j = gpus.dir.path / "journal.json";
  const std::string u0 = gpus.nvml->uuid(gpus.dev(0)), u1 = gpus.nvml->uuid(gpus.dev(1));
  gpus.nvml->set_power_limit_mw(gpus.dev(0), 300000);
  gpus.nvml->set_power_limit_mw(gpus.dev(1), 300000);
  update_journal(j, JournalEntry{host_name(), u0, 700000, false, 4242, 1});
  update_journal(j, JournalEntry{host_name(), u1, 700000, false, 4243, 1});
  update_journal(j, JournalEntry{"another-host", u0, 650000, false, 1, 1});
  const int held = gpurun::take_abstract_lock(gpu_lock_name(u1));  // a live guard's GPU
  REQUIRE(held >= 0);
  const auto said = recover_journal(*gpus.nvml, j);
  ::close(held);
  REQUIRE(said.size() == 1);
  CHECK(gpurun::testing::contains(said[0], "restored " + u0 + " to 700 W"));
  CHECK(gpurun::testing::contains(said[0], "pid 4242"));
  CHECK(gpus.limit_w(0) == doctest::Approx(700));
  CHECK(gpus.limit_w(1) == doctest::Approx(300));  // held: another job's, left alone
  const auto left = read_journal(j);
  REQUIRE(left.size() == 2);  // u1 (held) and the other host's
  CHECK(left[0].uuid == u1);
  CHECK(left[1].host == "another-host");
}
