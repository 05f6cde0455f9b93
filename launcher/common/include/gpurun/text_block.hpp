// A program's multi-line text (a traceback, a DataLoader worker's error) shown under a prefix,
// bounded in lines and bytes, its last lines (the real error) kept. Header-only; standard
// library only.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace gpurun {

/// Limits of text_block (docs/errors.md, "Multi-line errors").
struct TextBlockLimits {
  std::size_t max_lines = 40;    ///< lines shown, the elision line included
  std::size_t max_bytes = 4096;  ///< bytes of text shown (prefixes not counted)
  std::size_t head_lines = 4;    ///< of those, the first lines kept before the elision
};

namespace detail {

/// `i`, moved back off a UTF-8 continuation byte of `s` (a cut there never splits a character).
inline std::size_t utf8_floor(std::string_view s, std::size_t i) {
  while (i > 0 && i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

/// One line of at most `max_bytes`: its start and its end, the middle elided with a count.
inline std::string bounded_line(std::string_view line, std::size_t max_bytes) {
  if (line.size() <= max_bytes) return std::string(line);
  const std::size_t head = utf8_floor(line, max_bytes / 4);
  const std::size_t tail_from = utf8_floor(line, line.size() - (max_bytes - max_bytes / 4));
  return std::string(line.substr(0, head)) + " [... " + std::to_string(tail_from - head) +
         " bytes elided ...] " + std::string(line.substr(tail_from));
}

}  // namespace detail

/// `text`'s lines, each as `prefix` + line + "\n" (a final "\n" of `text` ends its last line;
/// "\r\n" counts as "\n"). When `text` has more than `limits.max_lines` lines or
/// `limits.max_bytes` bytes, the first `head_lines` and as many last lines as fit are kept
/// and the middle is one line "[... K lines (B bytes) elided ...]": the real error, last in a
/// Python traceback, is always shown. A single line longer than the byte budget keeps its
/// start and its end. Empty `text`: "". Never throws but for std::bad_alloc.
inline std::string text_block(std::string_view text, std::string_view prefix,
                              TextBlockLimits limits = {}) {
  std::vector<std::string_view> lines;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view l = text.substr(start, end - start);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    lines.push_back(l);
    start = end + 1;
  }
  std::string out;
  const auto emit = [&](std::string_view l) {
    out.append(prefix);
    out.append(l);
    out.push_back('\n');
  };
  std::size_t bytes = 0;
  for (const auto l : lines) bytes += l.size();
  const std::size_t max_lines = limits.max_lines < 3 ? 3 : limits.max_lines;
  if (lines.size() <= max_lines && bytes <= limits.max_bytes) {
    for (const auto l : lines) emit(detail::bounded_line(l, limits.max_bytes));
    return out;
  }
  // The last lines first (the line budget less the head's, as many bytes as fit), then the head.
  std::size_t budget = limits.max_bytes;
  const std::size_t line_budget = max_lines - 1;  // one for the elision line
  std::vector<std::string> tail;
  std::size_t first_tail = lines.size();
  const std::size_t head_want = limits.head_lines < line_budget - 1 ? limits.head_lines : 0;
  while (first_tail > 0 && tail.size() + head_want < line_budget) {
    const std::string_view l = lines[first_tail - 1];
    if (l.size() > budget) {
      if (!tail.empty()) break;  // the last line alone is over the budget: its ends
      tail.push_back(detail::bounded_line(l, budget));
      budget = 0;
      --first_tail;
      break;
    }
    tail.push_back(std::string(l));
    budget -= l.size();
    --first_tail;
  }
  std::size_t head = 0;
  while (head < head_want && head < first_tail && lines[head].size() <= budget) {
    budget -= lines[head].size();
    ++head;
  }
  for (std::size_t i = 0; i < head; ++i) emit(lines[i]);
  if (first_tail > head) {
    std::size_t elided_bytes = 0;
    for (std::size_t i = head; i < first_tail; ++i) elided_bytes += lines[i].size();
    emit("[... " + std::to_string(first_tail - head) + " line" +
         (first_tail - head == 1 ? "" : "s") + " (" + std::to_string(elided_bytes) +
         " bytes) elided ...]");
  }
  for (auto it = tail.rbegin(); it != tail.rend(); ++it) emit(*it);
  return out;
}

}  // namespace gpurun
