// gpurun::testing::ElasticRun — the real gpurun binary run as a child in a test, with an
// event log and (optionally) a config.toml the test rewrites; helpers to wait for decisions.
// Used by the control and worker-runtime integration tests. Needs doctest and Boost.JSON.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <boost/json.hpp>

#include "gpurun_process.hpp"

namespace gpurun::testing {

namespace fs = std::filesystem;
namespace json = boost::json;

/// Replaces `p` with `text` the way an editor does (temporary file + rename).
inline void write_file(const fs::path& p, const std::string& text) {
  // temp + rename, like an editor
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
  }
  fs::rename(tmp, p);
}

/// GPURUN --device DEVICE --nproc N [--config DIR/config.toml] --event-log DIR/events.jsonl
///        --run-id RUN_ID --master-port 0 EXTRA... COMMAND..., output captured in DIR
/// (gpurun.stdout, gpurun.stderr); `gpurun status` registrations go to DIR/xdg.
struct ElasticRun {
  fs::path dir;
  ChildProcess proc;
  std::chrono::milliseconds hang_guard{std::chrono::seconds(60)};

  /// `config` nullopt: a plain run (no --config).
  ElasticRun(const std::string& gpurun, const fs::path& d, int nproc,
             const std::optional<std::string>& config, std::vector<std::string> command,
             std::vector<std::string> extra = {}, std::string device = "cpu",
             std::map<std::string, std::string> env = {}, const std::string& run_id = "ctl-test")
      : dir(d),
        proc(args(gpurun, d, nproc, config, extra, device, command, run_id), with_xdg(d, env),
             d / "gpurun.stdout", d / "gpurun.stderr") {}

  bool wait(std::chrono::milliseconds limit) { return proc.wait(limit); }
  int code() const { return proc.code(); }

  static std::vector<std::string> args(const std::string& gpurun, const fs::path& dir, int nproc,
                                       const std::optional<std::string>& config,
                                       const std::vector<std::string>& extra,
                                       const std::string& device,
                                       const std::vector<std::string>& command,
                                       const std::string& run_id) {
    std::vector<std::string> a = {gpurun, "--device", device, "--nproc", std::to_string(nproc)};
    if (config) {
      write_file(dir / "config.toml", *config);
      a.push_back("--config");
      a.push_back((dir / "config.toml").string());
    }
    a.insert(a.end(), {"--event-log", (dir / "events.jsonl").string(), "--run-id", run_id,
                       "--master-port", "0"});
    a.insert(a.end(), extra.begin(), extra.end());
    a.insert(a.end(), command.begin(), command.end());
    return a;
  }
  // Registrations go to DIR/xdg so `gpurun status` in a test sees only its own runs.
  static std::map<std::string, std::string> with_xdg(const fs::path& dir,
                                                     std::map<std::string, std::string> env) {
    env.emplace("XDG_RUNTIME_DIR", (dir / "xdg").string());
    return env;
  }
  std::string diag() const {
    return "--- gpurun stderr ---\n" + slurp(dir / "gpurun.stderr") + "--- events ---\n" +
           slurp(dir / "events.jsonl");
  }

  std::vector<json::object> events(const std::string& name = "") const {
    std::vector<json::object> out;
    std::istringstream in(slurp(dir / "events.jsonl"));
    for (std::string line; std::getline(in, line);) {
      boost::system::error_code ec;
      auto v = json::parse(line, ec);
      if (ec || !v.is_object()) continue;
      if (name.empty() || v.as_object()["event"].as_string() == name) out.push_back(v.as_object());
    }
    return out;
  }
  /// Resize decisions (and starts) so far, in order (not `continue`, not a pause's `snapshot`
  /// round).
  std::vector<json::object> resizes() const {
    std::vector<json::object> out;
    for (auto& e : events("decision"))
      if (e.at("kind").as_string() != "continue" && e.at("kind").as_string() != "snapshot")
        out.push_back(e);
    return out;
  }
  /// Waits until `pred` holds, up to the hang guard.
  void wait_for(const std::string& what, const std::function<bool()>& pred) {
    bool exited = false;
    const bool held = poll_until(
        [&] {
          if (pred()) return true;
          exited = wait(std::chrono::milliseconds(0));
          return exited;
        },
        hang_guard, std::chrono::milliseconds(50));
    if (!held) FAIL("timed out waiting for " << what << "\n" << diag());
    if (exited)
      FAIL("gpurun exited (" << code() << ") while waiting for " << what << "\n" << diag());
  }
  /// Waits for the n-th (1-based, counting the start) non-continue decision; returns it.
  json::object wait_resize(size_t n) {
    wait_for("resize decision #" + std::to_string(n), [&] { return resizes().size() >= n; });
    return resizes()[n - 1];
  }
  /// Waits for at least `k` continue decisions after the latest resize (workers training).
  void wait_continues(size_t k) {
    wait_for(std::to_string(k) + " continue decisions", [&] {
      size_t c = 0;
      for (auto& e : events("decision")) {
        const auto& kind = e["kind"].as_string();
        c = kind == "continue" ? c + 1 : kind == "snapshot" ? c : 0;  // a tried pause: no resize
      }
      return c >= k;
    });
  }
};

}  // namespace gpurun::testing
