// Command-line parsing for the gpurun binary (reference: docs/cli.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "supervisor/options.hpp"

namespace gpurun::supervisor {

/// Parses gpurun's command line (argv[0] is skipped). Accepts `--flag value`
/// and `--flag=value`, `_` or `-` inside flag names (`--nproc_per_node`), and
/// takes the worker command from the first non-flag argument or after `--`.
/// Does not resolve nproc modes or touch the environment.
/// Throws gpurun::UsageError naming the flag and the value on bad input.
/// torchrun's PET_<FLAG> variables in `env` give a flag's value when the command line does not
/// (a switch: an integer, non-zero = on), as torchrun reads them (docs/cli.md#torchrun-flags).
Options parse(int argc, const char* const* argv,
              const std::map<std::string, std::string>& env = {});
/// `args` without argv[0].
Options parse(const std::vector<std::string>& args,
              const std::map<std::string, std::string>& env = {});

namespace detail {
/// A HOST[:PORT] value (--rdzv-endpoint): IPv6 in brackets ("[::1]:29400", "[fe80::1]"), a bare
/// IPv6 address without a port ("::1"), a name or IPv4 address with an optional port.
struct Endpoint {
  std::string host;  ///< without brackets
  uint16_t port = 0;
  bool port_given = false;
};
/// Throws UsageError naming `flag` for anything else; `default_port` when none is given.
Endpoint parse_endpoint(std::string_view flag, std::string_view value, uint16_t default_port);
}  // namespace detail

/// Parses a --redirects/--tee value ("3", "0:1,1:2"). Throws UsageError, also for an empty
/// piece ("0:1,,1:2") or a local rank given twice ("0:1,0:2").
StdSpec parse_std_spec(std::string_view flag, std::string_view value);

/// Throws UsageError when a per-local-rank --redirects/--tee map names a local rank outside
/// [0, local_ranks), naming the piece. parse() runs it for --nproc N (except in elastic mode on
/// GPUs); main runs it again once the slot count is known. `counted_by` names the count in the
/// message ("--config: the 8 visible GPUs"); empty: "--nproc <local_ranks>".
void check_local_ranks(const Options& options, int local_ranks, std::string_view counted_by = {});

/// Whether --master-addr resolves (checked at start, so that workers do not fail later).
struct AddressCheck {
  enum class Result {
    kOk,            ///< an IPv4/IPv6 literal (bare or in brackets) or a name that resolves
    kUnresolvable,  ///< reason: getaddrinfo's message or what is wrong with the text
    kTimedOut,      ///< the resolver gave no answer within the timeout (DNS unreachable?)
  };
  Result result = Result::kOk;
  std::string reason;
  /// kOk: the numeric addresses it names, in the resolver's order without duplicates: the
  /// literal itself (brackets removed, scope kept: "fe80::1%eth0"), or what the name resolves
  /// to ("127.0.0.1", "::1"). Empty otherwise.
  std::vector<std::string> addresses;
};

/// Checks `addr` as given to --master-addr: "10.0.0.1", "::1", "[::1]", "node0". Literals are
/// checked with AI_NUMERICHOST (no DNS); names through getaddrinfo without AI_ADDRCONFIG,
/// waiting at most `timeout`; names under .invalid fail at once (RFC 6761). Blocks up to
/// `timeout`; never throws (bad_alloc aside). The address itself is not rewritten: workers
/// get it verbatim.
AddressCheck check_master_addr(const std::string& addr,
                               std::chrono::milliseconds timeout = std::chrono::seconds(2));

/// The --help text, with examples.
std::string help_text();

/// The --version line, e.g. "gpurun 0.1.0".
std::string version_text();

}  // namespace gpurun::supervisor
