// Private to the translation units of launcher/nodes (node_sync.cpp, node_rendezvous.cpp,
// node_agent.cpp): the record helpers.
#pragma once

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "nodes/node_sync.hpp"

namespace gpurun::supervisor {
namespace node_sync_detail {

using Clock = std::chrono::steady_clock;

inline std::string seconds(Clock::duration d) {
  return fmt::format(
      "{:g} s",
      static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) /
          1000.0);
}

inline int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// The steady clock in ms: what control::HeartbeatWatch reads.
inline std::chrono::milliseconds steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch());
}

inline std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

template <class Int>
inline bool parse_int(std::string_view text, Int& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

/// Splits off the first `n` space-separated fields; the rest (maybe with spaces) is `rest`.
inline bool split_fields(const std::string& text, std::size_t n, std::vector<std::string>& fields,
                         std::string& rest) {
  fields.clear();
  std::size_t pos = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t sp = text.find(' ', pos);
    if (sp == std::string::npos) {
      if (i + 1 != n) return false;
      fields.push_back(text.substr(pos));
      rest.clear();
      return true;
    }
    fields.push_back(text.substr(pos, sp - pos));
    pos = sp + 1;
  }
  rest = text.substr(pos);
  return true;
}

inline std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

inline std::string node_list(const std::vector<int>& nodes) {
  return fmt::format("{}", fmt::join(nodes, ", "));
}

}  // namespace node_sync_detail

}  // namespace gpurun::supervisor
