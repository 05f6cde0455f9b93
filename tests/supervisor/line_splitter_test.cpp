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
