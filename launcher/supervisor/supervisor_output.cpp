// Supervisor: each worker's output streams — split into lines (redraws kept as such), written
// to its log files, shown on the console with the rank's prefix, the stderr tail kept for the
// failure summary. The rest of the supervisor: supervisor.cpp.
#include "supervisor/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpurun/check.hpp"
#include "supervisor/supervisor_worker.hpp"

namespace gpurun::supervisor {

Supervisor::Stream& Supervisor::stream(Worker& w, StreamId id) {
  return id == StreamId::kStdout ? w.out : w.err;
}

namespace {
std::string errno_name(int err) {
  const char* name = ::strerrorname_np(err);
  return name ? name : std::to_string(err);
}
}  // namespace

void Supervisor::open_logs(Worker& w, bool append) {
  const int out_bits =
      opt_.redirects.for_local_rank(w.local_rank) | opt_.tee.for_local_rank(w.local_rank);
  const bool rank_on_console =
      (!opt_.ranks_filter || opt_.ranks_filter->count(w.rank) > 0) &&
      (!opt_.local_ranks_filter || opt_.local_ranks_filter->count(w.local_rank) > 0);
  auto shown = [&](int bit) {
    const bool redirected = (opt_.redirects.for_local_rank(w.local_rank) & bit) != 0;
    const bool teed = (opt_.tee.for_local_rank(w.local_rank) & bit) != 0;
    return rank_on_console && (!redirected || teed);
  };
  w.out.console = shown(StdSpec::kStdout);
  w.err.console = shown(StdSpec::kStderr);
  // A stream shown on a terminal is forwarded in redraw mode (its "\r" segments at once), and
  // its worker gets a pseudo-terminal for it (launch()).
  w.out.lines = LineSplitter(64 * 1024, w.out.console && console_.is_terminal(StreamId::kStdout));
  w.err.lines = LineSplitter(64 * 1024, w.err.console && console_.is_terminal(StreamId::kStderr));

  const std::string dir = fmt::format("{}/attempt_{}/{}", opt_.plan.run_dir, attempt_, w.rank);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    say(fmt::format("warning: cannot create log directory '{}': {}", dir, ec.message()));
    return;
  }
  auto open = [&](Stream& s, const char* name) {
    s.path = dir + "/" + name;
    int fd = ::open(s.path.c_str(), O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_CLOEXEC,
                    0644);
    if (fd < 0) say(fmt::format("warning: cannot open '{}': {}", s.path, std::strerror(errno)));
    s.file = UniqueFd(fd);
  };
  if (opt_.keep_logs || (out_bits & StdSpec::kStdout)) open(w.out, "stdout.log");
  if (opt_.keep_logs || (out_bits & StdSpec::kStderr)) open(w.err, "stderr.log");
}

size_t Supervisor::write_log(Worker& w, StreamId id, std::string_view bytes) {
  Stream& s = stream(w, id);
  size_t done = 0;
  int err = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(s.file.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;  // 0 bytes for a non-empty write: no progress is possible
      break;
    }
    done += static_cast<size_t>(n);  // a short write (the disk filled up): write the rest
  }
  if (done == bytes.size()) return done;
  // Reported once per file; the file is closed and the stream goes to the console instead, so
  // nothing is lost (the caller shows the bytes from `done` on, whole lines).
  const char* what = id == StreamId::kStdout ? "stdout" : "stderr";
  say(fmt::format(
      "warning: writing {} failed: {} ({}); rank {}'s {} {}", s.path, std::strerror(err),
      errno_name(err), w.rank, what,
      s.console ? "is on the console only from now on" : "goes to the console from now on"));
  s.file.reset();
  return done;
}

void Supervisor::on_output(Worker& w, StreamId id, std::string_view bytes) {
  Stream& s = stream(w, id);
  auto sink = [&](std::string_view text, Piece piece) { on_piece(w, id, text, piece); };
  // Redraw mode writes the file from the pieces (each line's final text, on_piece); else the
  // file gets the raw bytes.
  if (s.file && !s.lines.redraws()) {
    const size_t written = write_log(w, id, bytes);
    if (written < bytes.size()) {
      s.lines.feed_pieces(bytes.substr(0, written), sink);  // in the file: as before
      s.console = true;  // the line the write cut, and everything after it
      s.lines.feed_pieces(bytes.substr(written), sink);
      return;
    }
  }
  s.lines.feed_pieces(bytes, sink);
}

void Supervisor::on_piece(Worker& w, StreamId id, std::string_view text, Piece piece) {
  Stream& s = stream(w, id);
  const int source = w.rank * 2 + (id == StreamId::kStderr ? 1 : 0);
  if (piece == Piece::kRedraw) {
    // A progress bar's new state: "\r<prefix>text", the line left open for the next one.
    if (!s.console) return;
    std::string line;
    line.reserve(w.prefix.size() + text.size() + 1);
    line += '\r';
    line += w.prefix;
    line += text;
    console_.write_from(id, line, source, /*open=*/true);
    s.drawn = true;
    return;
  }
  if (s.file && s.lines.redraws()) {
    // Redraw mode: the file gets each line's final text, without the intermediate states.
    std::string bytes(text);
    if (piece == Piece::kLine) bytes += '\n';
    write_log(w, id, bytes);  // on failure: the console has the line already
  }
  if (id == StreamId::kStderr && opt_.stderr_tail_lines > 0) {
    w.err_tail.emplace_back(text);
    if (w.err_tail.size() > opt_.stderr_tail_lines) w.err_tail.pop_front();
  }
  if (!s.console) return;
  std::string line;
  line.reserve(w.prefix.size() + text.size() + 2);
  if (s.drawn) line += '\r';  // the line's final state overwrites its last redraw
  line += w.prefix;
  line += text;
  line += '\n';
  console_.write_from(id, line, source, /*open=*/false);
  s.drawn = false;
}

void Supervisor::on_stream_closed(Worker& w, StreamId id) {
  Stream& s = stream(w, id);
  s.lines.flush_pieces([&](std::string_view text, Piece piece) { on_piece(w, id, text, piece); });
  s.open = false;
  check_progress();
}

}  // namespace gpurun::supervisor
