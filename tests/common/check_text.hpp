// Text checks shared by the doctest suites: what a call throws, whether a text holds a part,
// how often.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "gpurun/error.hpp"

namespace gpurun::testing {

/// The what() of the gpurun::Error `f` throws, or "(no gpurun::Error thrown)".
inline std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const gpurun::Error& e) {
    return e.what();
  }
  return "(no gpurun::Error thrown)";
}

/// How many times `needle` occurs in `text`, not overlapping.
inline size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = 0; (pos = text.find(needle, pos)) != std::string::npos; pos += needle.size())
    ++n;
  return n;
}

/// Whether `s` holds `needle`.
inline bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

}  // namespace gpurun::testing
