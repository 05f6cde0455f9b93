#include "supervisor/node_sync.hpp"

#include <algorithm>
#include <charconv>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpurun/error.hpp"

namespace gpurun::supervisor {

namespace {

using Clock = std::chrono::steady_clock;

std::string seconds(std::chrono::milliseconds d) {
  return fmt::format("{:g} s", static_cast<double>(d.count()) / 1000.0);
}

std::string seconds_since(Clock::time_point t0) {
  return seconds(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0));
}

/// A done key's value as a shell status: itself when it is an integer in 0..255, else 1.
int parse_status(const std::string& value) {
  int v = -1;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < 0 || v > 255) return 1;
  return v;
}

std::string node_list(const std::vector<int>& nodes) {
  return fmt::format("{}", fmt::join(nodes, ", "));
}

}  // namespace

std::string node_done_key(int node_rank) {
  return fmt::format("gpurun/node/{}/done", node_rank);
}

NodeSync::NodeSync(boost::asio::io_context& io, NodeSyncOptions options, LocalRead read,
                   LocalWrite write)
    : opt_(std::move(options)),
      io_(&io),
      read_(std::move(read)),
      write_(std::move(write)),
      timer_(std::make_unique<boost::asio::steady_timer>(io)) {}

NodeSync::NodeSync(NodeSyncOptions options) : opt_(std::move(options)) {
  connect_thread_ = std::thread([this] { connect_loop(); });
}

NodeSync::~NodeSync() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (connect_thread_.joinable()) connect_thread_.join();
}

void NodeSync::finish(int exit_code, std::function<void(int)> done) {
  write_(node_done_key(0), std::to_string(exit_code));
  if (exit_code != 0) {  // fail fast: the other nodes' workers lose the store (docs/cli.md)
    done(exit_code);
    return;
  }
  done_ = std::move(done);
  barrier_deadline_ = Clock::now() + opt_.barrier_timeout;
  poll();
}

void NodeSync::poll() {
  if (!done_) return;
  std::vector<int> missing;
  for (int r = 1; r < opt_.nnodes; ++r) {
    const std::optional<std::string> v = read_(node_done_key(r));
    if (!v) {
      missing.push_back(r);
      continue;
    }
    if (const int status = parse_status(*v); status != 0) {
      if (opt_.say)
        opt_.say(fmt::format(
            "node {}'s workers failed (exit status {}, key {} = '{}'); node 0 stops waiting and "
            "closes the store",
            r, status, node_done_key(r), *v));
      end_barrier(status);
      return;
    }
  }
  if (missing.empty()) {
    end_barrier(0);
    return;
  }
  if (!announced_ && opt_.say)
    opt_.say(
        fmt::format("node 0's workers are done; keeping the store up for node(s) {} (at most {})",
                    node_list(missing), seconds(opt_.barrier_timeout)));
  announced_ = true;
  if (Clock::now() >= barrier_deadline_) {
    if (opt_.say)
      opt_.say(fmt::format(
          "warning: exit barrier timed out after {}: no done status from node(s) {} (key {}); "
          "closing the store (exit status 0: node 0's workers succeeded)",
          seconds(opt_.barrier_timeout), node_list(missing), node_done_key(missing.front())));
    end_barrier(0);
    return;
  }
  timer_->expires_after(
      std::min<Clock::duration>(opt_.poll_interval, barrier_deadline_ - Clock::now()));
  timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) poll();
  });
}

void NodeSync::interrupt(int sig) {
  if (!done_) return;
  if (opt_.say)
    opt_.say(fmt::format(
        "signal {} during the exit barrier: node 0 stops waiting and closes the store", sig));
  end_barrier(128 + sig);
}

void NodeSync::end_barrier(int code) {
  timer_->cancel();
  std::function<void(int)> done = std::move(done_);
  done_ = nullptr;
  done(code);
}

void NodeSync::connect_loop() {
  const auto t0 = Clock::now();
  const auto deadline = t0 + opt_.connect_timeout;
  int windows = 0;
  std::string last;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
    }
    store::ClientOptions co;
    co.host = opt_.host;
    co.port = opt_.port;
    co.timeout = opt_.op_timeout;  // also the final SET's deadline
    ++windows;
    try {
      auto client = std::make_unique<store::Client>(co);
      std::lock_guard<std::mutex> lock(mutex_);
      client_ = std::move(client);
      return;
    } catch (const gpurun::Error& e) {
      last = e.what();
    }
    if (Clock::now() >= deadline) {
      if (opt_.say)
        opt_.say(fmt::format(
            "error: node 0's store at {}:{} did not answer within {} ({} tried in {} windows; "
            "last: {}); node {} cannot report its exit status to node 0",
            opt_.host, opt_.port, seconds(opt_.connect_timeout), seconds_since(t0), windows, last,
            opt_.node_rank));
      return;
    }
    // A window can end early (e.g. the name does not resolve): do not spin.
    std::unique_lock<std::mutex> lock(mutex_);
    stop_cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stop_; });
  }
}

void NodeSync::report(int exit_code) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (connect_thread_.joinable()) connect_thread_.join();
  const std::string key = node_done_key(opt_.node_rank);
  if (!client_) {
    if (opt_.say)
      opt_.say(fmt::format(
          "warning: node {}'s exit status {} was not written to node 0's store at {}:{} (never "
          "connected); node 0 waits for {} until its exit barrier times out",
          opt_.node_rank, exit_code, opt_.host, opt_.port, key));
    return;
  }
  try {
    client_->set(key, std::to_string(exit_code));
  } catch (const gpurun::Error& e) {
    if (opt_.say)
      opt_.say(fmt::format("warning: node {}'s exit status {} was not written to {} at {}: {}",
                           opt_.node_rank, exit_code, key, client_->peer(), e.what()));
  }
}

}  // namespace gpurun::supervisor
