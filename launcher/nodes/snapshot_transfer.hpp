// gpurun::supervisor — moving a pause snapshot between the nodes of one elastic job
// (docs/cli.md#elastic-nodes, "Pause and resume across nodes"). The snapshot stays on the node
// whose slot wrote it (supervisor::snapshot_path of that gpurun's run dir); a resume onto
// another node's slots copies it there first, over a TCP stream between the two gpurun
// processes (never through node 0's store). Each gpurun of such a job runs a SnapshotServer;
// node 0 tells a node to fetch() from another (NodeCommand kFetchSnapshot) or fetches itself.
// The copy is not checked here: the loader verifies the snapshot's XXH64 checksums.
//
// Wire protocol (one transfer per connection): the client sends one line
// "GPURUN-SNAPSHOT 1 <run id>\n"; the server answers "OK <bytes>\n" followed by exactly that
// many bytes of the file, or "ERR <sentence>\n", then closes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "gpurun/control/node_messages.hpp"

namespace gpurun::supervisor {

/// A SnapshotServer's settings.
struct SnapshotServerOptions {
  /// The IP address it listens on ("::": every address, IPv4 too); port 0 = a free port.
  std::string address = "::";
  uint16_t port = 0;
  /// The job's run id: a request presenting another one is refused.
  std::string run_id;
  /// The paths the snapshot may be in, in order (snapshot_path, snapshot_fallback_path of the
  /// run dir): the first that exists is served. Called on the io thread at each request.
  std::function<std::vector<std::string>()> files;
  /// Connections served at once; more are refused ("ERR busy") at their request.
  int max_connections = 8;
  /// A request line must arrive within this, else the connection is closed.
  std::chrono::milliseconds request_timeout{std::chrono::seconds(10)};
  /// A transfer that moves no byte for this long (a client that stopped reading) is closed.
  std::chrono::milliseconds stall_timeout{std::chrono::seconds(30)};
  /// One line per refused request or failed transfer (without "gpurun: "), io thread.
  std::function<void(const std::string&)> log;
};

/// Serves this node's pause snapshot file to the other nodes of the job, on the io thread
/// (Asio; the bytes move by sendfile(2), no copy through user space). A connection carries one
/// transfer; a bad client (wrong run id, no request, stops reading) loses only its own
/// connection. The file is opened at the request: a snapshot replaced during a transfer (rename
/// over it) does not change the bytes sent.
class SnapshotServer {
 public:
  /// Listens at once. Throws gpurun::Error naming the address and port when it cannot.
  SnapshotServer(boost::asio::io_context& io, SnapshotServerOptions options);
  ~SnapshotServer();
  SnapshotServer(const SnapshotServer&) = delete;
  SnapshotServer& operator=(const SnapshotServer&) = delete;

  uint16_t port() const;
  /// "host:port" ("[v6]:port") for `host`, the address other nodes reach this one at.
  std::string endpoint(const std::string& host) const;
  /// The run id requests must present, from now on (node k learns it at its join). Call it on
  /// the io thread, or while the io thread does not run.
  void set_run_id(std::string run_id);
  /// Stops accepting (transfers in progress finish). Idempotent.
  void close();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

/// What a fetch copied.
struct SnapshotFetched {
  int64_t bytes = 0;
  int64_t ms = 0;
};

/// Copies the pause snapshot served at `endpoint` ("host:port", "[v6]:port") for `run_id` to
/// `dest`: it writes `dest`.tmp.<pid> and renames it over `dest` once every byte arrived, so
/// `dest` is never a partial file (a failed fetch leaves none). `timeout`: how long the connect
/// and each wait for bytes may take (a transfer that makes progress is never cut). `cancel`
/// (optional) is polled about every 200 ms. Blocks; call it off the io thread. Throws
/// gpurun::Error "copying the pause snapshot from <endpoint> to '<dest>' failed after N of M
/// bytes: <cause>".
SnapshotFetched fetch_snapshot(const std::string& endpoint, const std::string& run_id,
                               const std::string& dest, std::chrono::milliseconds timeout,
                               const std::atomic<bool>* cancel = nullptr);

/// The paths a gpurun with run dir `run_dir` keeps its pause snapshot at, in order
/// (supervisor::snapshot_path, then snapshot_fallback_path when it differs): what its
/// SnapshotServer serves and where its SnapshotFetcher puts a copy.
std::vector<std::string> snapshot_files(const std::string& run_dir);

/// The address this host reaches `host`:`port` from (its routing decision: a UDP socket
/// connected there; no packet is sent). Throws gpurun::Error when `host` does not resolve.
std::string local_address_towards(const std::string& host, uint16_t port);

/// Runs fetch_snapshot on threads of its own (one per fetch; joined, never detached: the
/// destructor cancels those still running and joins them), so the io thread never blocks.
class SnapshotFetcher {
 public:
  /// `run_id`: the job's; `files`: this node's snapshot paths (the copy goes to the first; a
  /// file left at the others is removed once it is in place, so a resume reads the copy).
  SnapshotFetcher(std::string run_id, std::function<std::vector<std::string>()> files,
                  std::chrono::milliseconds timeout = std::chrono::seconds(30));
  ~SnapshotFetcher();
  SnapshotFetcher(const SnapshotFetcher&) = delete;
  SnapshotFetcher& operator=(const SnapshotFetcher&) = delete;

  /// Copies snapshot `serial` from `endpoint`; `done` runs once, on the fetch's thread, with a
  /// kSnapshotFetched event (`how` empty: in place; else the error's sentence). The shape of
  /// control::ElasticOptions::fetch_snapshot.
  void start(const std::string& endpoint, int64_t serial,
             std::function<void(const control::NodeEvent&)> done);

 private:
  std::string run_id_;
  std::function<std::vector<std::string>()> files_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> cancel_{false};
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

}  // namespace gpurun::supervisor
