#include "supervisor/owned_children.hpp"

#include <dirent.h>
#include <sys/wait.h>

#include <fstream>
#include <string>
#include <vector>

#include <mutex>
#include <set>

namespace gpurun::supervisor {

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::set<int>& owned() {
  static std::set<int> s;
  return s;
}

}  // namespace

int spawn_owned_child(const std::function<int()>& spawn) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const int pid = spawn();
  if (pid > 0) owned().insert(pid);
  return pid;
}

void release_owned_child(int pid) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  owned().erase(pid);
}

void reap_children_except(const std::set<int>& keep) {
  std::vector<int> children;
  if (DIR* tasks = ::opendir("/proc/self/task")) {
    while (const dirent* e = ::readdir(tasks)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/children");
      for (int pid; in >> pid;) children.push_back(pid);
    }
    ::closedir(tasks);
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (int pid : children)
    if (keep.count(pid) == 0 && owned().count(pid) == 0) ::waitpid(pid, nullptr, WNOHANG);
}

}  // namespace gpurun::supervisor
