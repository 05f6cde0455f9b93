// Where merged worker output and gpurun's own messages go.
#pragma once

#include <string>
#include <string_view>

#include "supervisor/process_spawner.hpp"

namespace gpurun::supervisor {

/// Line-atomic output: each write() call carries one or more whole lines and
/// is never interleaved with another call. Called on the io thread only.
class Console {
 public:
  virtual ~Console() = default;
  /// Writes `text` (ending in '\n') to the console's stdout or stderr.
  virtual void write(StreamId stream, std::string_view text) = 0;
};

/// The real console: gpurun's fds 1 and 2. A stream whose reader is gone
/// (EPIPE) is dropped silently; gpurun carries on (SIGPIPE is ignored by main).
class FdConsole : public Console {
 public:
  void write(StreamId stream, std::string_view text) override;

 private:
  bool broken_[3] = {false, false, false};
};

}  // namespace gpurun::supervisor
