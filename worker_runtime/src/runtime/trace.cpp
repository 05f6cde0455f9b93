#include "runtime/trace.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpurun/error.hpp"

namespace gpurun::rt {

Trace::Trace(const std::string& dir, int slot) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = fmt::format("{}/gpu{}.jsonl", dir, slot);
  f_ = std::fopen(path.c_str(), "a");
  if (!f_)
    throw Error(fmt::format("cannot open the trace file {}: {}", path, std::strerror(errno)));
}

Trace::~Trace() {
  if (f_) std::fclose(f_);
}

Trace& Trace::operator=(Trace&& o) noexcept {
  if (this != &o) {
    if (f_) std::fclose(f_);
    f_ = std::exchange(o.f_, nullptr);
  }
  return *this;
}

std::string Trace::num(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{:.6g}", v);
}
std::string Trace::num(int64_t v) {
  return std::to_string(v);
}

std::string Trace::str(const std::string& v) {
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Trace::ints(const std::vector<int>& v) {
  return fmt::format("[{}]", fmt::join(v, ","));
}

void Trace::write(const std::string& event, const std::vector<Field>& fields) {
  if (!f_) return;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  std::string line =
      fmt::format("{{\"t_ms\":{},\"event\":{},\"pid\":{}", ms, str(event), ::getpid());
  for (const auto& [k, v] : fields) line += fmt::format(",{}:{}", str(k), v);
  line += "}\n";
  std::fwrite(line.data(), 1, line.size(), f_);
  std::fflush(f_);
}

}  // namespace gpurun::rt
