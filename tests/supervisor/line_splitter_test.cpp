#include "supervisor/line_splitter.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using gpurun::supervisor::LineSplitter;

namespace {
struct Collect {
  std::vector<std::string> lines;
  LineSplitter::Sink sink() {
    return [this](std::string_view l) { lines.emplace_back(l); };
  }
};
}  // namespace

TEST_CASE("lines: whole, split across chunks, and partial at EOF") {
  LineSplitter s;
  Collect c;
  s.feed("a\nbb\nc", c.sink());
  CHECK(c.lines == std::vector<std::string>{"a", "bb"});
  CHECK(s.pending_bytes() == 1);
  s.feed("cc", c.sink());
  s.feed("\n\n", c.sink());
  CHECK(c.lines == std::vector<std::string>{"a", "bb", "ccc", ""});
  s.feed("tail", c.sink());
  s.flush(c.sink());
  CHECK(c.lines.back() == "tail");
  CHECK(s.pending_bytes() == 0);
  s.flush(c.sink());  // nothing more
  CHECK(c.lines.size() == 5);
}

TEST_CASE("lines: CRLF loses the CR, a lone CR inside a line stays") {
  LineSplitter s;
  Collect c;
  s.feed("x\r\ny\r", c.sink());
  s.feed("\nprogress 1\rprogress 2\n", c.sink());
  CHECK(c.lines == std::vector<std::string>{"x", "y", "progress 1\rprogress 2"});
}

TEST_CASE("lines: over-long lines come out in bounded pieces") {
  LineSplitter s(8);
  Collect c;
  s.feed("0123456789abcdefXY\nshort\n", c.sink());
  CHECK(c.lines == std::vector<std::string>{"01234567", "89abcdef", "XY", "short"});
  c.lines.clear();
  // The same without a newline, fed byte by byte: memory stays bounded.
  for (char ch : std::string("0123456789abcdefXY")) s.feed(std::string_view(&ch, 1), c.sink());
  CHECK(s.pending_bytes() <= 8);
  s.flush(c.sink());
  CHECK(c.lines == std::vector<std::string>{"01234567", "89abcdef", "XY"});
  c.lines.clear();
  s.feed("01234567\n", c.sink());  // exactly the limit: one line, no empty piece
  CHECK(c.lines == std::vector<std::string>{"01234567"});
}

TEST_CASE("lines: a 10 MB line with the default limit") {
  LineSplitter s;
  Collect c;
  const std::string big(10 * 1024 * 1024, 'z');
  s.feed(big, c.sink());
  s.feed("\n", c.sink());
  size_t total = 0;
  for (const auto& l : c.lines) {
    CHECK(l.size() <= 64 * 1024);
    total += l.size();
  }
  CHECK(total == big.size());
}

namespace {
using gpurun::supervisor::Piece;
/// Redraw mode's pieces as "L:text" (line), "R:text" (redraw), "C:" (cut), "E:" (end).
struct Pieces {
  std::vector<std::string> got;
  LineSplitter::PieceSink sink() {
    return [this](std::string_view t, Piece p) {
      const char* tag = p == Piece::kLine     ? "L:"
                        : p == Piece::kRedraw ? "R:"
                        : p == Piece::kCut    ? "C:"
                                              : "E:";
      got.push_back(tag + std::string(t));
    };
  }
};
}  // namespace

TEST_CASE("lines, redraw mode: a tqdm-style bar is forwarded at every redraw, its end is a line") {
  LineSplitter s(64 * 1024, /*redraws=*/true);
  Pieces p;
  s.feed_pieces("epoch 1\n", p.sink());
  s.feed_pieces("\r 10%|#  |", p.sink());  // tqdm: "\r" + the bar, nothing after it
  CHECK(p.got == std::vector<std::string>{"L:epoch 1", "R: 10%|#  |"});
  s.feed_pieces("\r 50%|#", p.sink());  // the next state, arriving in two reads
  s.feed_pieces("#|", p.sink());
  s.feed_pieces("\r100%|###|", p.sink());
  s.feed_pieces("\n", p.sink());
  CHECK(p.got == std::vector<std::string>{"L:epoch 1", "R: 10%|#  |", "R: 50%|#", "R: 50%|##|",
                                          "R:100%|###|", "L:100%|###|"});
  CHECK(s.pending_bytes() == 0);
}

TEST_CASE("lines, redraw mode: text\\r segments, CRLF split across reads, plain lines whole") {
  LineSplitter s(64 * 1024, true);
  Pieces p;
  s.feed_pieces("step 1\rstep 2\r", p.sink());  // the trailing \r may be a CRLF's
  CHECK(p.got == std::vector<std::string>{"R:step 1", "R:step 2"});  // either way: shown
  s.feed_pieces("step 3\rdone\r", p.sink());
  s.feed_pieces("\n", p.sink());  // "done\r\n" is a line end, not a redraw
  s.feed_pieces("a\r\nhal", p.sink());
  s.feed_pieces("f\n", p.sink());  // a plain line in two reads: never shown in part
  CHECK(p.got == std::vector<std::string>{"R:step 1", "R:step 2", "R:step 3", "R:done", "L:done",
                                          "L:a", "L:half"});
}

TEST_CASE("lines, redraw mode: a bar left without a newline ends at EOF with its last state") {
  LineSplitter s(64 * 1024, true);
  Pieces p;
  s.feed_pieces("\rA\rBB\r", p.sink());
  s.flush_pieces(p.sink());
  CHECK(p.got == std::vector<std::string>{"R:A", "R:BB", "E:BB"});
  p.got.clear();
  s.feed_pieces("\rlast", p.sink());
  s.flush_pieces(p.sink());
  CHECK(p.got == std::vector<std::string>{"R:last", "E:last"});
  p.got.clear();
  s.flush_pieces(p.sink());
  CHECK(p.got.empty());
}

TEST_CASE("lines, redraw mode off: pieces name cuts and the end; \\r stays inside the line") {
  LineSplitter s(4);
  Pieces p;
  s.feed_pieces("a\rb\n123456", p.sink());
  s.flush_pieces(p.sink());
  CHECK(p.got == std::vector<std::string>{"L:a\rb", "C:1234", "E:56"});
}
