#include "supervisor/console.hpp"

#include <unistd.h>

#include <string>

#include "supervisor/console_writer.hpp"

namespace gpurun::supervisor {

void Console::write(StreamId stream, std::string_view text) {
  own_ = true;
  write_from(stream, text, -1, false);
  own_ = false;
}

void Console::write_from(StreamId stream, std::string_view text, int source, bool open) {
  if (open_source_ && (*open_source_ != source || open_stream_ != stream || source < 0)) {
    // Someone else writes: end the open line first (in the same write when possible).
    if (open_stream_ == stream) {
      std::string joined;
      joined.reserve(text.size() + 1);
      joined += '\n';
      joined += text;
      open_source_.reset();
      put(stream, joined);
      if (open) open_source_ = source;
      open_stream_ = stream;
      return;
    }
    put(open_stream_, "\n");
    open_source_.reset();
  }
  put(stream, text);
  if (open && source >= 0) {
    open_source_ = source;
    open_stream_ = stream;
  } else {
    open_source_.reset();
  }
}

FdConsole::FdConsole() {
  tty_[1] = ::isatty(1) == 1;
  tty_[2] = ::isatty(2) == 1;
}

void FdConsole::put(StreamId stream, std::string_view text) {
  if (ConsoleWriter* w = ConsoleWriter::installed()) {
    w->write(static_cast<int>(stream), text,
             own_line() ? ConsoleWriter::Origin::kGpurun : ConsoleWriter::Origin::kWorker);
    return;
  }
  console_write(static_cast<int>(stream), text);
}

}  // namespace gpurun::supervisor
