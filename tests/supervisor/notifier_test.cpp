// [notify] command runner (launcher/supervisor/notifier.hpp): which events, their order, the
// record on stdin, failures said once, a command past its timeout killed. docs/sharing.md.
#include "supervisor/notifier.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "gpurun_process.hpp"

using gpurun::supervisor::Notifier;
using gpurun::supervisor::notify_wants;
using gpurun::testing::slurp;
using gpurun::testing::TempDir;
using namespace std::chrono_literals;

namespace {

struct Warnings {
  std::mutex mu;
  std::vector<std::string> lines;
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
  CHECK(w.lines.empty());
}

TEST_CASE("Notifier: a failing command is said once; one past its timeout is killed") {
  Warnings w;
  {
    Notifier n("exit 4", 10s, w.sink());
    n.post("lease", "{}");
    n.post("lease_end", "{}");
    n.post("shutdown", "{}");
  }
  REQUIRE(w.lines.size() == 1);
  CHECK(w.lines[0] ==
        "notify: the command for 'lease' exited with 4; the job goes on (later failures are not "
        "reported)");
  Warnings t;
  std::pair<int, int> counts;
  {
    // The shell and the sleep it starts: both are in the command's process group.
    Notifier n("sleep 30 & wait", 100ms, t.sink());
    n.post("shutdown", "{}");
    n.post("lease", "{}");
    while (n.failures().first < 2) std::this_thread::sleep_for(10ms);
    counts = n.failures();
  }
  REQUIRE(t.lines.size() == 1);
  CHECK(t.lines[0] ==
        "notify: the command for 'shutdown' ran past timeout_s = 0.1 and was killed; the job goes "
        "on (later failures are not reported)");
  CHECK(counts == std::pair<int, int>{2, 0});
}

TEST_CASE("Notifier: a command that never reads stdin, and one that closes it, are fine") {
  Warnings w;
  {
    Notifier n("exec 0<&-; true", 10s, w.sink());
    n.post("shutdown", std::string(1 << 20, 'x'));  // far more than a socket buffer
    Notifier m("true", 10s, w.sink());
    m.post("shutdown", "{}");
  }
  CHECK(w.lines.empty());
}
