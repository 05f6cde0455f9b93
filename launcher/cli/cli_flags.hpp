// Private to the command-line parser's translation units (cli.cpp, cli_flags.cpp): gpurun's
// flag table and the value checks its setters share (docs/cli.md).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "supervisor/options.hpp"

namespace gpurun::supervisor {
namespace detail {
/// Parses a whole decimal integer in [lo, hi]; nullopt on anything else.
std::optional<long long> to_int(std::string_view s, long long lo, long long hi);
/// Throws UsageError "invalid value '<value>' for --<flag>: expected <want>".
[[noreturn]] void bad_value(std::string_view flag, std::string_view value, std::string_view want);
/// An integer flag in [lo, hi]; throws UsageError naming the flag otherwise.
int int_flag(std::string_view flag, std::string_view value, long long lo, long long hi,
             std::string_view want);
/// --store-memory-budget's size -> bytes (0 = unlimited).
std::size_t store_budget_flag(std::string_view flag, std::string_view value);
/// Seconds, integer or decimal, 0..86400 -> milliseconds.
std::chrono::milliseconds seconds_flag(std::string_view flag, std::string_view value);
/// What is wrong with a run id, if anything.
std::optional<std::string> run_id_problem(std::string_view id);
std::vector<std::string_view> split(std::string_view s, char sep);
/// Without leading and trailing spaces and tabs.
std::string_view trim(std::string_view s);
}  // namespace detail

namespace cli {
/// Applies one flag's value to the options (`flag` names it in messages).
using Setter = std::function<void(std::string_view flag, std::string_view value)>;
struct Flag {
  bool takes_value;
  Setter set;
  /// torchrun's PET_<DEST> variable for this flag ("" when torchrun reads none): a value the
  /// command line does not override (a switch: an integer, non-zero = on).
  std::string pet = {};
  /// gpurun's own name for a torchrun flag ("nproc" for "nproc-per-node"): given on the
  /// command line, that flag's PET_* variable is not read either.
  std::string same_as = {};
};
/// Canonical flag name ("nproc-per-node") -> its flag.
using FlagTable = std::map<std::string, Flag, std::less<>>;

/// Every flag gpurun accepts, each setting its fields of `o`, which must outlive the table.
FlagTable flag_table(Options& o);
}  // namespace cli
}  // namespace gpurun::supervisor
