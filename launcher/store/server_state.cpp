#include "store/server_state.hpp"

#include <fmt/format.h>

#include <future>
#include <utility>

#include <boost/asio/post.hpp>

#include "store/session.hpp"

namespace gpurun::store {

namespace asio = boost::asio;

ServerState::ServerState(asio::io_context& io_context, ServerOptions opts,
                         std::vector<asio::io_context*> ctxs)
    : io(io_context),
      options(std::move(opts)),
      budget(options.memory_budget_bytes),
      backend(options.limits),
      reactors(std::move(ctxs)),
      io_work(io.get_executor()) {
  backend.set_memory_budget(&budget);
}

void ServerState::log(std::string line) {
  if (!options.log) return;
  if (single_threaded()) {
    options.log(line);
    return;
  }
  asio::post(io, [self = shared_from_this(), line = std::move(line)] {
    if (self->log_open) self->options.log(line);
  });
}

void ServerState::log_now(const std::string& line) const {
  if (options.log) options.log(line);
}

void ServerState::log_close(std::string line) {
  const std::size_t n = closes_logged_.fetch_add(1) + 1;
  if (n <= kMaxLoggedCloses) {
    log(std::move(line));
  } else if (n == kMaxLoggedCloses + 1) {
    log(
        fmt::format("store: {} connections closed with an error: only the first {} are logged (the "
                    "total follows when the store closes)",
                    n, kMaxLoggedCloses));
  }
}

void ServerState::log_closes_left_out() {
  const std::size_t n = closes_logged_.load();
  if (n > kMaxLoggedCloses) {
    log_now(
        fmt::format("store: and {} more connections closed with an error (only the first "
                    "{} are logged)",
                    n - kMaxLoggedCloses, kMaxLoggedCloses));
  }
}

void ServerState::run_on(asio::io_context& ctx, const std::function<void()>& f) {
  if (single_threaded() || ctx.get_executor().running_in_this_thread()) {
    f();
    return;
  }
  std::promise<void> done;
  asio::post(ctx, [&] {
    f();
    done.set_value();
  });
  done.get_future().wait();
}

bool ServerState::add_session(ConnectionId id, const std::shared_ptr<Session>& session) {
  const std::lock_guard<std::mutex> lock(sessions_mu_);
  if (closed_) return false;
  sessions_.emplace(id, session);
  return true;
}

void ServerState::forget_session(ConnectionId id) {
  const std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_.erase(id);
}

std::shared_ptr<Session> ServerState::find_session(ConnectionId id) {
  const std::lock_guard<std::mutex> lock(sessions_mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second.lock();
}

std::size_t ServerState::num_sessions() const {
  const std::lock_guard<std::mutex> lock(sessions_mu_);
  return sessions_.size();
}

void ServerState::close_sessions() {
  std::vector<std::shared_ptr<Session>> open;
  {
    const std::lock_guard<std::mutex> lock(sessions_mu_);
    if (closed_) return;
    closed_ = true;
    for (auto& [id, weak] : sessions_) {
      if (auto s = weak.lock()) open.push_back(std::move(s));
    }
    sessions_.clear();
  }
  // Each session is closed on the thread that runs it; reactor threads never
  // wait for io's thread, so waiting for them here cannot deadlock.
  for (asio::io_context* ctx : reactors) {
    run_on(*ctx, [&open, ctx] {
      for (auto& s : open) {
        if (&s->executor().context() == ctx) s->close("");
      }
    });
  }
}

}  // namespace gpurun::store
