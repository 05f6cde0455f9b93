// Text checks shared by the doctest suites: what a call throws, whether a text holds a part.
#pragma once

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

/// Whether `s` holds `needle`.
inline bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

}  // namespace gpurun::testing
