#include "gpurun/control/library_preload.hpp"

#include <dlfcn.h>
#include <link.h>

#include <chrono>
#include <filesystem>
#include <set>

namespace gpurun::control {
namespace {

namespace fs = std::filesystem;

// The canonical path of every object loaded in this process (dl_iterate_phdr's names).
std::set<fs::path> loaded_objects() {
  std::set<fs::path> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name && *info->dlpi_name) {
          std::error_code ec;
          const fs::path p = fs::canonical(info->dlpi_name, ec);
          if (!ec) static_cast<std::set<fs::path>*>(data)->insert(p);
        }
        return 0;
      },
      &out);
  return out;
}

bool has_prefix(const std::string& name, const std::string& prefix) {
  return name.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

PreloadResult preload_libraries_beside(const std::vector<std::string>& families) {
  const auto t0 = std::chrono::steady_clock::now();
  PreloadResult r;
  std::set<fs::path> loaded = loaded_objects();
  std::set<std::pair<fs::path, std::string>> dirs;  // (directory, family) of a loaded member
  for (const fs::path& p : loaded)
    for (const std::string& f : families)
      if (has_prefix(p.filename().string(), f)) dirs.emplace(p.parent_path(), f);
  for (const auto& [dir, family] : dirs) {
    std::error_code ec;
    std::set<fs::path> candidates;  // sorted: the same order every time
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (has_prefix(name, family) && name.find(".so") != std::string::npos)
        candidates.insert(e.path());
    }
    for (const fs::path& c : candidates) {
      std::error_code cec;
      const fs::path real = fs::canonical(c, cec);
      if (cec || !fs::is_regular_file(real, cec) || loaded.count(real)) continue;
      if (dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL) != nullptr) {
        ++r.loaded;
        loaded = loaded_objects();  // its dependencies are loaded now too
      } else {
        const char* err = dlerror();
        r.failed.push_back(c.string() + ": " + (err ? err : "dlopen failed"));
        loaded.insert(real);  // tried once
      }
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

const std::vector<std::string>& cuda_library_families() {
  static const std::vector<std::string> families{"libcudnn", "libcublas"};
  return families;
}

}  // namespace gpurun::control
