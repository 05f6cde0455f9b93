#include "supervisor/root_cause.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "gpurun/text_block.hpp"
#include "supervisor/supervisor.hpp"
#include "testing/capture_console.hpp"
#include "testing/fake_spawner.hpp"

using namespace gpurun::supervisor;
using namespace std::chrono_literals;
using gpurun::text_block;
using gpurun::TextBlockLimits;

namespace {

const WallClock::time_point kRcT0 = WallClock::time_point(std::chrono::seconds(1'800'000'000));

const char* const kRcClosed =
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by "
    "peer [127.0.0.1]:41237";

WorkerErrorReport rc_report(std::string message, WallClock::time_point at) {
  WorkerErrorReport r;
  r.message = std::move(message);
  r.written_at = at;
  return r;
}

/// A worker's end: rank, status, reap time, optional own report, stderr, after the teardown.
FailureRecord rc_rec(int rank, ExitStatus status, WallClock::time_point reaped,
                     std::optional<WorkerErrorReport> own = {}, std::string stderr_tail = {},
                     bool after_teardown = false) {
  FailureRecord r;
  r.rank = r.local_rank = rank;
  r.pid = 1000 + rank;
  r.status = status;
  r.reaped_at = reaped;
  r.report = std::move(own);
  r.stderr_tail = std::move(stderr_tail);
  r.after_teardown = after_teardown;
  return r;
}

/// A scratch directory removed at the end of the test.
struct RcScratch {
  std::filesystem::path path;
  RcScratch() {
    static int n = 0;
    path = std::filesystem::temp_directory_path() /
           ("gpurun-rootcause-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::create_directories(path);
  }
  ~RcScratch() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

}  // namespace

TEST_CASE("root cause: the table (which rank is named, and why)") {
  const auto teardown = kRcT0 + 1ms;  // gpurun's SIGTERM to every group, right after the first reap
  struct Row {
    const char* what;
    std::vector<FailureRecord> records;
    std::size_t first_observed;
    int want_rank;
  };
  const std::vector<Row> rows = {
      {"SIGKILL: the killed rank, not the peers its death broke",
       {rc_rec(0, {1, 0}, kRcT0 + 40ms, rc_report(kRcClosed, kRcT0 + 30ms), "", true),
        rc_rec(1, {0, SIGKILL}, kRcT0)},
       1,
       1},
      {"SIGSEGV without an error file; the peer's connection error comes later",
       {rc_rec(0, {1, 0}, kRcT0 + 20ms, {}, std::string(kRcClosed) + "\n", true),
        rc_rec(2, {0, SIGSEGV}, kRcT0)},
       1,
       2},
      {"@record: the failing rank destroyed its group first; the peer was reaped first",
       {rc_rec(0, {1, 0}, kRcT0, rc_report(kRcClosed, kRcT0 - 2ms)),
        rc_rec(1, {1, 0}, kRcT0 + 60ms, rc_report("ValueError: bad learning rate", kRcT0 + 30ms),
               "", true)},
       0,
       1},
      {"no @record: the same, told apart by the last stderr lines",
       {rc_rec(0, {1, 0}, kRcT0, {},
               std::string("Traceback (most recent call last):\n") + kRcClosed),
        rc_rec(1, {1, 0}, kRcT0 + 40ms, {},
               "Traceback (most recent call last):\nValueError: bad lr\n", true)},
       0,
       1},
      {"a peer's connection error with nobody else failing within 5 s stays the root cause",
       {rc_rec(0, {1, 0}, kRcT0, rc_report(kRcClosed, kRcT0)),
        rc_rec(1, {1, 0}, kRcT0 + 6s, rc_report("ValueError: late", kRcT0 + 6s), "", true)},
       0,
       0},
      {"ended by gpurun's SIGTERM (no error file): not a failure of its own",
       {rc_rec(0, {3, 0}, kRcT0, {}, "RuntimeError: Socket Timeout\n"),
        rc_rec(1, {0, SIGTERM}, kRcT0 + 5ms, {}, "ValueError: x\n", true)},
       0,
       0},
      {"ended by gpurun's SIGTERM after it wrote its error file before the teardown",
       {rc_rec(0, {1, 0}, kRcT0, rc_report(kRcClosed, kRcT0)),
        rc_rec(1, {0, SIGTERM}, kRcT0 + 5ms, rc_report("ValueError: first", kRcT0 + 1ms - 1us), "",
               true)},
       0,
       1},
      {"two real errors: the earlier one, whichever was reaped first",
       {rc_rec(0, {1, 0}, kRcT0, rc_report("KeyError: 'x'", kRcT0 - 1ms)),
        rc_rec(2, {1, 0}, kRcT0 + 10ms, rc_report("ValueError: y", kRcT0 - 5ms), "", true)},
       0,
       2},
      {"the same instant: the one with its own error file, then the lower rank",
       {rc_rec(1, {1, 0}, kRcT0, {}, "ZeroDivisionError: z\n"),
        rc_rec(3, {1, 0}, kRcT0, rc_report("E: a", kRcT0))},
       0,
       3},
      {"a CUDA out-of-memory is a program error like any other",
       {rc_rec(0, {1, 0}, kRcT0 + 1ms, rc_report(kRcClosed, kRcT0 + 1ms)),
        rc_rec(
            1, {1, 0}, kRcT0 + 2ms,
            rc_report("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                      kRcT0 + 1ms),
            "", true)},
       0,
       1},
  };
  for (const auto& row : rows) {
    CAPTURE(row.what);
    const std::size_t i = choose_root_cause(row.records, teardown, row.first_observed);
    REQUIRE(i < row.records.size());
    CHECK(row.records[i].rank == row.want_rank);
  }
}

TEST_CASE("root cause: teardown errors are recognised by the error's last line") {
  CHECK(is_teardown_error(kRcClosed));
  CHECK(is_teardown_error("RuntimeError: Connection reset by peer"));
  CHECK(
      is_teardown_error("Traceback (most recent call last):\n  File \"t.py\"\n"
                        "RuntimeError: NCCL communicator was aborted on rank 0.\n"));
  CHECK_FALSE(is_teardown_error("ValueError: bad learning rate"));
  // A traceback that passes through a socket call but ends in the program's own error.
  CHECK_FALSE(
      is_teardown_error("  File \"broken pipe.py\", line 3\nValueError: Broken pipe"
                        " was not the point\nKeyError: 'lr'"));
  CHECK_FALSE(is_teardown_error("RuntimeError: DataLoader timed out after 5 seconds"));
  CHECK_FALSE(is_teardown_error(""));
}

// A real OOM kill under a cgroup memory limit is not a ctest case: this machine (and CI's
// like it) runs gpurun in a cgroup-v1 hierarchy (/proc/self/cgroup: "4:memory:/process_api/…",
// "0::/" with no memory controller in the unified tree), and that memory cgroup belongs to the
// sandbox's process manager: a test would have to create a child cgroup with a limit inside
// it (memory.limit_in_bytes), changing a cgroup that is not the project's. The count is read
// through OomWatch's paths, which the cases below point at fake files (the seam).
TEST_CASE("root cause: the OOM count of a memory cgroup (a fake memory.events)") {
  RcScratch dir;
  const std::string events =
      dir.write("memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 0\noom_group_kill 0\n");
  CHECK(read_oom_kill_count(events) == 0u);
  // cgroup v1's memory.oom_control has the same line.
  CHECK(read_oom_kill_count(
            dir.write("oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")) == 7u);
  CHECK_FALSE(read_oom_kill_count(dir.write("bad", "oom_kill x\n")));
  CHECK_FALSE(read_oom_kill_count((dir.path / "missing").string()));

  OomWatch watch({events});
  watch.baseline();
  CHECK_FALSE(watch.rose());
  dir.write("memory.events", "low 0\nhigh 0\nmax 13\noom 2\noom_kill 1\noom_group_kill 0\n");
  const auto counted = watch.rose();
  REQUIRE(counted);
  CHECK(*counted == "cgroup " + dir.path.string() + " oom_kill 1");
  CHECK(oom_kill_sentence(*counted) ==
        "killed by the kernel's out-of-memory killer (host memory; cgroup " + dir.path.string() +
            " oom_kill 1)");
  // A file with no baseline (unreadable at the start) never claims an OOM kill.
  OomWatch unknown({(dir.path / "later").string()});
  unknown.baseline();
  dir.write("later", "oom_kill 3\n");
  CHECK_FALSE(unknown.rose());
}

TEST_CASE("root cause: memory cgroup files from /proc/<pid>/cgroup (v2 and v1)") {
  CHECK(memory_event_files("0::/user.slice/job-7\n", "/cg") ==
        std::vector<std::string>{"/cg/user.slice/job-7/memory.events"});
  CHECK(memory_event_files("9:name=systemd:/\n4:memory:/slurm/uid_0/job_5\n0::/\n", "/cg") ==
        std::vector<std::string>{"/cg/memory/slurm/uid_0/job_5/memory.oom_control"});
  CHECK(memory_event_files("3:cpu,memory:/a\n", "/cg") ==
        std::vector<std::string>{"/cg/memory/a/memory.oom_control"});
  CHECK(memory_event_files("0::/\n", "/cg").empty());  // the root cgroup: no file
  CHECK(memory_event_files("", "/cg").empty());
}

TEST_CASE("root cause: an exception without a message is its name alone") {
  // torch's @record writes "{type}: {str(e)}": "KeyboardInterrupt: " for a bare Ctrl-C.
  CHECK(tidy_message("KeyboardInterrupt: ") == "KeyboardInterrupt");
  CHECK(tidy_message("KeyboardInterrupt:") == "KeyboardInterrupt");
  CHECK(tidy_message("ValueError: x \n") == "ValueError: x");
  CHECK(tidy_message("RuntimeError: see below:\n  detail") == "RuntimeError: see below:\n  detail");
}

TEST_CASE("root cause: device memory is named for a CUDA out-of-memory") {
  CHECK(device_oom_sentence("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate"));
  CHECK(device_oom_sentence("RuntimeError: CUDA error: out of memory (cudaErrorMemoryAllocation)"));
  CHECK(*device_oom_sentence("CUDA out of memory") ==
        "the GPU ran out of device memory (CUDA out of memory), not the host");
  CHECK_FALSE(device_oom_sentence("MemoryError"));
}

TEST_CASE("text_block: lines under a prefix, bounded, the last error kept") {
  CHECK(text_block("", "p| ").empty());
  CHECK(text_block("one", "p| ") == "p| one\n");
  CHECK(text_block("a\r\nb\n", "p| ") == "p| a\np| b\n");
  // A DataLoader worker's error: 100 traceback lines, the real error last.
  std::string tb = "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback:\n";
  for (int i = 0; i < 100; ++i)
    tb += "  File \"/usr/lib/python3/dist-packages/torch/utils/data/f" + std::to_string(i) +
          ".py\", line 1\n";
  tb += "ValueError: sample 17 has no label";
  const std::string out = text_block(tb, "p| ", TextBlockLimits{10, 4096, 2});
  CHECK(out.find("p| Caught ValueError in DataLoader worker process 0.\n") == 0);
  CHECK(out.find("p| [... 94 lines (") != std::string::npos);
  CHECK(out.find(" bytes) elided ...]\n") != std::string::npos);
  CHECK(out.size() > 3);
  CHECK(out.substr(out.size() - 38) == "p| ValueError: sample 17 has no label\n");
  std::size_t lines = 0;
  for (const char c : out) lines += c == '\n';
  CHECK(lines == 10);
  // The byte bound: 40 lines of 200 bytes are more than 4 KiB.
  std::string wide;
  for (int i = 0; i < 40; ++i) wide += std::string(199, 'a' + i % 26) + "\n";
  wide += "LAST";
  const std::string w = text_block(wide, "");
  CHECK(w.size() < 4096 + 41 * 2 + 64);
  CHECK(w.substr(w.size() - 5) == "LAST\n");
  // One line over the bound keeps its start and its end.
  const std::string one = text_block(std::string(10'000, 'x') + "END", "", {});
  CHECK(one.size() < 4200);
  CHECK(one.find("bytes elided ...]") != std::string::npos);
  CHECK(one.substr(one.size() - 4) == "END\n");
}

// ---- The supervisor's summary, with a fake spawner (no processes) ------------------------

namespace {

struct RcHarness {
  boost::asio::io_context io;
  FakeSpawner spawner{io};
  CaptureConsole console;
  EventLog events;
  RcScratch dir;
  std::unique_ptr<Supervisor> sup;

  explicit RcHarness(int nproc, std::function<void(SupervisorOptions&)> tweak = {}) {
    SupervisorOptions o;
    o.plan.nproc = nproc;
    o.plan.world_size = nproc;
    o.plan.device = Device::kCpu;
    o.plan.run_id = "t";
    o.plan.master_addr = "127.0.0.1";
    o.plan.master_port = 1234;
    o.plan.run_dir = (dir.path / "run").string();
    o.argv = {"/bin/true"};
    o.grace_period = 100ms;
    o.kill_timeout = 200ms;
    o.drain_timeout = 100ms;
    o.poll_interval = 5ms;
    o.memory_event_files = std::vector<std::string>{};  // no real cgroup
    if (tweak) tweak(o);
    sup = std::make_unique<Supervisor>(io, o, spawner, console, events);
  }
  /// Runs ready handlers without waiting for timers.
  void settle_io() {
    io.restart();
    io.poll();
  }
  void drive() {
    const auto end = std::chrono::steady_clock::now() + 3s;
    while (!sup->done() && std::chrono::steady_clock::now() < end) {
      io.restart();
      io.run_for(5ms);
    }
  }
  std::string error_file(std::size_t i) const {
    return spawner.procs.at(i)->request.env.at("TORCHELASTIC_ERROR_FILE");
  }
  void write_error_file(std::size_t i, const std::string& message) const {
    std::filesystem::create_directories(std::filesystem::path(error_file(i)).parent_path());
    std::ofstream(error_file(i)) << R"({"message": {"message": )" << message
                                 << R"(, "extraInfo": {"timestamp": "0"}}})";
  }
};

}  // namespace

TEST_CASE(
    "root cause summary: a rank that destroyed its group before raising is named, not the peer "
    "whose connection it closed") {
  RcHarness h(2);
  h.sup->start();
  // Rank 0 sees its peer's connection close and is reaped first...
  h.write_error_file(0, R"("RuntimeError: [pair.cc:598] Connection closed by peer [127.0.0.1]:1")");
  h.spawner.output(0, StreamId::kStderr, std::string(kRcClosed) + "\n");
  h.spawner.exit(0, {1, 0});
  // ...then rank 1's @record writes the real error and it exits 1 (before gpurun's SIGTERM).
  h.write_error_file(1, R"("ValueError: bad learning rate 10.0")");
  h.spawner.output(1, StreamId::kStderr, "ValueError: bad learning rate 10.0\n");
  h.spawner.exit(1, {1, 0});
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 1);
  const std::string& err = h.console.err;
  INFO(err);
  CHECK(err.find("root cause (first failure in time):") != std::string::npos);
  CHECK(err.find("rank       : 1 (local rank 1)") != std::string::npos);
  CHECK(err.find("message    : ValueError: bad learning rate 10.0") != std::string::npos);
  CHECK(err.find("also failed: rank 0 (pid 1000) ended with exit code 1 (RuntimeError: "
                 "[pair.cc:598] Connection closed by peer [127.0.0.1]:1): a connection closed by "
                 "the failing rank, not a cause") != std::string::npos);
}

TEST_CASE("root cause summary: a SIGKILL the memory cgroup counted is an OOM kill") {
  RcScratch cg;
  const std::string events = cg.write("memory.events", "oom 0\noom_kill 4\n");
  RcHarness h(2, [&](SupervisorOptions& o) { o.memory_event_files = std::vector{events}; });
  h.sup->start();
  cg.write("memory.events", "oom 1\noom_kill 5\n");  // the kernel killed a process of the job
  h.spawner.exit(1, {0, SIGKILL});
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 137);
  const std::string& err = h.console.err;
  INFO(err);
  const std::string oom = "killed by the kernel's out-of-memory killer (host memory; cgroup " +
                          cg.path.string() + " oom_kill 5)";
  CHECK(err.find("rank 1 (pid 1001) ended with signal SIGKILL (9): " + oom) != std::string::npos);
  CHECK(err.find("exit       : signal SIGKILL (9): " + oom) != std::string::npos);
}

TEST_CASE("root cause: an OOM kill's cause is said wherever the death is (describe)") {
  // The elastic controller's lines ("gpu 1 (…) ended with …; the job goes on without it") and
  // the event log take ExitStatus::describe().
  ExitStatus st{0, SIGKILL, oom_kill_sentence("cgroup /sys/fs/cgroup/job oom_kill 2")};
  CHECK(st.describe() ==
        "signal SIGKILL (9): killed by the kernel's out-of-memory killer (host memory; cgroup "
        "/sys/fs/cgroup/job oom_kill 2)");
  CHECK(ExitStatus{0, SIGKILL}.describe() == "signal SIGKILL (9)");
  CHECK(ExitStatus{3, 0}.describe() == "exit code 3");
}

TEST_CASE("root cause summary: a KeyboardInterrupt without a message reads cleanly") {
  RcHarness h(1);
  h.sup->start();
  h.write_error_file(0, R"("KeyboardInterrupt: ")");
  h.spawner.exit(0, {1, 0});
  h.drive();
  INFO(h.console.err);
  CHECK(h.console.err.find("message    : KeyboardInterrupt\n") != std::string::npos);
}

TEST_CASE("root cause summary: a SIGKILL the cgroup did not count is a plain SIGKILL") {
  RcScratch cg;
  const std::string events = cg.write("memory.events", "oom_kill 4\n");
  RcHarness h(1, [&](SupervisorOptions& o) { o.memory_event_files = std::vector{events}; });
  h.sup->start();
  h.spawner.exit(0, {0, SIGKILL});
  h.drive();
  CHECK(h.sup->exit_code() == 137);
  CHECK(h.console.err.find("exit       : signal SIGKILL (9)\n") != std::string::npos);
  CHECK(h.console.err.find("out-of-memory") == std::string::npos);
}

TEST_CASE("root cause summary: a CUDA out-of-memory is device memory; a long message is bounded") {
  RcHarness h(1);
  h.sup->start();
  std::string msg = "Caught OutOfMemoryError in DataLoader worker process 0.\\nOriginal Traceback";
  for (int i = 0; i < 80; ++i)
    msg += "\\n  File \\\"/usr/lib/python3/site-packages/m.py\\\", line 1";
  msg += "\\ntorch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
  h.write_error_file(0, "\"" + msg + "\"");
  h.spawner.exit(0, {1, 0});
  h.drive();
  const std::string& err = h.console.err;
  INFO(err);
  CHECK(err.find("gpurun:   message    :\ngpurun:     Caught OutOfMemoryError in DataLoader") !=
        std::string::npos);
  CHECK(err.find("gpurun:     [... ") != std::string::npos);
  CHECK(err.find("gpurun:     torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                 "2.00 GiB\n") != std::string::npos);
  CHECK(err.find("memory     : the GPU ran out of device memory (CUDA out of memory), not the "
                 "host") != std::string::npos);
}

// ---- The teardown hold: a first failure that is a teardown error waits for the real one ----

namespace {
/// Runs `h`'s io_context until `until()` holds or 3 s pass (a safety bound, not a check).
void rc_run_until(RcHarness& h, const std::function<bool()>& until) {
  const auto end = std::chrono::steady_clock::now() + 3s;
  while (!until() && std::chrono::steady_clock::now() < end) {
    h.io.restart();
    h.io.run_for(5ms);
  }
}
/// A few turns of `h`'s io_context: its 5 ms polls run (a hold of an hour cannot end).
void rc_turn(RcHarness& h) {
  for (int i = 0; i < 10; ++i) {
    h.io.restart();
    h.io.run_for(5ms);
  }
}
void rc_fail_closed(RcHarness& h, std::size_t i) {
  h.write_error_file(i, R"("RuntimeError: [pair.cc:598] Connection closed by peer [127.0.0.1]:1")");
  h.spawner.output(i, StreamId::kStderr, std::string(kRcClosed) + "\n");
  h.spawner.exit(i, {1, 0});
}
void rc_hold_for(SupervisorOptions& o, std::chrono::milliseconds hold) {
  o.teardown_hold = hold;
}
}  // namespace

TEST_CASE(
    "teardown hold: a peer's lost connection holds the SIGTERM until a rank fails of something "
    "else, which is the root cause; any other first failure stops the rest at once") {
  SUBCASE("a lost connection first: no SIGTERM while only teardown errors come") {
    RcHarness h(4, [](SupervisorOptions& o) { rc_hold_for(o, 1h); });
    h.sup->start();
    rc_fail_closed(h, 0);
    rc_fail_closed(h, 3);  // a second peer of the same failing rank: still waiting
    rc_turn(h);
    for (std::size_t i : {1, 2}) CHECK(h.spawner.procs[i]->signals.empty());
    CHECK(h.console.err.find("rank 0 (pid 1000) lost its connection to a peer (RuntimeError: "
                             "[pair.cc:598] Connection closed by peer [127.0.0.1]:1) and ended "
                             "with exit code 1: waiting up to 3600 s for the rank that failed "
                             "before stopping the others") != std::string::npos);
    // The rank that tore its group down raises (no @record: its stderr says why) and exits:
    // the teardown follows at once.
    h.spawner.output(1, StreamId::kStderr, "ValueError: bad learning rate 10.0\n");
    h.spawner.exit(1, {1, 0});
    CHECK(h.spawner.procs[2]->signals == std::vector<int>{SIGTERM});
    h.drive();
    REQUIRE(h.sup->done());
    CHECK(h.sup->exit_code() == 1);
    const std::string& err = h.console.err;
    INFO(err);
    CHECK(err.find("rank 1 (pid 1001) ended with exit code 1; stopping the other workers") !=
          std::string::npos);
    CHECK(err.find("rank       : 1 (local rank 1)") != std::string::npos);
    CHECK(err.find("| ValueError: bad learning rate 10.0") != std::string::npos);
  }
  SUBCASE("any other first failure: SIGTERM at once") {
    RcHarness h(3, [](SupervisorOptions& o) { rc_hold_for(o, 1h); });
    h.sup->start();
    h.write_error_file(0, R"("ValueError: bad learning rate 10.0")");
    h.spawner.exit(0, {1, 0});
    CHECK(h.spawner.procs[1]->signals == std::vector<int>{SIGTERM});
    CHECK(h.spawner.procs[2]->signals == std::vector<int>{SIGTERM});
    h.drive();
    CHECK(h.console.err.find("waiting up to") == std::string::npos);
  }
}

TEST_CASE("teardown hold: a running rank's error file ends it; that rank is the root cause") {
  RcHarness h(2, [](SupervisorOptions& o) { rc_hold_for(o, 1h); });
  h.sup->start();
  rc_fail_closed(h, 0);
  rc_turn(h);
  CHECK(h.spawner.procs[1]->signals.empty());
  // Rank 1's @record wrote its error; its exit is slow (an atexit callback): the next poll
  // reads the file and the teardown ends it.
  h.write_error_file(1, R"("ValueError: bad learning rate 10.0")");
  rc_run_until(h, [&] { return !h.spawner.procs[1]->signals.empty(); });
  CHECK(h.spawner.procs[1]->signals == std::vector<int>{SIGTERM});
  h.drive();
  REQUIRE(h.sup->done());
  CHECK(h.sup->exit_code() == 1);  // the first failure's status, not gpurun's SIGTERM
  const std::string& err = h.console.err;
  INFO(err);
  CHECK(err.find("rank 1 (pid 1001) failed (ValueError: bad learning rate 10.0), as its error "
                 "file ") != std::string::npos);
  CHECK(err.find("rank       : 1 (local rank 1)") != std::string::npos);
  CHECK(err.find("message    : ValueError: bad learning rate 10.0") != std::string::npos);
}

TEST_CASE("teardown hold: when nobody else fails within it, the lost connection is the cause") {
  RcHarness h(2, [](SupervisorOptions& o) { rc_hold_for(o, 40ms); });
  h.sup->start();
  rc_fail_closed(h, 0);
  h.settle_io();
  CHECK(h.spawner.procs[1]->signals.empty());  // held: not stopped on the failure itself
  rc_run_until(h, [&] { return !h.spawner.procs[1]->signals.empty(); });
  CHECK(h.spawner.procs[1]->signals == std::vector<int>{SIGTERM});
  h.drive();
  REQUIRE(h.sup->done());
  const std::string& err = h.console.err;
  INFO(err);
  CHECK(err.find("no other worker failed within 40 ms of rank 0's connection error; rank 0 "
                 "(pid 1000) ended with exit code 1; stopping the other workers") !=
        std::string::npos);
  CHECK(err.find("rank       : 0 (local rank 0)") != std::string::npos);
}

TEST_CASE("teardown hold: a stop signal, or a peer node's failure or stop, ends it at once") {
  for (const int how : {0, 1, 2}) {  // SIGTERM to gpurun, a peer node's failure, its SIGTERM
    CAPTURE(how);
    RcHarness h(2, [](SupervisorOptions& o) { rc_hold_for(o, 1h); });
    h.sup->start();
    rc_fail_closed(h, 0);
    h.settle_io();
    REQUIRE(h.spawner.procs[1]->signals.empty());
    REQUIRE(h.console.err.find("waiting up to 3600 s") != std::string::npos);
    if (how == 0) h.sup->handle_signal(SIGTERM);
    if (how == 1) h.sup->stop_for_peer("node 1 failed");
    if (how == 2) h.sup->peer_signal(SIGTERM, "node 1's gpurun received SIGTERM");
    CHECK(h.spawner.procs[1]->signals.at(0) == SIGTERM);
    h.drive();
    REQUIRE(h.sup->done());
    CHECK(h.sup->exit_code() == 1);  // rank 0's failure, not the signal's 143
  }
}
