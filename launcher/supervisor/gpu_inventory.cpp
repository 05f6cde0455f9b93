#include "supervisor/gpu_inventory.hpp"

#include <filesystem>
#include <string_view>

#include "gpurun/helper_process.hpp"

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
  // nvidia-smi is the reference; its stderr is discarded; not installed or failing: the
  // driver's directory.
  if (const std::optional<std::string> out = output_of({"nvidia-smi", "-L"})) {
    int n = 0;
    for (std::string_view rest = *out; !rest.empty();) {
      const size_t nl = rest.find('\n');
      if (rest.substr(0, 4) == "GPU ") ++n;
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    }
    if (n > 0) return n;
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
