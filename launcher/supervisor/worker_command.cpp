#include "supervisor/worker_command.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <chrono>

#include "gpurun/helper_process.hpp"

namespace gpurun::supervisor {

namespace {
bool executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

std::string worker_python(const Options& o, const EnvMap& env) {
  if (o.python) return *o.python;
  // torchrun's PYTHON_EXEC first, then gpurun's PYTHON, then python3 from PATH.
  if (auto it = env.find("PYTHON_EXEC"); it != env.end() && !it->second.empty()) return it->second;
  if (auto it = env.find("PYTHON"); it != env.end() && !it->second.empty()) return it->second;
  return "python3";
}

std::string local_rank_argument(std::string_view torch_version) {
  int major = 0;
  const auto [end, ec] =
      std::from_chars(torch_version.data(), torch_version.data() + torch_version.size(), major);
  if (ec != std::errc() || end == torch_version.data()) return "--local-rank";
  return major < 2 ? "--local_rank" : "--local-rank";
}

std::string local_rank_argument_for(const Options& o, const EnvMap& env) {
  if (!o.launch_shape || o.use_env) return "";
  // No such interpreter, no torch, too slow: "" (the workers' start says what is wrong).
  const std::optional<std::string> version = output_of(
      {worker_python(o, env), "-c", "import importlib.metadata as m; print(m.version('torch'))"},
      std::chrono::seconds(10));
  return local_rank_argument(version.value_or(""));
}

std::vector<std::string> worker_argv(const Options& o, const EnvMap& env) {
  const std::string python = worker_python(o, env);
  std::vector<std::string> argv;
  if (o.run_path) {  // torchrun runs it with runpy.run_path: gpurun in a fresh interpreter
    argv = {python, "-u"};
  } else if (o.module) {
    argv = {python, "-u", "-m"};
  } else if (!o.no_python && !o.command.empty() && ends_with(o.command.front(), ".py")) {
    argv = {python, "-u"};
  }
  argv.insert(argv.end(), o.command.begin(), o.command.end());
  return argv;
}

std::optional<std::string> find_executable(const std::string& name, const std::string& path_env) {
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos) {
    if (executable_file(name)) return name;
    return std::nullopt;
  }
  size_t start = 0;
  while (start <= path_env.size()) {
    size_t end = path_env.find(':', start);
    if (end == std::string::npos) end = path_env.size();
    // An empty PATH entry means the current directory.
    const std::string dir = end > start ? path_env.substr(start, end - start) : std::string(".");
    std::string candidate = dir + "/" + name;
    if (executable_file(candidate)) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

std::optional<std::string> missing_script(const Options& o) {
  if (o.command.empty() ||
      (!o.run_path && (o.module || o.no_python || !ends_with(o.command.front(), ".py"))))
    return std::nullopt;
  const std::string& script = o.command.front();
  struct stat st {};
  if (::stat(script.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      ::access(script.c_str(), R_OK) == 0)
    return std::nullopt;
  return script;
}

}  // namespace gpurun::supervisor
