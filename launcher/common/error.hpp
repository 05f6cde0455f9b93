// gpurun::Error — the one base of every recoverable error gpurun throws.
// Policy: docs/errors.md. Invariants use GPURUN_CHECK (file:line + values).
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace gpurun {

/// Base of all recoverable gpurun errors. what() is a sentence a user can act
/// on: who (rank, pid, peer), what (key, file:line:column), how long, how far.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad command line (exit status 2 in the gpurun binary).
class UsageError : public Error {
 public:
  using Error::Error;
};

/// Store protocol, connection or timeout failure (client or server side).
class StoreError : public Error {
 public:
  using Error::Error;
};

/// A store client operation ran past its deadline.
class StoreTimeout : public StoreError {
 public:
  using StoreError::StoreError;
};

/// Spawning, signalling or reaping a worker failed.
class ProcessError : public Error {
 public:
  using Error::Error;
};

/// Thrown by GPURUN_CHECK: a broken invariant, i.e. a gpurun bug.
class InvariantError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace gpurun

/// GPURUN_CHECK(cond, fmt, args...): throws gpurun::InvariantError with
/// "file:line: check `cond` failed: <message>" when cond is false.
#define GPURUN_CHECK(cond, ...)                                                                   \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      throw ::gpurun::InvariantError(::fmt::format("{}:{}: check `{}` failed: {}", __FILE__,      \
                                                   __LINE__, #cond, ::fmt::format(__VA_ARGS__))); \
    }                                                                                             \
  } while (0)
