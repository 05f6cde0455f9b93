#include "supervisor/gpu_inventory.hpp"

#include <cstdio>
#include <filesystem>
#include <memory>

namespace gpurun::supervisor {

std::vector<std::string> parse_visible_devices(std::string_view value) {
  std::vector<std::string> out;
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  size_t start = 0;
  bool all_blank = true;
  for (char c : value)
    if (!is_space(c)) all_blank = false;
  if (all_blank) return out;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string_view::npos) end = value.size();
    std::string_view item = value.substr(start, end - start);
    while (!item.empty() && is_space(item.front())) item.remove_prefix(1);
    while (!item.empty() && is_space(item.back())) item.remove_suffix(1);
    out.emplace_back(item);
    start = end + 1;
  }
  return out;
}

int count_physical_gpus() {
  // nvidia-smi is the reference; stderr is discarded, a missing binary gives 0 lines.
  if (FILE* p = ::popen("nvidia-smi -L 2>/dev/null", "r")) {
    int n = 0;
    char line[512];
    while (std::fgets(line, sizeof line, p))
      if (std::string_view(line).substr(0, 4) == "GPU ") ++n;
    int rc = ::pclose(p);
    if (rc == 0 && n > 0) return n;
  }
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

std::vector<std::string> slot_gpu_ids(const std::optional<std::string>& cuda_visible_devices,
                                      const std::function<int()>& count_gpus) {
  if (cuda_visible_devices) return parse_visible_devices(*cuda_visible_devices);
  std::vector<std::string> out;
  const int n = count_gpus();
  for (int i = 0; i < n; ++i) out.push_back(std::to_string(i));
  return out;
}

}  // namespace gpurun::supervisor
