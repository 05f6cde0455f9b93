#include "control/config_text.hpp"

#include <algorithm>
#include <cctype>
#include <vector>

#include <fmt/format.h>

namespace gpurun::control::config_text {

std::string_view type_phrase(toml::node_type type) {
  switch (type) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a floating-point number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

std::string printable(std::string_view text) {
  constexpr std::size_t kMax = 40;
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const auto next = [&](std::size_t k) {
      return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0;
    };
    if (c == 0xc2 && next(1) >= 0x80 && next(1) <= 0x9f) {  // U+0080-U+009F
      out += '?';
      i += 1;
    } else if (c == 0xe2 && next(1) == 0x80 && (next(2) == 0xa8 || next(2) == 0xa9)) {
      out += '?';  // U+2028, U+2029
      i += 2;
    } else {
      out += (c < 0x20 || c == 0x7f) ? '?' : static_cast<char>(c);
    }
  }
  if (text.size() > kMax) out += "...";
  return out;
}

std::string quote_value(std::string_view text) {
  return "\"" + printable(text) + '"';
}

std::string float_text(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_not_of("-0123456789") == std::string::npos) text += ".0";
  return text;
}

std::string found_phrase(const toml::node& node) {
  std::string out(type_phrase(node.type()));
  if (const auto* s = node.as_string()) {
    out += fmt::format(" ({})", quote_value(s->get()));
  } else if (const auto* i = node.as_integer()) {
    out += fmt::format(" ({})", i->get());
  } else if (const auto* f = node.as_floating_point()) {
    out += fmt::format(" ({})", float_text(f->get()));
  } else if (const auto* b = node.as_boolean()) {
    out += b->get() ? " (true)" : " (false)";
  }
  return out;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                        std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

bool looks_like(std::string_view typo, std::string_view known) {
  const std::size_t limit = known.size() >= 5 ? 2 : 1;
  return edit_distance(typo, known) <= limit;
}

}  // namespace gpurun::control::config_text
