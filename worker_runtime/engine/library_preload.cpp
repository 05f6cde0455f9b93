#include "gpurun/worker/library_preload.hpp"

#include <dlfcn.h>
#include <link.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <tuple>

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

// The major version of a shared library's file name: "9" of libcudnn_ops.so.9.10.2 (the name a
// link resolves to); "" when the name is not <name>.so.<digits>[.<digits>...] (no version, a
// .debug file, a linker script's .so).
std::string major_of(const std::string& name) {
  const size_t at = name.find(".so.");
  if (at == std::string::npos) return "";
  const std::string tail = name.substr(at + 4);
  if (tail.empty() || tail.find_first_not_of("0123456789.") != std::string::npos ||
      tail.front() == '.' || tail.back() == '.')
    return "";
  return tail.substr(0, tail.find('.'));
}

}  // namespace

PreloadResult preload_libraries_beside(const std::vector<std::string>& families) {
  const auto t0 = std::chrono::steady_clock::now();
  PreloadResult r;
  std::set<fs::path> loaded = loaded_objects();
  // (directory, family, major version) of each loaded member: only the same version's
  // libraries beside it are opened (a shared lib/ may hold cuDNN 8 next to cuDNN 9).
  std::set<std::tuple<fs::path, std::string, std::string>> groups;
  for (const fs::path& p : loaded) {
    const std::string name = p.filename().string(), major = major_of(name);
    if (major.empty()) continue;
    for (const std::string& f : families)
      if (has_prefix(name, f)) groups.emplace(p.parent_path(), f, major);
  }
  for (const auto& [dir, family, major] : groups) {
    std::error_code ec;
    std::set<fs::path> candidates;  // sorted: the same order every time
    fs::directory_iterator it(dir, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (has_prefix(name, family) && name.find(".so") != std::string::npos)
        candidates.insert(it->path());
    }
    for (const fs::path& c : candidates) {
      std::error_code cec;
      const fs::path real = fs::canonical(c, cec);
      if (cec || !fs::is_regular_file(real, cec) || loaded.count(real) ||
          major_of(real.filename().string()) != major)
        continue;
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
