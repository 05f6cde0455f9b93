// gpurun::store::Session — one client connection of a Server: read → decode →
// answer in order, one writer queue, every buffered byte charged to the
// server's MemoryBudget. docs/store-protocol.md ("Limits", "Memory budget").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "gpurun/store/frame_codec.hpp"
#include "store/backend.hpp"
#include "store/memory_budget.hpp"

namespace gpurun::store {

class ServerState;

/// A TCP socket bound to a concrete io_context executor (no type-erased
/// dispatch per handler).
using Socket =
    boost::asio::ip::tcp::socket::rebind_executor<boost::asio::io_context::executor_type>::other;

/// One client connection. Everything runs on the session's reactor thread
/// except send_stop_waiting(), which any thread may call (from the backend's
/// notify); the reply queue and the closing flag are guarded by a mutex.
///
/// Memory: the session charges its read buffer, the bytes of a request
/// received but not yet handled, and the replies not yet written to the
/// server's MemoryBudget; a request whose memory (its own, what the backend
/// would store for it, or its reply) does not fit closes this session only,
/// with a log line naming the peer, the request and the budget. Replies to
/// the requests before it are still written. Everything it held is given back
/// when it closes.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<ServerState> server, Socket socket, ConnectionId id);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const boost::asio::io_context::executor_type& executor() const { return executor_; }
  /// The peer as "ip:port" ("[ip]:port" for IPv6).
  const std::string& peer() const { return peer_; }

  /// Starts reading (the session's thread).
  void start();

  /// Any thread, called with the backend's mutex held: queues a STOP_WAITING
  /// for a completed WAIT and has the session's thread write it.
  void send_stop_waiting();

  /// Ends the session (the session's thread): drops its waits and logs
  /// `reason` if non-empty. With `graceful`, replies already produced are
  /// written first (a client that pipelined good requests before a bad one
  /// gets their answers).
  void close(const std::string& reason, bool graceful = false);

 private:
  void do_read();
  void on_read(boost::system::error_code ec, std::size_t n);
  void after_input();
  void handle_input(std::span<const uint8_t> input);
  void resume_input();
  void queue_replies();
  void handle(Request& req);
  // Charges the reply bytes handle() appended to replies_ after `before`; false (and the
  // session closing) when they do not fit the budget.
  bool charge_reply(QueryType type, std::size_t before);
  // Charges `consumed` more bytes of the request being received; false (closing) if refused.
  bool charge_request(std::size_t consumed);
  std::size_t unsent_bytes();
  void on_flush_posted();
  void start_write();
  void finish_close();
  void on_write(boost::system::error_code ec);
  // Frees the buffers and gives their charge back (the session is closed).
  void release_memory();
  // "the budget of N bytes (U in use)" for refusal messages.
  std::string budget_state() const;

  std::shared_ptr<ServerState> server_;
  Socket socket_;
  const boost::asio::io_context::executor_type executor_;
  ConnectionId id_;
  std::string peer_;
  FrameDecoder decoder_;
  MemoryCharge charge_;            // every byte below that the session holds
  std::size_t max_unsent_bytes_;   // per-connection unsent-reply bound (see session.cpp)
  std::vector<uint8_t> buf_;       // read buffer (4 KiB, grown to 64 KiB)
  std::vector<uint8_t> backlog_;   // requests read but not handled yet: replies over the limit
  std::string replies_;            // replies produced by the read being handled, not yet queued
  std::size_t request_bytes_ = 0;  // bytes of the request being decoded (charged)
  std::size_t backlog_bytes_ = 0;  // backlog_.size() as charged
  bool reading_ = false;
  bool writing_ = false;
  bool closed_ = false;  // socket closed

  std::mutex mu_;         // guards the members below; taken after the backend's mutex
  std::string outbox_;    // replies not yet handed to the socket
  std::string inflight_;  // the write in progress (this thread only; read under mu_)
  bool flush_posted_ = false;
  bool closing_ = false;  // no more requests or replies; waits dropped (read unlocked here)
};

}  // namespace gpurun::store
