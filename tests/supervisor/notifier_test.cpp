// [notify] command runner (launcher/supervisor/notifier.hpp): which events, their order, the
// record on stdin, failures said once, a command past its timeout killed. docs/sharing.md.
#include "supervisor/notifier.hpp"
#include "supervisor/owned_children.hpp"

#include <doctest/doctest.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "gpurun_process.hpp"

using gpurun::supervisor::Notifier;
using gpurun::supervisor::notify_wants;
using gpurun::testing::poll_until;
using gpurun::testing::slurp;
using gpurun::testing::TempDir;
using namespace std::chrono_literals;

namespace {

struct Warnings {
  std::mutex mu;
  std::vector<std::string> lines;
  /// The lines that are not the end-of-run note ("notify: running the N queued ...").
  std::vector<std::string> problems() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::string> out;
    for (const auto& l : lines)
      if (l.rfind("notify: running the ", 0) != 0) out.push_back(l);
    return out;
  }
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& l) {
      std::lock_guard<std::mutex> lock(mu);
      lines.push_back(l);
    };
  }
};

}  // namespace

TEST_CASE("notify_wants: resizes, exits, leases, failures, early stop and the end; not the rest") {
  CHECK(notify_wants("decision", R"({"event": "decision", "kind": "resize", "active": []})"));
  CHECK(notify_wants("decision", R"({"event": "decision", "kind": "exit"})"));
  CHECK_FALSE(notify_wants("decision", R"({"event": "decision", "kind": "continue"})"));
  CHECK_FALSE(notify_wants("decision", R"({"event": "decision", "kind": "snapshot"})"));
  CHECK(notify_wants("worker_exited", R"({"event": "worker_exited", "code": 3})"));
  CHECK(notify_wants("worker_exited", R"({"event": "worker_exited", "signal": "SIGKILL"})"));
  CHECK_FALSE(notify_wants("worker_exited", R"({"event": "worker_exited", "code": 0})"));
  CHECK_FALSE(
      notify_wants("worker_exited",
                   R"({"event": "worker_exited", "signal": "SIGKILL", "ended_by_gpurun": true})"));
  for (const char* e : {"lease", "lease_end", "yield", "yield_end", "early_stop", "shutdown"})
    CHECK(notify_wants(e, "{}"));
  CHECK_FALSE(notify_wants("worker_state", "{}"));
  CHECK_FALSE(notify_wants("energy", "{}"));
}

TEST_CASE(
    "Notifier: each wanted record on stdin, in order, with its event name; all run at the end") {
  TempDir dir;
  const std::string out = dir.str() + "/got";
  Warnings w;
  {
    Notifier n("printf '%s ' \"$GPURUN_NOTIFY_EVENT\" >> '" + out + "'; cat >> '" + out + "'", 10s,
               w.sink());
    n.post("lease", R"({"event": "lease", "gpus": [2]})");
    n.post("worker_state", R"({"event": "worker_state"})");  // not wanted: never run
    n.post("decision", R"({"event": "decision", "kind": "resize"})");
    n.post("shutdown", R"({"event": "shutdown", "exit_code": 0})");
  }  // the destructor runs what is queued
  CHECK(slurp(out) ==
        "lease {\"event\": \"lease\", \"gpus\": [2]}\n"
        "decision {\"event\": \"decision\", \"kind\": \"resize\"}\n"
        "shutdown {\"event\": \"shutdown\", \"exit_code\": 0}\n");
  CHECK(w.problems().empty());
}

TEST_CASE("Notifier: a failing command is said once; one past its timeout is killed") {
  Warnings w;
  {
    Notifier n("exit 4", 10s, w.sink());
    n.post("lease", "{}");
    n.post("lease_end", "{}");
    n.post("shutdown", "{}");
  }
  REQUIRE(w.problems().size() == 1);
  CHECK(w.problems()[0] ==
        "notify: the command for 'lease' exited with 4; the job goes on (later failures are not "
        "reported)");
  Warnings t;
  std::pair<int, int> counts;
  {
    // The shell and the sleep it starts: both are in the command's process group.
    Notifier n("sleep 30 & wait", 100ms, t.sink());
    n.post("shutdown", "{}");
    n.post("lease", "{}");
    REQUIRE(poll_until([&] { return n.failures().first >= 2; }, 20s));
    counts = n.failures();
  }
  REQUIRE(t.problems().size() == 1);
  CHECK(t.problems()[0] ==
        "notify: the command for 'shutdown' ran past timeout_s = 0.1 and was killed; the job goes "
        "on (later failures are not reported)");
  CHECK(counts == std::pair<int, int>{2, 0});
}

TEST_CASE("Notifier: a command that is not found is said once and not run again") {
  // Issue 44: the shell's "not found" was printed on every notify event.
  TempDir dir;
  const std::string ran = dir.str() + "/ran";
  Warnings w;
  std::pair<int, int> counts;
  {
    Notifier n("echo x >> '" + ran + "'; gpurun-test-no-such-notify-command", 10s, w.sink());
    n.post("lease", "{}");
    n.post("lease_end", "{}");
    n.post("shutdown", "{}");
    REQUIRE(poll_until([&] { return n.failures().first >= 1; }, 20s));
    std::this_thread::sleep_for(200ms);  // time to run (wrongly) the two later events
    counts = n.failures();
  }
  const auto p = w.problems();
  REQUIRE(p.size() == 2);
  // The shell's own words, once, under the event's name (dash: "/bin/sh: 1: …: not found").
  CHECK(p[0].rfind("notify: [lease] ", 0) == 0);
  CHECK(p[0].find("gpurun-test-no-such-notify-command") != std::string::npos);
  CHECK(p[0].find("not found") != std::string::npos);
  CHECK(p[1] ==
        "notify: the command for 'lease' exited with 127 (not found): it is not run again for "
        "later events; the job goes on (fix [notify] command)");
  CHECK(slurp(ran) == "x\n");  // run once, not for lease_end and shutdown
  CHECK(counts.first == 1);
}

TEST_CASE("Notifier: a command's stderr is forwarded bounded, the rest counted") {
  // Issue 44: a notify command's stderr (65 MB) flooded gpurun's.
  Warnings w;
  {
    Notifier n("head -c 10000000 /dev/zero | tr '\\0' x >&2; echo >&2; echo last >&2", 30s,
               w.sink());
    n.post("lease", "{}");
  }
  const auto p = w.problems();
  REQUIRE(p.size() == 2);
  CHECK(p[0] == "notify: [lease] " + std::string(Notifier::kMaxStderrBytes, 'x'));
  CHECK(p[1] ==
        "notify: [lease] and 9995910 more bytes of the command's stderr, not shown (only the "
        "first 4096 bytes of each run are)");
}

TEST_CASE("Notifier: a command that never reads stdin, and one that closes it, are fine") {
  Warnings w;
  {
    Notifier n("exec 0<&-; true", 10s, w.sink());
    n.post("shutdown", std::string(1 << 20, 'x'));  // far more than a socket buffer
    Notifier m("true", 10s, w.sink());
    m.post("shutdown", "{}");
  }
  CHECK(w.problems().empty());
}

TEST_CASE("Notifier: the spawner's orphan reaper never takes a notify command's exit") {
  // The reaper (posix_spawner.cpp) waits for every child that is not a worker, whenever a
  // worker exits: here as fast as it can, beside 30 commands that each exit 4.
  Warnings w;
  std::atomic<bool> stop{false};
  std::thread reaper([&] {
    while (!stop) gpurun::supervisor::reap_children_except({});
  });
  std::pair<int, int> counts;
  {
    Notifier n("exit 4", 10s, w.sink());
    for (int i = 0; i < 30; ++i) n.post("lease", "{}");
    // A stolen exit is a command whose failure is never counted: wait 20 s at most for 30.
    poll_until([&] { return n.failures().first >= 30; }, 20s);
    counts = n.failures();
  }
  stop = true;
  reaper.join();
  CHECK(counts == std::pair<int, int>{30, 0});  // each exit status seen: none stolen
  REQUIRE(w.problems().size() == 1);
  CHECK(w.problems()[0].find("exited with 4") != std::string::npos);
}

TEST_CASE("Notifier: at its end the queue gets one timeout in all, and says so") {
  Warnings w;
  const auto t0 = std::chrono::steady_clock::now();
  {
    Notifier n("sleep 30", 300ms, w.sink());
    for (int i = 0; i < 20; ++i) n.post("lease", "{}");
  }  // 20 commands of 300 ms each would be 6 s; the drain has 300 ms for all of them
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // the mechanism, with a 16x margin
  std::string all;
  for (const auto& l : w.lines) all += l + "\n";
  CHECK(all.find("notify: running the ") != std::string::npos);
  CHECK(all.find("not sent: gpurun is ending") != std::string::npos);
}

TEST_CASE("Notifier: the command starts with no signal blocked or ignored, whatever gpurun's") {
  // gpurun ignores SIGPIPE (main.cpp) and its threads block signals: neither reaches the
  // command, which would otherwise, e.g., never die of a closed pipe.
  TempDir dir;
  struct sigaction old_pipe {};
  ::sigaction(SIGPIPE, nullptr, &old_pipe);
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t block, old_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &block, &old_mask);  // the notifier's thread inherits it
  Warnings w;
  {
    Notifier n("grep -E '^Sig(Blk|Ign):' /proc/self/status > " + (dir.path / "signals").string(),
               10s, w.sink());
    n.post("shutdown", "{}");
  }
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  CHECK(w.problems().empty());
  const std::string text = slurp(dir.path / "signals");
  INFO("the /proc status of a program the command runs: ", text);
  // Without glibc's internal signals 32 and 33 (posix_spawn's child ignores them).
  constexpr unsigned long long kGlibcInternal = (1ULL << 31) | (1ULL << 32);
  for (const char* field : {"SigBlk:", "SigIgn:"}) {
    const auto at = text.find(field);
    REQUIRE(at != std::string::npos);
    CHECK((std::stoull(text.substr(at + 7), nullptr, 16) & ~kGlibcInternal) == 0);
  }
}
