// Splits a byte stream (a worker's stdout or stderr) into lines for the
// line-atomic, prefixed console and the per-rank tail.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace gpurun::supervisor {

/// What a piece of a stream is (LineSplitter::feed_pieces).
enum class Piece {
  kLine,    ///< ended by "\n" (or "\r\n"); the text excludes the ending
  kCut,     ///< max_line_bytes of a longer line, no ending in the stream
  kEnd,     ///< the unterminated rest of the stream at EOF (flush)
  kRedraw,  ///< redraw mode: the current text of a line being redrawn with "\r"
};

/// Accumulates bytes and emits complete lines. A line is emitted without its
/// "\n" and without a "\r" right before it (CRLF). A line longer than
/// max_line_bytes is emitted in pieces of max_line_bytes so memory stays bounded.
///
/// Redraw mode (`redraws`, used when the console is a terminal): a "\r" not followed by
/// "\n" ends a segment, emitted at once as a kRedraw piece (empty segments are skipped), and
/// from then until the line's "\n" the line's current text is emitted as kRedraw at the end
/// of every feed() as well, so a progress bar written "\rtext" shows each state as it comes.
/// The kLine that ends such a line carries only the text after its last "\r" (the final
/// state); at EOF a redrawn line without "\n" ends as a kEnd carrying its last text.
/// Lines without "\r" are emitted exactly as without redraw mode (whole, never partial).
/// Not thread-safe; the supervisor calls it from its io thread only.
class LineSplitter {
 public:
  using Sink = std::function<void(std::string_view line)>;
  using PieceSink = std::function<void(std::string_view text, Piece piece)>;

  explicit LineSplitter(std::size_t max_line_bytes = 64 * 1024, bool redraws = false);

  /// Emits every line completed by `data`; keeps the rest buffered.
  void feed(std::string_view data, const Sink& sink);
  /// The same, telling each piece's kind (and the redraws, in redraw mode).
  void feed_pieces(std::string_view data, const PieceSink& sink);

  /// Emits the buffered partial line, if any (call at EOF).
  void flush(const Sink& sink);
  void flush_pieces(const PieceSink& sink);

  /// Bytes buffered (an unfinished line).
  std::size_t pending_bytes() const { return buffer_.size(); }
  bool redraws() const { return redraws_; }

 private:
  void end_segment(const PieceSink& sink);

  std::size_t max_line_bytes_;
  bool redraws_;
  std::string buffer_;
  // Redraw mode only.
  bool line_redrawn_ = false;  // the current line had a "\r" segment
  bool pending_cr_ = false;    // the last feed ended in "\r": "\r\n" or a segment's end?
  std::size_t shown_ = 0;      // buffer_'s bytes already emitted as a kRedraw (live)
  std::string last_;           // the text of the last kRedraw of the current line
};

}  // namespace gpurun::supervisor
