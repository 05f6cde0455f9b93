// Private to NodeSync's translation units (node_sync.cpp, node_rendezvous.cpp): the record
// helpers and NodeSync::Store, the one way both talk to node 0's store.
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

#include "gpurun/store/client.hpp"
#include "supervisor/node_sync.hpp"

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

/// Node 0's backend or a client of node 0's store. Client requests throw gpurun::Error.
struct NodeSync::Store {
  LocalStore* local = nullptr;
  std::unique_ptr<store::Client> client;

  std::optional<std::string> get(const std::string& key) {
    if (local) return local->get(key);
    if (!client->check({key})) return std::nullopt;
    return client->get(key);
  }
  void set(const std::string& key, const std::string& value) {
    if (local)
      local->set(key, value);
    else
      client->set(key, value);
  }
  std::string set_if_missing(const std::string& key, const std::string& value) {
    return local ? local->set_if_missing(key, value) : client->compare_set(key, "", value);
  }
};

}  // namespace gpurun::supervisor
