// gpurun::supervisor::connect_to_node0 — how a gpurun that is not node 0 reaches node 0's store:
// the start rendezvous of a static multi-node job (NodeSync::join) and the slot agent of an
// elastic one (node_agent.hpp) both connect through it (docs/cli.md#multi-node).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "gpurun/store/client_store.hpp"

namespace gpurun::supervisor {

/// Where node 0's store is and how long to try.
struct Node0StoreOptions {
  std::string host = "127.0.0.1";  ///< --master-addr
  uint16_t port = 29500;           ///< --master-port
  /// How long to keep trying to reach node 0's store (torch's store default).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(300)};
  /// One connect window (at most 1 s, so that a signal is seen within about a second).
  std::chrono::milliseconds op_timeout{std::chrono::seconds(5)};
  /// Who waits, in the line said once the first window failed: "node 2", "this node".
  std::string who = "this node";
  /// One "gpurun: ..." line without the prefix (the calling thread).
  std::function<void(const std::string& line)> say;
};

/// Connects to node 0's store in short windows from `t0` until it answers (at most
/// connect_timeout), calling `cancelled` before each window (it throws to stop). Blocks.
/// Throws JoinError (node_sync.hpp, code 1) naming host:port, the time tried and the last
/// cause, or at once after 3 windows in a row that reached another program on the port.
std::unique_ptr<store::ClientStore> connect_to_node0(const Node0StoreOptions& options,
                                                     std::chrono::steady_clock::time_point t0,
                                                     const std::function<void()>& cancelled);

}  // namespace gpurun::supervisor
