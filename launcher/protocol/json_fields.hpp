// The protocol's JSON values read field by field, one way for every record (decisions, reports,
// the nodes' messages): a missing or mistyped field is a ProtocolError naming the record, the
// field and the text. Private to gpurun_protocol (Boost.JSON stays out of the public headers).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "gpurun/control/decision.hpp"

namespace gpurun::control::detail {

namespace json = boost::json;

/// `text` parsed; ProtocolError when it is not a JSON object (`what` names the record).
inline json::value parse_object(std::string_view text, std::string_view what) {
  boost::system::error_code ec;
  json::value root = json::parse(text, ec);
  if (ec || !root.is_object())
    throw ProtocolError(fmt::format("{} is not a JSON object: '{}'", what, text));
  return root;
}

inline int64_t get_int(const json::object& o, std::string_view field, std::string_view what,
                       std::string_view text) {
  const json::value* v = o.if_contains(field);
  if (!v || !v->is_int64())
    throw ProtocolError(fmt::format("{} lacks the integer field '{}': '{}'", what, field, text));
  return v->as_int64();
}

inline std::string get_string(const json::object& o, std::string_view field, std::string_view what,
                              std::string_view text) {
  const json::value* v = o.if_contains(field);
  if (!v || !v->is_string())
    throw ProtocolError(fmt::format("{} lacks the string field '{}': '{}'", what, field, text));
  return std::string(v->as_string());
}

/// A string field that may be absent ("" then); present, it must be a string.
inline std::string get_optional_string(const json::object& o, std::string_view field,
                                       std::string_view what, std::string_view text) {
  return o.contains(field) ? get_string(o, field, what, text) : std::string();
}

inline std::vector<int> get_ids(const json::object& o, std::string_view field,
                                std::string_view what, std::string_view text) {
  const json::value* v = o.if_contains(field);
  if (!v || !v->is_array())
    throw ProtocolError(fmt::format("{} lacks the array field '{}': '{}'", what, field, text));
  std::vector<int> out;
  for (const auto& e : v->as_array()) {
    if (!e.is_int64())
      throw ProtocolError(
          fmt::format("{} field '{}' holds a non-integer: '{}'", what, field, text));
    out.push_back(static_cast<int>(e.as_int64()));
  }
  return out;
}

}  // namespace gpurun::control::detail
