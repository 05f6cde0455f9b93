// config.toml's findings as one-line messages: what a value is and how it is spelled in the
// file, and which known key a typo looks like. Internal to the config parser (config.cpp);
// docs/config.md.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <toml++/toml.h>

namespace gpurun::control::config_text {

/// "an integer", "a string", ... for messages.
std::string_view type_phrase(toml::node_type type);

/// Text from the file as it appears in a one-line message: control characters (a newline in
/// a quoted key or a multi-line string; also UTF-8's C1 controls U+0080-U+009F and the line
/// and paragraph separators U+2028/U+2029, which terminals may act on) replaced by '?', cut
/// after 40 bytes.
std::string printable(std::string_view text);

/// A string value as it appears in messages: printable(), quoted.
std::string quote_value(std::string_view text);

/// A floating-point value as TOML spells it: always with a '.', an exponent, inf or nan.
std::string float_text(double value);

/// "a string (\"two\")", "an integer (3)", "an array", ...
std::string found_phrase(const toml::node& node);

/// Case-insensitive Levenshtein distance (short keys only).
std::size_t edit_distance(std::string_view a, std::string_view b);

/// Whether `typo` is within 1 edit of `known` (2 for keys of 5 characters or more).
bool looks_like(std::string_view typo, std::string_view known);

}  // namespace gpurun::control::config_text
