#include "supervisor/run_dir.hpp"
#include "supervisor/worker_env.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "gpurun/error.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::supervisor {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOwnerFile = "owner";

/// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); empty if gone.
std::string start_time(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  const auto close = line.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
  }
  return field;
}

/// This process's pid namespace ("pid:[4026531836]"); empty when /proc does not say.
std::string pid_namespace() {
  std::error_code ec;
  const fs::path ns = fs::read_symlink("/proc/self/ns/pid", ec);
  return ec ? std::string() : ns.string();
}

std::string make_temp(const std::string& tmpl_in) {
  std::string tmpl = tmpl_in;
  if (!::mkdtemp(tmpl.data()))
    throw Error(fmt::format("cannot create run directory '{}': {}", tmpl_in, std::strerror(errno)));
  return tmpl;
}

/// The per-user base, created 0700; nullopt if it exists but is not ours (then the
/// caller falls back to a directory directly in the temp dir).
std::optional<std::string> private_base() {
  const std::string base = temp_run_base();
  const std::string parent = fs::path(base).parent_path().string();
  for (const std::string& d : {parent, base}) {
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) return std::nullopt;
    struct stat st {};
    if (::lstat(d.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid())
      return std::nullopt;
  }
  return base;
}

}  // namespace

std::string temp_run_base() {
  return (fs::temp_directory_path() / fmt::format("gpurun-{}", ::getuid()) / "runs").string();
}

RunDir make_run_dir(const std::optional<std::string>& log_dir, const std::string& run_id) {
  RunDir out;
  if (log_dir) {
    std::error_code ec;
    fs::create_directories(*log_dir, ec);
    if (ec)
      throw Error(fmt::format("cannot create log directory '{}': {}", *log_dir, ec.message()));
    out.path = fs::absolute(make_temp(*log_dir + "/" + run_id + "_XXXXXX")).string();
    return out;
  }
  std::string safe;
  for (char c : run_id)
    safe.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_');
  const auto base = private_base();
  const std::string dir = base ? *base : fs::temp_directory_path().string();
  out.path =
      fs::absolute(make_temp(fmt::format("{}/gpurun-{}-XXXXXX", dir, safe.substr(0, 64)))).string();
  out.temporary = true;
  std::ofstream owner(out.path + "/" + kOwnerFile);
  // Its pid namespace too: a pid means nothing in another one (a container, `unshare -p`
  // sharing /tmp), whose gpurun must not take this run dir for a dead owner's.
  owner << ::getpid() << " " << start_time(::getpid()) << " " << pid_namespace() << "\n";
  return out;
}

int remove_stale_run_dirs(const std::string& base) {
  int removed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base, ec)) {
    // Never blocks nor grows: an owner file that is not a small regular file names no owner.
    std::istringstream in;
    try {
      const std::optional<FileContent> f =
          read_regular_file_if_exists(e.path() / kOwnerFile, 4096, "the owner file");
      if (!f) continue;
      in.str(f->bytes);
    } catch (const FileError&) {
      continue;
    }
    long pid = 0;
    std::string started, ns;
    if (!(in >> pid >> started) || pid <= 0) continue;  // kept logs, or being created
    if (in >> ns && ns != pid_namespace()) continue;    // its pid is not ours to look up
    if (pid == ::getpid() || start_time(pid) == started) continue;  // owner still runs
    remove_snapshot(e.path().string());  // a pause's state in /dev/shm, if the owner left one
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (!rm) ++removed;
  }
  return removed;
}

void release_run_dir(const RunDir& dir, bool keep) {
  if (!dir.temporary) return;
  std::error_code ec;
  if (keep)
    fs::remove(fs::path(dir.path) / kOwnerFile, ec);
  else
    fs::remove_all(dir.path, ec);
}

}  // namespace gpurun::supervisor
