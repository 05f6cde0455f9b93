// The communicator options of one rank of an in-process group on the loopback test store.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "comm/communicator.hpp"

namespace gpurun::testing {

/// Rank `rank` of `size` under `prefix` on the store at 127.0.0.1:`port`; `timeout` for the
/// store and the group's operations.
inline rt::CommOptions group_options(uint16_t port, const std::string& prefix, int rank, int size,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  rt::CommOptions o;
  o.store.host = "127.0.0.1";
  o.store.port = port;
  o.store.timeout = timeout;
  o.prefix = prefix;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  return o;
}

}  // namespace gpurun::testing
