#include "store/reactor_pool.hpp"

namespace gpurun::store {

namespace asio = boost::asio;

ReactorPool::ReactorPool(std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    contexts_.push_back(std::make_unique<asio::io_context>(1));
    work_.emplace_back(contexts_.back()->get_executor());
  }
}

ReactorPool::~ReactorPool() {
  stop();
}

void ReactorPool::start() {
  for (auto& ctx : contexts_) threads_.emplace_back([io = ctx.get()] { io->run(); });
}

void ReactorPool::stop() {
  work_.clear();
  for (auto& ctx : contexts_) ctx->stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

std::vector<asio::io_context*> ReactorPool::contexts() const {
  std::vector<asio::io_context*> out;
  out.reserve(contexts_.size());
  for (const auto& ctx : contexts_) out.push_back(ctx.get());
  return out;
}

}  // namespace gpurun::store
