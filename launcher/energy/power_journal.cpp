#include "energy/power_journal.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "gpurun/env_names.hpp"

#include "gpurun/abstract_lock.hpp"
#include "gpurun/error.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::energy {

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

/// An flock held on an open file until destroyed.
class FileLock {
 public:
  FileLock(const fs::path& path, int how) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0)
      throw Error(
          fmt::format("power journal: cannot open {}: {}", path.string(), std::strerror(errno)));
    while (::flock(fd_, how) != 0)
      if (errno != EINTR)
        throw Error(
            fmt::format("power journal: cannot lock {}: {}", path.string(), std::strerror(errno)));
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

fs::path lock_path(const fs::path& path) {
  return fs::path(path.string() + ".lock");
}

std::vector<JournalEntry> parse(const std::string& text, const fs::path& path) {
  std::vector<JournalEntry> out;
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return out;
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  const auto bad = [&](const std::string& what) {
    return Error(fmt::format("power journal {}: {}", path.string(), what));
  };
  if (ec) throw bad("not JSON (" + ec.message() + ")");
  const json::object* root = v.if_object();
  const json::value* entries = root ? root->if_contains("entries") : nullptr;
  if (!entries || !entries->is_array()) throw bad("no \"entries\" array");
  for (const json::value& ev : entries->as_array()) {
    const json::object* o = ev.if_object();
    if (!o) throw bad("an entry is not an object");
    JournalEntry e;
    const auto str = [&](const char* k) {
      const json::value* x = o->if_contains(k);
      if (!x || !x->is_string()) throw bad(fmt::format("an entry has no string \"{}\"", k));
      return std::string(x->as_string());
    };
    const auto num = [&](const char* k) -> int64_t {
      const json::value* x = o->if_contains(k);
      if (!x || !x->is_int64()) throw bad(fmt::format("an entry has no integer \"{}\"", k));
      return x->as_int64();
    };
    e.host = str("host");
    e.uuid = str("uuid");
    const int64_t mw = num("original_mw");
    if (mw < 0 || mw > 0xFFFFFFFFll) throw bad(fmt::format("original_mw {} is out of range", mw));
    e.original_mw = static_cast<unsigned>(mw);
    const json::value* c = o->if_contains("clocks_locked");
    e.clocks_locked = c && c->is_bool() && c->as_bool();
    e.guard_pid = num("guard_pid");
    e.since_ms = num("since_ms");
    out.push_back(std::move(e));
  }
  return out;
}

std::string render(const std::vector<JournalEntry>& entries) {
  json::array arr;
  for (const JournalEntry& e : entries)
    arr.push_back(json::object{{"host", e.host},
                               {"uuid", e.uuid},
                               {"original_mw", static_cast<int64_t>(e.original_mw)},
                               {"clocks_locked", e.clocks_locked},
                               {"guard_pid", e.guard_pid},
                               {"since_ms", e.since_ms}});
  return json::serialize(json::object{{"version", 1}, {"entries", std::move(arr)}}) + "\n";
}

std::string slurp(const fs::path& path) {
  try {
    const std::optional<FileContent> f =
        read_regular_file_if_exists(path, kDefaultMaxFileBytes, "the power journal");
    return f ? f->bytes : std::string();
  } catch (const FileError& e) {
    throw Error(fmt::format("power journal: {}", e.what()));
  }
}

bool usable_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  return fs::is_directory(dir, ec) && ::access(dir.c_str(), W_OK) == 0;
}

}  // namespace

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

fs::path journal_path() {
  if (const char* p = std::getenv(gpurun::env::kPowerJournal); p && *p) return p;
  if (::geteuid() == 0 && usable_dir("/var/lib/gpurun"))
    return "/var/lib/gpurun/power-journal.json";
  fs::path state;
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x == '/')
    state = x;
  else if (const char* h = std::getenv("HOME"); h && *h == '/')
    state = fs::path(h) / ".local" / "state";
  else
    state = "/tmp";  // no home: better than nothing (lost at a reboot)
  return state / "gpurun" / "power-journal.json";
}

std::vector<JournalEntry> read_journal(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec) && !ec) return {};  // a symlink loop (ec) is said by slurp()
  FileLock lock(lock_path(path), LOCK_SH);
  return parse(slurp(path), path);
}

void update_journal(const fs::path& path, const JournalEntry& e, bool remove) {
  std::error_code ec;
  if (!path.parent_path().empty()) {
    fs::create_directories(path.parent_path(), ec);
    if (ec)
      throw Error(fmt::format("power journal: cannot make {}: {}", path.parent_path().string(),
                              ec.message()));
  }
  FileLock lock(lock_path(path), LOCK_EX);
  std::vector<JournalEntry> entries = parse(slurp(path), path);
  bool found = false;
  for (auto it = entries.begin(); it != entries.end();) {
    if (it->host != e.host || it->uuid != e.uuid ||
        (remove && e.guard_pid != 0 && it->guard_pid != 0 && it->guard_pid != e.guard_pid)) {
      ++it;
      continue;
    }
    if (remove) {
      it = entries.erase(it);
      continue;
    }
    const unsigned first = it->original_mw;
    const bool clocks = it->clocks_locked;
    *it = e;
    if (first != 0) it->original_mw = first;  // the first original wins
    it->clocks_locked = it->clocks_locked || clocks;
    found = true;
    ++it;
  }
  if (!remove && !found) entries.push_back(e);
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << render(entries);
    out.flush();
    if (!out)
      throw Error(
          fmt::format("power journal: cannot write {}: {}", tmp.string(), std::strerror(errno)));
  }
  fs::rename(tmp, path, ec);
  if (ec)
    throw Error(fmt::format("power journal: cannot replace {}: {}", path.string(), ec.message()));
}

std::vector<std::string> recover_journal(const Nvml& nvml, const fs::path& path) {
  std::vector<std::string> said;
  std::vector<JournalEntry> entries;
  try {
    entries = read_journal(path);
  } catch (const Error& e) {
    return {fmt::format("{}; no limit left by an earlier run is restored", e.what())};
  }
  const std::string host = host_name();
  for (const JournalEntry& e : entries) {
    if (e.host != host) continue;
    const int lock = take_abstract_lock(gpu_lock_name(e.uuid));
    if (lock < 0) continue;  // a live guard holds it: another job's GPU, still managed
    const std::string from = fmt::format(
        "left changed by a gpurun whose power guard (pid {}) ended without restoring it",
        e.guard_pid);
    try {
      const NvmlDevice d = nvml.device_by_uuid(e.uuid);
      std::string what;
      if (e.original_mw != 0 && nvml.power_limit_mw(d) != e.original_mw) {
        nvml.set_power_limit_mw(d, e.original_mw);
        what = fmt::format("restored {} to {:g} W", e.uuid, e.original_mw / 1000.0);
      }
      if (e.clocks_locked) {
        nvml.reset_gpu_locked_clocks(d);
        what += what.empty() ? fmt::format("reset the locked clocks of {}", e.uuid)
                             : ", and reset its locked clocks";
      }
      if (what.empty())
        what = fmt::format("{} was already back at its original {:g} W", e.uuid,
                           e.original_mw / 1000.0);
      update_journal(path, e, /*remove=*/true);
      said.push_back(fmt::format("{} ({}; power journal {})", what, from, path.string()));
    } catch (const std::exception& ex) {
      said.push_back(
          fmt::format("could not restore {} from the power journal {} ({}): {}; it "
                      "stays recorded for the next start",
                      e.uuid, path.string(), from, ex.what()));
    }
    ::close(lock);
  }
  return said;
}

}  // namespace gpurun::energy
