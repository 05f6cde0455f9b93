#include "store/server.hpp"

#include <algorithm>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <boost/asio/post.hpp>

#include "gpurun/error.hpp"
#include "store/listener.hpp"
#include "store/reactor_pool.hpp"
#include "store/server_state.hpp"
#include "store/session.hpp"

namespace gpurun::store {

namespace asio = boost::asio;

namespace {

constexpr std::size_t kMinMemoryBudgetBytes = std::size_t{16} << 20;

}  // namespace

std::size_t default_server_threads() {
  const unsigned cores = std::thread::hardware_concurrency();
  return std::clamp<std::size_t>(cores, 1, 8);
}

Server::Server(asio::io_context& io, ServerOptions options) {
  if (options.threads == 0) options.threads = default_server_threads();
  if (options.memory_budget_bytes != 0 && options.memory_budget_bytes < kMinMemoryBudgetBytes) {
    throw UsageError(fmt::format(
        "store memory budget of {} bytes is below the minimum of {} bytes (16 MiB): it must "
        "admit a maximal 8 MiB value while it is received and stored; 0 = unlimited",
        options.memory_budget_bytes, kMinMemoryBudgetBytes));
  }
  if (options.memory_budget_bytes != 0) MemoryBudget::tune_allocator();
  std::vector<asio::io_context*> contexts{&io};
  if (options.threads >= 2) {
    reactors_ = std::make_unique<ReactorPool>(options.threads);
    contexts = reactors_->contexts();
  }
  state_ = std::make_shared<ServerState>(io, std::move(options), std::move(contexts));
  ServerState* state = state_.get();
  state_->backend.set_notify([state](ConnectionId conn) {
    // Runs with the backend's mutex held, on the thread of the completing write.
    if (auto s = state->find_session(conn)) s->send_stop_waiting();
  });
  state_->backend.set_close_connection([state](ConnectionId conn, const std::string& reason) {
    // With the backend's mutex held: the close (which drops the connection's waits) runs on
    // the session's own executor.
    if (auto s = state->find_session(conn))
      boost::asio::post(s->executor(), [s, reason] { s->close(reason, true); });
  });
  listener_ = std::make_shared<Listener>(state_);
  listener_->listen();
  if (reactors_) reactors_->start();
}

Server::~Server() {
  close();
  state_->log_closes_left_out();
  state_->log_open = false;
  if (reactors_) {
    reactors_->stop();
    // The acceptors belong to a reactor's io_context: destroy them before it.
    listener_->destroy_acceptors();
  }
  // Members go in reverse order: listener_ and state_ (handlers may still hold them), then
  // reactors_, whose io_contexts destroy their queued handlers.
}

uint16_t Server::port() const {
  return listener_->port();
}

std::size_t Server::threads() const {
  return state_->reactors.size();
}

void Server::close() {
  if (state_->closed()) return;
  state_->close_sessions();  // marks the server closed: no session is accepted after this
  listener_->close();
  state_->io_work.reset();
}

void Server::reset_keyspace(std::string_view keep_prefix) {
  state_->backend.reset_keyspace(keep_prefix);
}

std::size_t Server::num_sessions() const {
  return state_->num_sessions();
}

Backend& Server::backend() {
  return state_->backend;
}

const MemoryBudget& Server::memory_budget() const {
  return state_->budget;
}

}  // namespace gpurun::store
