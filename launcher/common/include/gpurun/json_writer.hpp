// A tiny JSON object writer for one-line records (event log, summaries).
// Writing only; reading JSON uses Boost.JSON (error_file.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpurun {

/// Appends `s` to `out` as a JSON string literal (quotes, escapes, \u00XX for
/// control bytes). Bytes >= 0x80 are copied as they are (UTF-8 passes through).
void append_json_string(std::string& out, std::string_view s);

/// Builds one JSON object, keys in insertion order. Keys must be unique.
class JsonObject {
 public:
  JsonObject& add(std::string_view key, std::string_view value);
  JsonObject& add(std::string_view key, const char* value) {
    return add(key, std::string_view(value));
  }
  JsonObject& add(std::string_view key, const std::string& value) {
    return add(key, std::string_view(value));
  }
  JsonObject& add(std::string_view key, std::int64_t value);
  JsonObject& add(std::string_view key, int value) { return add(key, std::int64_t{value}); }
  JsonObject& add(std::string_view key, bool value);
  JsonObject& add(std::string_view key, const std::vector<std::string>& values);
  JsonObject& add_null(std::string_view key);
  /// A finite double in its shortest round-trip form; NaN/inf as null.
  JsonObject& add(std::string_view key, double value);
  /// The members of `object_json` (one JSON object, "{...}", valid JSON) as an object to extend.
  static JsonObject from_object(std::string_view object_json);
  /// Inserts `json` verbatim (must be valid JSON).
  JsonObject& add_raw(std::string_view key, std::string_view json);

  /// The object text, e.g. {"a": 1, "b": "x"}.
  std::string str() const { return "{" + body_ + "}"; }
  bool empty() const { return body_.empty(); }

 private:
  void key(std::string_view k);
  std::string body_;
};

}  // namespace gpurun
