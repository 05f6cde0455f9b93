#include "supervisor/event_log.hpp"

#include <doctest/doctest.h>

#include <algorithm>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>

#include "gpurun/clock.hpp"
#include "gpurun/error.hpp"

using namespace gpurun::supervisor;
using gpurun::append_json_string;
using std::chrono::milliseconds;
using std::chrono::system_clock;

TEST_CASE("event log: RFC 3339 timestamps with milliseconds and Z") {
  CHECK(EventLog::format_timestamp(system_clock::time_point(milliseconds(0))) ==
        "1970-01-01T00:00:00.000Z");
  CHECK(EventLog::format_timestamp(system_clock::time_point(milliseconds(1738324800123))) ==
        "2025-01-31T12:00:00.123Z");
}

TEST_CASE("event log: record format and escaping") {
  const auto t = system_clock::time_point(milliseconds(1000));
  CHECK(
      EventLog::format_record(t, "shutdown", JsonObject().add("exit_code", 7).add("reason", "x")) ==
      R"({"ts": "1970-01-01T00:00:01.000Z", "event": "shutdown", "exit_code": 7, "reason": "x"})");
  CHECK(EventLog::format_record(t, "start", {}) ==
        R"({"ts": "1970-01-01T00:00:01.000Z", "event": "start"})");
  JsonObject o;
  o.add("cmd", std::vector<std::string>{"a b", "q\"\\\n\t\x01"}).add("ok", true).add_null("n");
  CHECK(o.str() == R"({"cmd": ["a b", "q\"\\\n\t\u0001"], "ok": true, "n": null})");
}

TEST_CASE("event log: strings stay valid UTF-8 JSON whatever bytes they hold") {
  std::string out;
  append_json_string(out, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x80");  // valid: copied
  CHECK(out == "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x80\"");
  out.clear();
  append_json_string(out, "\xff\xfe");  // not UTF-8: each byte escaped
  CHECK(out == R"("\u00ff\u00fe")");
  out.clear();
  append_json_string(out, "a\xc3");  // truncated sequence at the end
  CHECK(out == R"("a\u00c3")");
  out.clear();
  append_json_string(out, "\xc0\xaf \xed\xa0\x80");  // overlong '/', UTF-16 surrogate
  CHECK(out == R"("\u00c0\u00af \u00ed\u00a0\u0080")");
}

TEST_CASE("event log: one line per event, appended") {
  const auto path = std::filesystem::temp_directory_path() /
                    ("gpurun-evlog-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  {
    const gpurun::FakeClock clock(system_clock::time_point(milliseconds(5)));
    EventLog log(path.string(), &clock);
    CHECK(log.enabled());
    log.emit("start", JsonObject().add("nproc", 2));
    log.emit("worker_exited", JsonObject().add("rank", 1).add("signal", "SIGSEGV"));
  }
  {
    EventLog again(path.string());
    again.emit("shutdown", JsonObject().add("exit_code", 0));
  }
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == R"({"ts": "1970-01-01T00:00:00.005Z", "event": "start", "nproc": 2})");
  CHECK(lines[1].find(R"("event": "worker_exited", "rank": 1, "signal": "SIGSEGV")") !=
        std::string::npos);
  CHECK(std::regex_match(
      lines[2],
      std::regex(
          R"(\{"ts": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", "event": "shutdown", "exit_code": 0\})")));
  std::filesystem::remove(path);

  EventLog off;
  CHECK_FALSE(off.enabled());
  off.emit("start");  // dropped, no crash
  CHECK_THROWS_AS(EventLog("/nonexistent-dir/x.jsonl"), gpurun::Error);
}

namespace {
/// Runs `body` with fd 2 redirected to a file; returns what was written to it.
std::string stderr_of(const std::function<void()>& body) {
  char tmpl[] = "/tmp/gpurun-evlog-stderr-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  REQUIRE(fd >= 0);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(fd, STDERR_FILENO);
  body();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(fd);
  std::ifstream in(tmpl);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  ::unlink(tmpl);
  return text;
}
}  // namespace

TEST_CASE("event log: a failed write is one 'gpurun: warning:' line naming the file") {
  const std::string text = stderr_of([] {
    EventLog full("/dev/full");  // every write fails with ENOSPC
    full.emit("start");
    full.emit("shutdown");  // reported once only
  });
  CHECK(text.rfind("gpurun: warning: writing event log '/dev/full' failed: No space left on "
                   "device (0 of ",
                   0) == 0);
  CHECK(text.find(" bytes of a record written); the job goes on (later failures are not "
                  "reported)\n") != std::string::npos);
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
}

TEST_CASE("event log: a record over the size limit is replaced by a short one saying so") {
  const auto path = std::filesystem::temp_directory_path() /
                    ("gpurun-evlog-big-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(path);
  {
    const gpurun::FakeClock clock(system_clock::time_point(milliseconds(5)));
    EventLog log(path.string(), &clock);
    log.emit("config_rejected", JsonObject().add("error", std::string(30u << 20, 'x')));
    log.emit("shutdown", JsonObject().add("exit_code", 0));
  }
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 2);
  CHECK(
      lines[0] ==
      R"({"ts": "1970-01-01T00:00:00.005Z", "event": "config_rejected", "truncated": true, "record_bytes": 31457355, "limit_bytes": 65536})");
  CHECK(lines[1].find(R"("event": "shutdown")") != std::string::npos);
  std::filesystem::remove(path);
}
