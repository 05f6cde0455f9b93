#include "supervisor/supervisor.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "check_text.hpp"
#include "testing/capture_console.hpp"
#include "testing/fake_spawner.hpp"

using namespace gpurun::supervisor;
using namespace std::chrono_literals;

namespace {

struct Harness {
  boost::asio::io_context io;
  FakeSpawner spawner{io};
  CaptureConsole console;
  EventLog events;
  std::string run_dir;
  std::unique_ptr<Supervisor> sup;
  std::vector<int> restarts;

  explicit Harness(int nproc, int max_restarts = 0,
                   std::function<void(SupervisorOptions&)> tweak = {}) {
    run_dir = (std::filesystem::temp_directory_path() /
               ("gpurun-suptest-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++)))
                  .string();
    SupervisorOptions o;
    o.plan.nproc = nproc;
    o.plan.world_size = nproc;
    o.plan.max_restarts = max_restarts;
    o.plan.device = Device::kCpu;
    o.plan.run_id = "t";
    o.plan.master_addr = "127.0.0.1";
    o.plan.master_port = 1234;
    o.plan.run_dir = run_dir;
    o.argv = {"/bin/true"};
    o.grace_period = 100ms;
    o.kill_timeout = 200ms;
    o.drain_timeout = 100ms;
    o.poll_interval = 5ms;
    if (tweak) tweak(o);
    sup = std::make_unique<Supervisor>(io, o, spawner, console, events);
    sup->on_restart = [this](int a) { restarts.push_back(a); };
  }
  ~Harness() {
    std::error_code ec;
    std::filesystem::remove_all(run_dir, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
  /// Runs the io_context until `until()` holds or `limit` passes (a safety bound, not a check).
  void run_until(const std::function<bool()>& until, std::chrono::milliseconds limit = 3000ms) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!until() && std::chrono::steady_clock::now() < end) {
      io.restart();
      io.run_for(5ms);
    }
  }
  /// Runs the io_context until the supervisor finishes or `limit` passes.
  void drive(std::chrono::milliseconds limit = 3000ms) {
    run_until([this] { return sup->done(); }, limit);
  }
  /// Runs ready handlers without waiting for timers.
  void settle() {
    io.restart();
    io.poll();
  }
  const FakeSpawner::Proc& proc(size_t i) const { return *spawner.procs.at(i); }
  std::string env(size_t i, const std::string& k) const { return proc(i).request.env.at(k); }
};

}  // namespace

TEST_CASE("supervisor: all workers succeed -> exit 0, output prefixed and line-atomic") {
  Harness h(2);
  h.sup->start();
  REQUIRE(h.spawner.procs.size() == 2);
  CHECK(h.env(0, "RANK") == "0");
  CHECK(h.env(1, "RANK") == "1");
  h.spawner.output(1, StreamId::kStdout, "hel");
  h.spawner.output(0, StreamId::kStdout, "a\nb");
  h.spawner.output(1, StreamId::kStdout, "lo\n");
  h.spawner.output(0, StreamId::kStderr, "warn\n");
  h.spawner.exit(0, {0, 0});
  CHECK_FALSE(h.sup->done());
  h.spawner.exit(1, {0, 0});
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 0);
  CHECK(h.console.out == "[rank0]: a\n[rank1]: hello\n[rank0]: b\n");
  CHECK(h.console.err == "[rank0]: warn\n");
  CHECK(h.proc(0).signals.empty());
  CHECK(h.proc(1).signals.empty());
}

TEST_CASE("supervisor: first failure tears the rest down at once and sets the exit code") {
  Harness h(3);
  h.sup->start();
  for (int i = 0; i < 12; ++i)
    h.spawner.output(1, StreamId::kStderr, "err line " + std::to_string(i) + "\n");
  h.spawner.exit(1, {7, 0});
  // SIGTERM went out synchronously, before any timer.
  CHECK(h.proc(0).signals == std::vector<int>{SIGTERM});
  CHECK(h.proc(2).signals == std::vector<int>{SIGTERM});
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 7);
  // Those killed by our SIGTERM are not "the" failure.
  const std::string& err = h.console.err;
  CHECK(err.find("rank 1 (pid 1001) ended with exit code 7") != std::string::npos);
  CHECK(err.find("rank       : 1 (local rank 1)") != std::string::npos);
  CHECK(err.find("last 10 lines") != std::string::npos);
  CHECK(err.find("| err line 11") != std::string::npos);
  CHECK(err.find("| err line 1\n") == std::string::npos);  // older than the last 10
  CHECK(h.proc(0).signals == std::vector<int>{SIGTERM});   // died on SIGTERM: no SIGKILL
}

TEST_CASE("supervisor: signal death gives 128+signal") {
  Harness h(2);
  h.sup->start();
  h.spawner.exit(0, {0, SIGSEGV});
  h.drive();
  CHECK(h.sup->exit_code() == 139);
  CHECK(h.console.err.find("signal SIGSEGV (11)") != std::string::npos);
}

TEST_CASE("supervisor: a worker ignoring SIGTERM gets SIGKILL after the grace period") {
  Harness h(2);
  h.spawner.configure = [](FakeSpawner::Proc& p) { p.ignores_sigterm = true; };
  h.sup->start();
  const auto t0 = std::chrono::steady_clock::now();
  h.spawner.exit(0, {3, 0});
  CHECK(h.proc(1).signals == std::vector<int>{SIGTERM});
  h.drive();
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  REQUIRE(h.sup->done());
  CHECK(h.proc(1).signals == std::vector<int>{SIGTERM, SIGKILL});
  CHECK(elapsed >= 100ms);  // not before the grace period (drive()'s limit bounds the rest)
  CHECK(h.sup->exit_code() == 3);
}

TEST_CASE("supervisor: --max-restarts K restarts the whole set exactly K times") {
  Harness h(2, /*max_restarts=*/2);
  h.sup->start();
  for (int attempt = 0; attempt < 3; ++attempt) {
    REQUIRE(h.spawner.procs.size() == static_cast<size_t>(2 * (attempt + 1)));
    const size_t base = static_cast<size_t>(2 * attempt);
    for (size_t i = base; i < base + 2; ++i) {
      CHECK(h.env(i, "TORCHELASTIC_RESTART_COUNT") == std::to_string(attempt));
      CHECK(h.env(i, "TORCHELASTIC_MAX_RESTARTS") == "2");
    }
    h.spawner.exit(base, {attempt + 1, 0});
    // Let the teardown finish and the next attempt start.
    h.run_until([&] { return h.sup->done() || h.spawner.procs.size() != base + 2; });
  }
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.spawner.procs.size() == 6);  // no fourth attempt
  CHECK(h.restarts == std::vector<int>{1, 2});
  CHECK(h.sup->exit_code() == 3);  // the last attempt's first failure
}

TEST_CASE("supervisor: a restarted set that succeeds exits 0") {
  Harness h(1, /*max_restarts=*/1);
  h.sup->start();
  h.spawner.exit(0, {1, 0});
  h.run_until([&] { return h.spawner.procs.size() >= 2; });
  REQUIRE(h.spawner.procs.size() == 2);
  h.spawner.exit(1, {0, 0});
  h.drive();
  CHECK(h.sup->exit_code() == 0);
}

TEST_CASE("supervisor: SIGTERM is forwarded, no restart, exit 128+15") {
  Harness h(2, /*max_restarts=*/3);
  h.sup->start();
  h.sup->handle_signal(SIGTERM);
  CHECK(h.proc(0).signals == std::vector<int>{SIGTERM});
  CHECK(h.proc(1).signals == std::vector<int>{SIGTERM});
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 143);
  CHECK(h.spawner.procs.size() == 2);
  CHECK(h.restarts.empty());
}

TEST_CASE("supervisor: SIGINT is forwarded as SIGINT; a second one sends SIGKILL") {
  Harness h(1, 0, [](SupervisorOptions& o) { o.grace_period = 10s; });
  h.spawner.configure = [](FakeSpawner::Proc& p) { p.ignores_sigterm = true; };
  h.sup->start();
  h.sup->handle_signal(SIGINT);
  h.settle();
  CHECK_FALSE(h.sup->done());
  h.sup->handle_signal(SIGINT);
  h.drive(2s);
  REQUIRE(h.sup->done());
  CHECK(h.proc(0).signals == std::vector<int>{SIGINT, SIGKILL});
  CHECK(h.sup->exit_code() == 130);
}

TEST_CASE("supervisor: SIGUSR1/2 are forwarded unchanged, SIGHUP is not") {
  Harness h(2);
  h.sup->start();
  h.sup->handle_signal(SIGUSR1);
  h.sup->handle_signal(SIGUSR2);
  h.sup->handle_signal(SIGHUP);
  CHECK(h.proc(0).signals == std::vector<int>{SIGUSR1, SIGUSR2});
  CHECK(h.proc(1).signals == std::vector<int>{SIGUSR1, SIGUSR2});
  CHECK(h.console.err.find("no --config given; ignoring it") != std::string::npos);
  CHECK_FALSE(h.sup->done());
  h.spawner.exit(0, {0, 0});
  h.spawner.exit(1, {0, 0});
  h.drive();
  CHECK(h.sup->exit_code() == 0);
}

TEST_CASE("supervisor: processes left in a finished worker's group are terminated") {
  Harness h(1);
  h.spawner.configure = [](FakeSpawner::Proc& p) {
    p.leaves_children = true;
    p.ignores_sigterm = true;
  };
  h.sup->start();
  h.spawner.exit(0, {0, 0});
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 0);
  CHECK(h.proc(0).signals == std::vector<int>{SIGTERM, SIGKILL});
  CHECK_FALSE(h.proc(0).group_alive);
}

TEST_CASE("supervisor: a worker that cannot start fails the job with exit 1") {
  Harness h(3);
  h.spawner.fail_spawn = [](const SpawnRequest& r) { return r.rank == 1; };
  h.sup->start();
  CHECK(h.spawner.procs.size() == 1);  // rank 2 is not started after rank 1 failed
  CHECK(h.proc(0).signals == std::vector<int>{SIGTERM});
  h.drive();
  CHECK(h.sup->exit_code() == 1);
  CHECK(h.console.err.find("cannot start rank 1") != std::string::npos);
}

TEST_CASE("supervisor: ranks filter, redirects, tee, prefix template and log files") {
  Harness h(3, 0, [](SupervisorOptions& o) {
    o.ranks_filter = std::set<int>{0, 2};
    o.redirects.per_rank = {{2, StdSpec::kStdout}};  // rank 2 stdout: file only
    o.tee.per_rank = {{0, StdSpec::kStderr}};        // rank 0 stderr: console and file
    o.prefix_template = "<${role_name}${local_rank}> ";
  });
  h.sup->start();
  for (size_t i = 0; i < 3; ++i) {
    h.spawner.output(i, StreamId::kStdout, "out" + std::to_string(i) + "\n");
    h.spawner.output(i, StreamId::kStderr, "err" + std::to_string(i) + "\n");
  }
  for (size_t i = 0; i < 3; ++i) h.spawner.exit(i, {0, 0});
  h.drive();
  CHECK(h.console.out == "<default0> out0\n");
  CHECK(h.console.err == "<default0> err0\n<default2> err2\n");
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  CHECK(slurp(h.run_dir + "/attempt_0/2/stdout.log") == "out2\n");
  CHECK(slurp(h.run_dir + "/attempt_0/0/stderr.log") == "err0\n");
  CHECK_FALSE(std::filesystem::exists(h.run_dir + "/attempt_0/1/stdout.log"));
}

TEST_CASE("supervisor: the worker's error file is quoted in the summary") {
  Harness h(2);
  h.sup->start();
  const std::string path = h.env(1, "TORCHELASTIC_ERROR_FILE");
  CHECK(path == h.run_dir + "/attempt_0/1/error.json");
  {
    std::ofstream f(path);
    f << R"({"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback: here\nRuntimeError: boom", "timestamp": "0"}}})";
  }
  h.spawner.exit(1, {1, 0});
  h.drive();
  CHECK(h.sup->exit_code() == 1);
  const std::string& err = h.console.err;
  CHECK(err.find("error file : " + path) != std::string::npos);
  CHECK(err.find("message    : RuntimeError: boom") != std::string::npos);
  CHECK(err.find("    Traceback: here") != std::string::npos);
  CHECK(err.find("time       : 1970-01-01T00:00:00.000Z") != std::string::npos);
}

TEST_CASE("supervisor: prefix template expansion") {
  CHECK(expand_prefix("[rank${rank}]: ", 3, 1) == "[rank3]: ");
  CHECK(expand_prefix("${role_name}/${local_rank}|${rank}${x}", 5, 1) == "default/1|5${x}");
}

using gpurun::testing::count_of;

TEST_CASE("supervisor: a worker that cannot start is reported once, without a pid or exit code") {
  Harness h(3);
  h.spawner.fail_spawn = [](const SpawnRequest& r) { return r.rank == 1; };
  h.sup->start();
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 1);
  const std::string& err = h.console.err;
  INFO(err);
  CHECK(count_of(err, "fake failure") == 1);  // the spawner's reason, once
  CHECK(err.find("gpurun: rank 1 could not start; stopping the other workers") !=
        std::string::npos);
  CHECK(
      err.find("  exit       : could not start: cannot start rank 1 ('/bin/true'): fake failure") !=
      std::string::npos);
  CHECK(err.find("pid        : -1") == std::string::npos);
  CHECK(err.find("exit code 1") == std::string::npos);
}

TEST_CASE("supervisor: a shutdown signal during a large launch stops spawning at once") {
  Harness h(100, 0, [](SupervisorOptions& o) { o.spawn_batch = 4; });
  h.sup->start();
  CHECK(h.spawner.procs.size() == 4);  // the rest are spawned on later io_context turns
  h.io.restart();
  h.io.poll_one();  // one more turn: one more batch
  const size_t started = h.spawner.procs.size();
  CHECK(started == 8);
  h.sup->handle_signal(SIGINT);  // as if the signal_set's handler ran between two batches
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 130);
  CHECK(h.spawner.procs.size() == started);  // nothing spawned after the signal
  for (const auto& p : h.spawner.procs) CHECK(p->signals == std::vector<int>{SIGINT});
}

TEST_CASE("supervisor: spawning yields between batches, then starts every worker") {
  Harness h(10, 0, [](SupervisorOptions& o) { o.spawn_batch = 3; });
  h.sup->start();
  CHECK(h.spawner.procs.size() == 3);
  h.settle();
  REQUIRE(h.spawner.procs.size() == 10);
  for (size_t i = 0; i < 10; ++i) CHECK(h.env(i, "RANK") == std::to_string(i));
  for (size_t i = 0; i < 10; ++i) h.spawner.exit(i, {0, 0});
  h.drive();
  CHECK(h.sup->exit_code() == 0);
}

TEST_CASE("supervisor: --ranks-filter naming no rank of this node warns once") {
  Harness none(2, 0, [](SupervisorOptions& o) { o.ranks_filter = std::set<int>{99}; });
  none.sup->start();
  CHECK(none.console.err ==
        "gpurun: warning: --ranks-filter names none of the ranks on this node (0-1): no worker "
        "output will be shown on the console\n");
  Harness some(2, 0, [](SupervisorOptions& o) { o.ranks_filter = std::set<int>{1, 99}; });
  some.sup->start();
  CHECK(some.console.err.empty());
}

namespace {
std::string slurp_file(const std::string& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = 0; (pos = text.find(needle, pos)) != std::string::npos; pos += needle.size())
    ++n;
  return n;
}
}  // namespace

TEST_CASE("supervisor: on a terminal, \\r redraws are forwarded at once, prefixed, lines whole") {
  Harness h(2, 0, [](SupervisorOptions& o) { o.keep_logs = true; });
  h.console.terminal_out = true;  // gpurun's stdout is a terminal, its stderr is not
  h.sup->start();
  // Shown streams on a terminal get a pseudo-terminal; the others keep their pipe.
  CHECK(h.proc(0).request.stdout_pty);
  CHECK_FALSE(h.proc(0).request.stderr_pty);
  h.spawner.output(0, StreamId::kStdout, "\r 10%|#  |");
  CHECK(h.console.out == "\r[rank0]:  10%|#  |");  // at once, before any newline
  h.spawner.output(1, StreamId::kStdout, "loss 0.5\n");
  h.spawner.output(0, StreamId::kStdout, "\r 50%|## |");
  h.spawner.output(0, StreamId::kStdout, "\r100%|###|\n");
  h.spawner.output(1, StreamId::kStdout, "a\rb\n");
  for (size_t i = 0; i < 2; ++i) h.spawner.exit(i, {0, 0});
  h.drive();
  REQUIRE(h.sup->done());
  // Rank 1's line starts on a line of its own: the bar's line was ended first.
  CHECK(h.console.out ==
        "\r[rank0]:  10%|#  |\n[rank1]: loss 0.5\n\r[rank0]:  50%|## |\r[rank0]: 100%|###|\n"
        "\r[rank1]: a\r[rank1]: b\n");
  // The log gets each line's final text, not the intermediate states.
  CHECK(slurp_file(h.run_dir + "/attempt_0/0/stdout.log") == "100%|###|\n");
  CHECK(slurp_file(h.run_dir + "/attempt_0/1/stdout.log") == "loss 0.5\nb\n");
}

TEST_CASE("supervisor: not a terminal -> no pseudo-terminal, \\r stays inside the line") {
  Harness h(1, 0, [](SupervisorOptions& o) {
    o.keep_logs = true;
    o.redirects.all = StdSpec::kStderr;  // stderr: file only, never a pty
  });
  h.console.terminal_err = true;
  h.sup->start();
  CHECK_FALSE(h.proc(0).request.stdout_pty);
  CHECK_FALSE(h.proc(0).request.stderr_pty);  // redirected: not shown, so a pipe
  h.spawner.output(0, StreamId::kStdout, "\r 10%");
  CHECK(h.console.out.empty());  // held until the line ends, as before
  h.spawner.output(0, StreamId::kStdout, "\r 20%\n");
  h.spawner.output(0, StreamId::kStderr, "e\r1\n");
  h.spawner.exit(0, {0, 0});
  h.drive();
  CHECK(h.console.out == "[rank0]: \r 10%\r 20%\n");
  CHECK(slurp_file(h.run_dir + "/attempt_0/0/stdout.log") == "\r 10%\r 20%\n");  // raw bytes
  CHECK(slurp_file(h.run_dir + "/attempt_0/0/stderr.log") == "e\r1\n");
}

TEST_CASE("supervisor: a log write failure is reported once and the stream goes to the console") {
  Harness h(2, 0, [](SupervisorOptions& o) {
    o.keep_logs = true;
    o.redirects.all = StdSpec::kStdout | StdSpec::kStderr;  // --redirects 3: files only
  });
  // Rank 1's stdout.log is /dev/full: every write fails with ENOSPC.
  const std::string dir = h.run_dir + "/attempt_0/1";
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink("/dev/full", dir + "/stdout.log");
  h.sup->start();
  h.spawner.output(1, StreamId::kStdout, "first\nsec");
  h.spawner.output(1, StreamId::kStdout, "ond\n");
  h.spawner.output(1, StreamId::kStderr, "to the file\n");
  h.spawner.output(0, StreamId::kStdout, "rank0 file\n");
  for (size_t i = 0; i < 2; ++i) h.spawner.exit(i, {0, 0});
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 0);
  const std::string warning = "gpurun: warning: writing " + dir +
                              "/stdout.log failed: No space left on device (ENOSPC); rank 1's "
                              "stdout goes to the console from now on\n";
  CHECK(occurrences(h.console.err, warning) == 1);
  CHECK(occurrences(h.console.err, "warning: writing") == 1);   // once per file
  CHECK(h.console.out == "[rank1]: first\n[rank1]: second\n");  // nothing lost
  CHECK(slurp_file(dir + "/stderr.log") == "to the file\n");
  CHECK(slurp_file(h.run_dir + "/attempt_0/0/stdout.log") == "rank0 file\n");
}

TEST_CASE("supervisor: SIGQUIT stops the job like SIGTERM: forwarded, no restart, 128+3") {
  Harness h(2, /*max_restarts=*/3);
  h.sup->start();
  h.sup->handle_signal(SIGQUIT);
  CHECK(h.proc(0).signals == std::vector<int>{SIGQUIT});
  CHECK(h.proc(1).signals == std::vector<int>{SIGQUIT});
  CHECK(h.console.err.find("gpurun: received SIGQUIT: forwarding it to the workers") !=
        std::string::npos);
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 131);
  CHECK(h.restarts.empty());
}

namespace {
/// Elastic mode, paused: no slot runs, the job is held open.
struct PausedController : SlotController {
  void on_attempt_start(int) override {}
  bool on_worker_exit(int, ExitStatus, bool) override { return true; }
  bool holds_job_open() const override { return true; }
  bool succeeded() const override { return true; }
  void on_reload_request() override {}
};
}  // namespace

TEST_CASE("supervisor: SIGTERM while paused says the snapshot (path, size) is deleted") {
  Harness h(2);
  std::filesystem::create_directories(h.run_dir);
  const std::string snap = snapshot_path(h.run_dir);
  { std::ofstream(snap) << std::string(12345, 's'); }
  PausedController paused;
  h.sup->set_controller(&paused);
  h.sup->start();
  h.settle();
  CHECK_FALSE(h.sup->done());  // paused: held open
  h.sup->handle_signal(SIGTERM);
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 143);
  CHECK(h.console.err.find("gpurun: stopping while paused: the snapshot " + snap +
                           " (12345 bytes) is deleted at exit") != std::string::npos);
  std::filesystem::remove(snap);
  // Without a snapshot file it says that there is none.
  Harness h2(1);
  PausedController paused2;
  h2.sup->set_controller(&paused2);
  h2.sup->start();
  h2.sup->handle_signal(SIGTERM);
  h2.drive();
  CHECK(h2.console.err.find("gpurun: stopping while paused: no snapshot at " +
                            snapshot_path(h2.run_dir)) != std::string::npos);
}

namespace {
/// Node 0 of an elastic job over several nodes while only other nodes train: held open, not
/// paused; SIGTERM asks for a stop at the next boundary.
struct OthersTrainController : PausedController {
  bool paused() const override { return false; }
  bool on_stop_request(const std::string&) override {
    ++stop_requests;
    return true;
  }
  int stop_requests = 0;
};
}  // namespace

TEST_CASE("supervisor: SIGTERM while other nodes train is a stop at the boundary, not a pause's") {
  Harness h(1);
  std::filesystem::create_directories(h.run_dir);
  OthersTrainController others;
  h.sup->set_controller(&others);
  h.sup->start();
  h.settle();
  CHECK_FALSE(h.sup->done());  // held open: the other nodes' processes run
  h.sup->handle_signal(SIGTERM);
  h.settle();
  CHECK(others.stop_requests == 1);  // before: taken for paused, stopped at once
  CHECK(h.console.err.find("stopping while paused") == std::string::npos);
  CHECK(h.console.err.find("the job is paused") == std::string::npos);
}

namespace {
/// Elastic mode whose training state was lost: its one worker is told to exit and exits 0.
struct LostStateController : SlotController {
  Supervisor* sup = nullptr;
  void on_attempt_start(int) override { sup->spawn_slot(0, {}); }
  bool on_worker_exit(int, ExitStatus, bool) override { return false; }
  bool holds_job_open() const override { return false; }
  bool succeeded() const override { return false; }
  std::string failure_summary() const override { return job_failed(); }
  std::string job_failed() const override {
    return "the training state is lost: no process of generation 2 holds it (failed: [])";
  }
  void on_reload_request() override {}
};
}  // namespace

TEST_CASE("supervisor: a lost training state never ends with exit 0, even if every worker did") {
  // Issue 25: "state lost" was followed by "all workers succeeded" and exit 0 when the workers
  // that were left exited 0 (told to exit) and none had failed.
  Harness h(1);
  LostStateController lost;
  lost.sup = h.sup.get();
  h.sup->set_controller(&lost);
  h.sup->start();
  h.settle();
  h.spawner.exit(0, {0, 0});
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 1);
  CHECK(h.console.err.find("gpurun: the job failed although no worker did: the training state "
                           "is lost: no process of generation 2 holds it") != std::string::npos);
}

TEST_CASE(
    "supervisor: elastic console prefixes — the generation's rank, the slot where they differ") {
  CHECK(expand_elastic_prefix("[rank${rank}]: ", 0, 0) == "[rank0]: ");
  CHECK(expand_elastic_prefix("[rank${rank}]: ", 1, 0) == "[rank0 gpu1]: ");
  CHECK(expand_elastic_prefix("[rank${rank}]: ", 1, -1) == "[gpu1]: ");
  CHECK(expand_elastic_prefix("${role_name}/${local_rank}|${rank}: ", 2, 1, "trainer") ==
        "trainer/1|1 gpu2: ");
  CHECK(expand_elastic_prefix("${role_name}/${local_rank}|${rank}: ", 2, -1) ==
        "default/gpu2|gpu2: ");
}

namespace {
/// Elastic mode: both slots run; the test says which generation is in force.
struct TwoSlotController : SlotController {
  Supervisor* sup = nullptr;
  void on_attempt_start(int) override {
    sup->set_generation(std::vector<int>{0, 1});
    sup->spawn_slot(0, {});
    sup->spawn_slot(1, {});
  }
  bool on_worker_exit(int, ExitStatus, bool) override { return true; }
  bool holds_job_open() const override { return false; }
  bool succeeded() const override { return true; }
  void on_reload_request() override {}
};
}  // namespace

TEST_CASE("supervisor: after active_gpus = [1] the survivor's lines say rank 0 (and gpu 1)") {
  // Issue 43: the prefix said [rank1] while the process was rank 0 of 1.
  Harness h(2);
  TwoSlotController c;
  c.sup = h.sup.get();
  h.sup->set_controller(&c);
  h.sup->start();
  h.settle();
  REQUIRE(h.spawner.procs.size() == 2);
  h.spawner.output(1, StreamId::kStdout, "before\n");
  h.sup->set_generation(std::vector<int>{1});  // the leaver's last lines carry its slot
  h.spawner.output(0, StreamId::kStdout, "leaving\n");
  h.spawner.output(1, StreamId::kStdout, "after\n");
  h.spawner.exit(0, {0, 0});
  h.settle();
  // A process spawned for a slot outside the generation (a standby) shows the slot; once a
  // generation names it, its rank.
  h.sup->spawn_slot(0, {});
  h.spawner.output(2, StreamId::kStdout, "standby\n");
  h.sup->set_generation(std::vector<int>{0, 1});
  h.spawner.output(2, StreamId::kStdout, "joined\n");
  h.spawner.output(1, StreamId::kStdout, "grown\n");
  CHECK(h.console.out ==
        "[rank1]: before\n[gpu0]: leaving\n[rank0 gpu1]: after\n[gpu0]: standby\n"
        "[rank0]: joined\n[rank1]: grown\n");
  h.spawner.exit(1, {0, 0});
  h.spawner.exit(2, {0, 0});
  h.drive();
  CHECK(h.sup->done());
}

namespace {
/// Elastic mode on node 1: the controller starts job slot 1001 as a warm joiner.
struct NodeSlotController : SlotController {
  Supervisor* sup = nullptr;
  gpurun::control::Decision d;
  void on_attempt_start(int) override {
    sup->spawn_elastic(d, {.slot = 1001, .warm = 3, .config_path = "/job/c1.toml"});
  }
  bool on_worker_exit(int, ExitStatus, bool) override { return true; }
  bool holds_job_open() const override { return false; }
  bool succeeded() const override { return true; }
  void on_reload_request() override {}
};
}  // namespace

TEST_CASE("supervisor: spawn_elastic starts job slot 1001 on local slot 1 with its job's ranks") {
  // The one spawn of node 0's controller and of a node agent (nodes > 0): the job slot id
  // picks the local slot (its device and LOCAL_RANK), the decision the provisional ranks.
  Harness h(2);
  NodeSlotController c;
  c.sup = h.sup.get();
  c.d.active = {0, 1, 1000, 1001};
  h.sup->set_controller(&c);
  h.sup->start();
  h.settle();
  REQUIRE(h.spawner.procs.size() == 1);
  CHECK(h.env(0, "LOCAL_RANK") == "1");
  CHECK(h.env(0, "GPURUN_LOCAL_SLOT") == "1");
  CHECK(h.env(0, "GPURUN_SLOT") == "1001");
  CHECK(h.env(0, "RANK") == "3");
  CHECK(h.env(0, "WORLD_SIZE") == "4");
  CHECK(h.env(0, "LOCAL_WORLD_SIZE") == "2");
  CHECK(h.env(0, "GPURUN_WARM") == "3");
  CHECK(h.env(0, "GPURUN_CONFIG") == "/job/c1.toml");
  h.spawner.exit(0, {0, 0});
  h.drive();
  CHECK(h.sup->done());
}

TEST_CASE("supervisor: an error file that holds no report says why on its own line") {
  Harness h(2);
  h.sup->start();
  const std::string path = h.env(1, "TORCHELASTIC_ERROR_FILE");
  {
    std::ofstream f(path);
    f << R"({"message": oops})";
  }
  h.spawner.exit(1, {1, 0});
  h.drive();
  const std::string& err = h.console.err;
  CHECK(err.find("error file : " + path + " is not valid JSON (") != std::string::npos);
  CHECK(err.find("message    :") == std::string::npos);
  CHECK(err.find("<not written>") == std::string::npos);
}

// ---- preemption (docs/cli.md#preemption) -----------------------------------------------------

TEST_CASE("supervisor: SIGTERM asks runtime workers to stop at a boundary; the others at once") {
  Harness h(2, /*max_restarts=*/3, [](SupervisorOptions& o) { o.stop_timeout = 300ms; });
  h.sup->start();
  CHECK(h.env(0, "GPURUN_PREEMPT_DIR") == h.run_dir + "/preempt");
  CHECK(h.env(0, "GPURUN_PREEMPT_SIGNAL") == std::to_string(SIGUSR2));
  // Rank 0's process group runs the worker runtime (it announced itself).
  std::ofstream(h.run_dir + "/preempt/runtime." + std::to_string(h.proc(0).pid));
  h.sup->handle_signal(SIGTERM);
  CHECK(std::filesystem::exists(h.run_dir + "/preempt/stop"));
  CHECK(h.proc(0).signals.empty());  // asked through the stop file, not signalled
  CHECK(h.proc(1).signals == std::vector<int>{SIGTERM});
  h.spawner.exit(0, {0, 0});  // stops at its boundary
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.proc(0).signals.empty());
  CHECK(h.sup->exit_code() == 143);
  CHECK(h.restarts.empty());
}

TEST_CASE("supervisor: a runtime worker that reaches no boundary: SIGTERM after stop_timeout") {
  Harness h(1, 0, [](SupervisorOptions& o) { o.stop_timeout = 150ms; });
  h.spawner.configure = [](FakeSpawner::Proc& p) { p.ignores_sigterm = true; };
  h.sup->start();
  std::ofstream(h.run_dir + "/preempt/runtime." + std::to_string(h.proc(0).pid));
  h.sup->handle_signal(SIGTERM);
  h.settle();
  CHECK(h.proc(0).signals.empty());
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.proc(0).signals == std::vector<int>{SIGTERM, SIGKILL});
  CHECK(h.sup->exit_code() == 143);
  CHECK(h.console.err.find("--stop-timeout of 150 ms over: rank 0") != std::string::npos);
}

TEST_CASE("supervisor: the preempt signal is forwarded; with stop_on_preempt the job stops") {
  Harness h(1, 0, [](SupervisorOptions& o) {
    o.preempt_signal = SIGURG;
    o.stop_on_preempt = true;
  });
  h.sup->start();
  std::ofstream(h.run_dir + "/preempt/runtime." + std::to_string(h.proc(0).pid));
  h.sup->handle_signal(SIGURG);
  CHECK(h.proc(0).signals == std::vector<int>{SIGURG});
  CHECK(std::filesystem::exists(h.run_dir + "/preempt/stop"));
  h.spawner.exit(0, {0, 0});
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 128 + SIGURG);
  CHECK(h.sup->shutdown_signal() == SIGURG);
}

TEST_CASE("supervisor: one failure is one restart, even with a check already queued") {
  // The poll timer (every 0 ms here) has a check of the attempt queued when the last worker's
  // exit finishes the attempt; that check, run before the next attempt starts, must not find
  // the finished attempt again and restart a second time (two worker sets, a restart lost).
  Harness h(2, /*max_restarts=*/5, [](SupervisorOptions& o) { o.poll_interval = 0ms; });
  h.sup->start();
  h.spawner.exit(0, {1, 0});
  h.run_until([&] { return h.spawner.procs.size() >= 4; });
  h.settle();
  CHECK(h.restarts == std::vector<int>{1});
  CHECK(h.sup->attempt() == 1);
  REQUIRE(h.spawner.procs.size() == 4);
  CHECK(h.env(2, "TORCHELASTIC_RESTART_COUNT") == "1");
}

TEST_CASE("supervisor: a shutdown signal between a failure and the restart ends the job") {
  // The signal is handled after the failed attempt ended and before the posted start of the
  // next: it must not start a worker set that would never get it.
  Harness h(2, /*max_restarts=*/2);
  h.sup->on_restart = [&](int a) {
    h.restarts.push_back(a);
    h.sup->handle_signal(SIGTERM);
  };
  h.sup->start();
  h.spawner.exit(0, {1, 0});
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.restarts == std::vector<int>{1});
  CHECK(h.spawner.procs.size() == 2);  // no second set
  CHECK(h.sup->exit_code() == 1);      // the attempt's failure, as for a signal during its stop
}
