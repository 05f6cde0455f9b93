// gpurun::Error and its subclasses: every recoverable error gpurun throws, on the launcher
// and on the worker side (gpurun::Runtime throws CommError and StateError; catch them from
// <gpurun/runtime.hpp>). Policy: docs/errors.md. Invariants use GPURUN_CHECK
// (<gpurun/check.hpp>: file:line + values). This header needs nothing but the standard library.
#pragma once

#include <stdexcept>
#include <string>

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

/// Worker runtime: a collective failed — a peer died or closed its connection, a timeout
/// passed, or the communicator was aborted. what() names the operation, the group and the
/// rank. After it the communicator is unusable (the runtime aborts it and makes a new one).
class CommError : public Error {
 public:
  using Error::Error;
};

/// Worker runtime: the state of two ranks does not match (different model, optimizer, or a
/// corrupted snapshot). what() names the first difference: tensor name, expected vs actual.
class StateError : public Error {
 public:
  using Error::Error;
};

/// Thrown by GPURUN_CHECK: a broken invariant, i.e. a gpurun bug.
class InvariantError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace gpurun
