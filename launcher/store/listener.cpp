#include "store/listener.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/steady_timer.hpp>

#include "gpurun/check.hpp"
#include "gpurun/error.hpp"
#include "store/server_state.hpp"

namespace gpurun::store {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

std::string format_host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

// The host has no such address or address family (e.g. IPv6 disabled).
bool address_unusable(const error_code& ec) {
  return ec == boost::system::errc::address_not_available ||
         ec == boost::system::errc::address_family_not_supported ||
         ec == asio::error::address_family_not_supported;
}

}  // namespace

Listener::Listener(std::shared_ptr<ServerState> server) : server_(std::move(server)) {}

error_code Listener::listen_one(const asio::ip::address& addr, uint16_t port, bool dual_stack) {
  auto acc = std::make_unique<tcp::acceptor>(*server_->reactors[0]);
  const tcp::endpoint ep(addr, port);
  error_code ec;
  acc->open(ep.protocol(), ec);
  if (ec) return ec;
  acc->set_option(asio::socket_base::reuse_address(true), ec);
  if (ec) return ec;
  if (addr.is_v6()) {
    acc->set_option(asio::ip::v6_only(!dual_stack), ec);
    if (ec) return ec;
  }
  acc->bind(ep, ec);
  if (ec) return ec;
  acc->listen(server_->options.backlog, ec);
  if (ec) return ec;
  if (bound_port_ == 0) bound_port_ = acc->local_endpoint().port();
  acceptors_.push_back(std::move(acc));
  return {};
}

void Listener::listen() {
  const ServerOptions& options = server_->options;
  GPURUN_CHECK(!options.hosts.empty(), "ServerOptions::hosts is empty");
  // A port the kernel picked for the first host may be another program's on a later one; a
  // busy port that may be replaced (free_port_if_busy): start over on a port the kernel picks.
  constexpr int kAttempts = 8;
  uint16_t port = options.port;
  for (int attempt = 1;; ++attempt) {
    std::optional<std::string> busy = listen_hosts(port);
    if (!busy) break;
    if ((port != 0 && !options.free_port_if_busy) || attempt == kAttempts) throw StoreError(*busy);
    acceptors_.clear();
    bound_port_ = 0;
    port = 0;
  }
  next_reactor_.assign(acceptors_.size(), 0);
  for (std::size_t i = 0; i < acceptors_.size(); ++i) do_accept(i);
}

std::optional<std::string> Listener::listen_hosts(uint16_t first_port) {
  const ServerOptions& options = server_->options;
  for (std::size_t i = 0; i < options.hosts.size(); ++i) {
    const std::string& host = options.hosts[i];
    const uint16_t port = bound_port_ != 0 ? bound_port_ : first_port;
    error_code ec;
    asio::ip::address addr = asio::ip::make_address(host, ec);
    if (ec) {
      // Not an address literal: resolve the name and take its first address.
      tcp::resolver resolver(server_->io);
      auto results = resolver.resolve(host, std::to_string(port), ec);
      if (ec || results.empty()) {
        throw StoreError(fmt::format("cannot listen on {}: cannot resolve host: {}",
                                     format_host_port(host, port),
                                     ec ? ec.message() : std::string("no address")));
      }
      addr = results.begin()->endpoint().address();
    }
    const bool wildcard_v6 = addr.is_v6() && addr.is_unspecified();
    ec = listen_one(addr, port, wildcard_v6);
    if (ec && wildcard_v6 && address_unusable(ec)) {
      server_->log_now(fmt::format("store: cannot listen on {} ({}); falling back to 0.0.0.0",
                                   format_host_port(host, port), ec.message()));
      ec = listen_one(asio::ip::address_v4::any(), port, false);
    }
    if (!ec) continue;
    const bool optional = i > 0 && address_unusable(ec);
    if (optional) {
      server_->log_now(fmt::format("store: skipping {} ({}); not listening there",
                                   format_host_port(host, port), ec.message()));
      continue;
    }
    std::string what =
        fmt::format("cannot listen on {}: {}", format_host_port(host, port), ec.message());
    if (ec == boost::system::errc::address_in_use) return what;
    throw StoreError(what);
  }
  return std::nullopt;
}

void Listener::do_accept(std::size_t index) {
  if (server_->closed()) return;
  // The new connection's socket is created on the reactor that will run its session:
  // round-robin, counted per acceptor so that the connections to one address go to reactors
  // 0, 1, 2, ... in accept order.
  const std::size_t reactor = next_reactor_[index];
  next_reactor_[index] = (reactor + 1) % server_->reactors.size();
  acceptors_[index]->async_accept(*server_->reactors[reactor],
                                  [self = shared_from_this(), index](error_code ec, Socket socket) {
                                    self->on_accept(index, ec, std::move(socket));
                                  });
}

void Listener::on_accept(std::size_t index, error_code ec, Socket socket) {
  if (server_->closed() || ec == asio::error::operation_aborted) return;
  if (ec) {
    server_->log(fmt::format("store: accept failed: {}", ec.message()));
    // Out of descriptors or memory: back off briefly instead of spinning.
    auto timer =
        std::make_shared<asio::steady_timer>(*server_->reactors[0], std::chrono::milliseconds(100));
    timer->async_wait(
        [self = shared_from_this(), index, timer](error_code) { self->do_accept(index); });
    return;
  }
  error_code opt_ec;
  socket.set_option(tcp::no_delay(true), opt_ec);
  const ConnectionId id = next_id_++;
  auto session = std::make_shared<Session>(server_, std::move(socket), id);
  // Not added once the server closed meanwhile: the session's socket closes with it.
  if (!server_->add_session(id, session)) return;
  // Inline when the session's reactor is this thread (always when single-threaded).
  asio::dispatch(session->executor(), [session] { session->start(); });
  do_accept(index);
}

void Listener::close() {
  server_->run_on(*server_->reactors[0], [this] {
    for (auto& acc : acceptors_) {
      error_code ec;
      acc->close(ec);
    }
  });
}

}  // namespace gpurun::store
