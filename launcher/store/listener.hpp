// gpurun::store::Listener — a Server's acceptors: binds every
// ServerOptions::hosts address on one port and hands each accepted connection
// to a reactor round-robin as a new Session. docs/store-protocol.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "store/backend.hpp"
#include "store/session.hpp"

namespace gpurun::store {

class ServerState;

/// Acceptors on reactors[0]'s thread. Construct, listen() and close() on the
/// Server's constructing thread (io's).
class Listener : public std::enable_shared_from_this<Listener> {
 public:
  explicit Listener(std::shared_ptr<ServerState> server);

  /// Binds and listens on every ServerOptions::hosts address and starts
  /// accepting. Throws gpurun::StoreError naming host and port ("cannot listen
  /// on 127.0.0.1:29500: Address already in use"); an address other than the
  /// first that the host lacks is skipped with a log line. A busy port is
  /// replaced by one the kernel picks when ServerOptions::free_port_if_busy is
  /// set, or when the kernel picked it (port 0) and a later host has it taken.
  void listen();
  /// The bound port (after listen()).
  uint16_t port() const { return bound_port_; }
  /// Closes the acceptors (on reactors[0]'s thread; blocks until done). Idempotent.
  void close();
  /// Destroys the acceptors; call once reactors[0] no longer runs.
  void destroy_acceptors() { acceptors_.clear(); }

 private:
  // Opens, binds and listens one acceptor; returns the error instead of throwing.
  boost::system::error_code listen_one(const boost::asio::ip::address& addr, uint16_t port,
                                       bool dual_stack);
  // Listens on every host, the first on `first_port`, the others on the port it got. Returns
  // the error line when a port is taken (EADDRINUSE), throws StoreError on any other error.
  std::optional<std::string> listen_hosts(uint16_t first_port);
  void do_accept(std::size_t index);
  void on_accept(std::size_t index, boost::system::error_code ec, Socket socket);

  std::shared_ptr<ServerState> server_;
  std::vector<std::unique_ptr<boost::asio::ip::tcp::acceptor>> acceptors_;  // reactors[0] only
  std::vector<std::size_t> next_reactor_;  // per acceptor; reactors[0]'s thread only
  ConnectionId next_id_ = 1;               // reactors[0]'s thread only
  uint16_t bound_port_ = 0;
};

}  // namespace gpurun::store
