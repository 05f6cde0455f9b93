#include "gpurun/json_writer.hpp"

#include <cmath>

#include <fmt/format.h>

namespace gpurun {

namespace {

// Length of the well-formed UTF-8 sequence starting at s[i] (RFC 3629: no
// overlongs, no surrogates, nothing above U+10FFFF), or 0 if it is not one.
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size() || b(1) < lo || b(1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (b(k) < 0x80 || b(k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        // Control bytes and non-UTF-8 bytes are both written as \u00XX, for different reasons
        // (see the last branch): the repeated branch is deliberate.
        if (u < 0x20) {  // NOLINT(bugprone-branch-clone)
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(u));
        } else if (u < 0x80) {
          out.push_back(c);
        } else if (const std::size_t n = utf8_sequence_length(s, i); n > 0) {
          out.append(s.substr(i, n));
          i += n - 1;
        } else {
          // Not UTF-8 (e.g. a Latin-1 file name): keep the byte as U+00XX so
          // the line stays valid JSON and nothing is silently dropped.
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(u));
        }
    }
  }
  out.push_back('"');
}

void JsonObject::key(std::string_view k) {
  if (!body_.empty()) body_ += ", ";
  append_json_string(body_, k);
  body_ += ": ";
}

JsonObject& JsonObject::add(std::string_view k, std::string_view value) {
  key(k);
  append_json_string(body_, value);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, std::int64_t value) {
  key(k);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, bool value) {
  key(k);
  body_ += value ? "true" : "false";
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, const std::vector<std::string>& values) {
  key(k);
  body_ += '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) body_ += ", ";
    append_json_string(body_, values[i]);
  }
  body_ += ']';
  return *this;
}

JsonObject& JsonObject::add_null(std::string_view k) {
  key(k);
  body_ += "null";
  return *this;
}

JsonObject& JsonObject::add_raw(std::string_view k, std::string_view json) {
  key(k);
  body_ += json;
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, double value) {
  key(k);
  if (std::isfinite(value))
    body_ += fmt::format("{}", value);
  else
    body_ += "null";
  return *this;
}

JsonObject JsonObject::from_object(std::string_view object_json) {
  JsonObject o;
  if (object_json.size() >= 2 && object_json.front() == '{' && object_json.back() == '}')
    o.body_ = std::string(object_json.substr(1, object_json.size() - 2));
  return o;
}

}  // namespace gpurun
