// The C interface's boundary (gpurun_worker.h): every exception is caught here and kept, with
// its kind, for gpurun_last_error() of the calling thread. Internal to libgpurun_worker.so.
#pragma once

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "gpurun/error.hpp"
#include "gpurun/worker/worker_session.hpp"

namespace gpurun::capi {

std::string& last_error();
int& last_error_kind();

inline void clear() {
  last_error().clear();
  last_error_kind() = 0;
}

/// A malloc'd copy of `s` (the caller frees it with gpurun_free).
inline char* dup(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

/// Runs f; on an exception records it (kind by type: gpurun_worker.h) and returns `fail`.
template <class F, class R>
R guarded(F&& f, R fail) {
  clear();
  try {
    return f();
  } catch (const control::CommAbandoned& e) {
    last_error() = e.what(), last_error_kind() = 3;
  } catch (const control::ProtocolError& e) {
    last_error() = e.what(), last_error_kind() = 1;
  } catch (const StoreError& e) {
    last_error() = e.what(), last_error_kind() = 2;
  } catch (const InvariantError& e) {
    last_error() = e.what(), last_error_kind() = 4;
  } catch (const StateError& e) {
    last_error() = e.what(), last_error_kind() = 6;
  } catch (const std::exception& e) {
    last_error() = e.what(), last_error_kind() = 5;
  } catch (...) {
    last_error() = "unknown error", last_error_kind() = 5;
  }
  return fail;
}

}  // namespace gpurun::capi
