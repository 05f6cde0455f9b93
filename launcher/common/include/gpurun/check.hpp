// GPURUN_CHECK: the invariant check of docs/errors.md. Internal to gpurun's sources (it
// formats with fmt); users catch gpurun::InvariantError from <gpurun/error.hpp>.
#pragma once

#include <fmt/format.h>

#include "gpurun/error.hpp"

/// GPURUN_CHECK(cond, fmt, args...): throws gpurun::InvariantError with
/// "file:line: check `cond` failed: <message>" when cond is false.
#define GPURUN_CHECK(cond, ...)                                                                   \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      throw ::gpurun::InvariantError(::fmt::format("{}:{}: check `{}` failed: {}", __FILE__,      \
                                                   __LINE__, #cond, ::fmt::format(__VA_ARGS__))); \
    }                                                                                             \
  } while (0)
