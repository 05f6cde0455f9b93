// CaptureConsole — the console seam's fake: keeps what the supervisor writes to stdout and
// stderr in two strings instead of writing to fds. Real one: FdConsole.
#pragma once

#include <string>
#include <string_view>

#include "supervisor/console.hpp"

namespace gpurun::supervisor {

struct CaptureConsole : Console {
  std::string out, err;
  /// What is_terminal() answers for stdout / stderr (a terminal console: redraw mode).
  bool terminal_out = false, terminal_err = false;
  bool is_terminal(StreamId s) const override {
    return s == StreamId::kStdout ? terminal_out : terminal_err;
  }

 protected:
  void put(StreamId s, std::string_view text) override {
    (s == StreamId::kStdout ? out : err).append(text);
  }
};

}  // namespace gpurun::supervisor
