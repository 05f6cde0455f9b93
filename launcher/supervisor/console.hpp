// Where merged worker output and gpurun's own messages go.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "supervisor/process_spawner.hpp"

namespace gpurun::supervisor {

/// Line-atomic output: each put() carries one or more whole lines and is never interleaved
/// with another call. Called on the io thread only.
///
/// Open lines (a worker's progress bar on a terminal console): write_from(..., open = true)
/// leaves the cursor on the line it drew ("\r<prefix>text", no "\n") so the next redraw from
/// the same source overwrites it in place. Any other write (another rank, the other stream
/// of the same rank, gpurun's own messages) first ends the open line with "\n", so a line
/// never starts in the middle of someone's bar: lines of different ranks never mix.
class Console {
 public:
  virtual ~Console() = default;

  /// Writes `text` (ending in '\n') to the console's stdout or stderr.
  void write(StreamId stream, std::string_view text);
  /// Writes a worker's output. `source` names the writer (the supervisor uses one id per
  /// rank and stream); `open`: `text` does not end in '\n' and the line stays open for
  /// `source`'s next write.
  void write_from(StreamId stream, std::string_view text, int source, bool open);

  /// Whether `stream` is a terminal. Worker streams shown on a terminal get a pseudo-terminal
  /// and their "\r" redraws are forwarded at once (docs/cli.md, "Console and log files").
  virtual bool is_terminal(StreamId stream) const = 0;

 protected:
  /// One write of `text` to `stream`, whole.
  virtual void put(StreamId stream, std::string_view text) = 0;
  /// Within put(): whether the text is gpurun's own (write()), not a worker's (write_from()).
  bool own_line() const { return own_; }

 private:
  bool own_ = false;
  std::optional<int> open_source_;  // a line left open by write_from(open = true)
  StreamId open_stream_ = StreamId::kStdout;
};

/// The real console: gpurun's fds 1 and 2, through the installed ConsoleWriter (console_write):
/// a reader that does not read never blocks the caller; a stream whose reader is gone (EPIPE)
/// is dropped silently and gpurun carries on (SIGPIPE is ignored by main).
/// is_terminal: isatty() of fd 1 / fd 2 when constructed.
class FdConsole : public Console {
 public:
  FdConsole();
  bool is_terminal(StreamId stream) const override { return tty_[static_cast<int>(stream)]; }

 protected:
  void put(StreamId stream, std::string_view text) override;

 private:
  bool tty_[3] = {false, false, false};
};

}  // namespace gpurun::supervisor
