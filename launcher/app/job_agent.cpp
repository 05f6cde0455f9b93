// Job, node k > 0 of one elastic job over several nodes (--config with --nnodes,
// docs/cli.md#elastic-nodes): this gpurun joins node 0's job and runs its supervisor with a
// slot agent (launcher/nodes/node_agent.hpp) as controller: its slots start and stop on node
// 0's commands. No start rendezvous, no store of its own, no restarts.
#include "app/job.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include "app/start_checks.hpp"
#include "gpurun/control/decision.hpp"
#include "gpurun/error.hpp"
#include "gpurun/json_writer.hpp"
#include "nodes/node0_store.hpp"
#include "supervisor/process_spawner.hpp"  // signal_name

namespace gpurun::app {

namespace asio = boost::asio;
namespace sv = gpurun::supervisor;

namespace {

// "gpu 0, gpu 1", or what an empty offer means.
std::string offer_text(const std::vector<int>& offer) {
  if (offer.empty()) return "none of them yet (its config's active_gpus is empty)";
  return "gpu " + gpurun::control::join_ids(offer, ", gpu ");
}

}  // namespace

bool Job::agent_mode() const {
  return opt_.config.has_value() && plan_.nnodes > 1 && plan_.node_rank > 0;
}

void Job::block_with_signals(const std::function<void()>& work,
                             const std::function<void(int sig)>& cancel) {
  // Until `work` is done and the signal wait has ended, whatever else io holds already (a
  // listening server's accept): io runs out of work only at the job's end.
  auto guard = asio::make_work_guard(io_);
  bool done = false, waiting = true;
  signals_.async_wait([&](const boost::system::error_code& ec, int sig) {
    waiting = false;
    if (!ec && (sig == SIGINT || sig == SIGTERM || sig == SIGQUIT)) cancel(sig);
  });
  std::thread worker([&] {
    work();  // does not throw: it keeps its error
    asio::post(io_, [&] {
      done = true;
      boost::system::error_code ignored;
      signals_.cancel(ignored);
    });
  });
  while (!done || waiting) io_.run_one();
  guard.reset();
  worker.join();
  // A run_one() that found io out of work (between the join's handlers) leaves it stopped: the
  // job's own io_.run() would then return at once and end it (exit 1, no word).
  if (io_.stopped()) io_.restart();
}

std::vector<int> Job::agent_offer() const {
  // The config's active_gpus, else the first --nproc slots (docs/config.md#active_gpus).
  return config_ && config_->active_gpus ? *config_->active_gpus : launch_ids_;
}

std::optional<int> Job::join_elastic() {
  const std::string where = fmt::format("{}:{}", plan_.master_addr, plan_.master_port);
  std::atomic<int> cancel_sig{0};
  const auto cancelled = [&] {
    if (const int sig = cancel_sig.load())
      throw sv::JoinError(128 + sig, fmt::format("{} while joining node 0's store at {}",
                                                 sv::signal_name(sig), where));
  };
  std::unique_ptr<store::ClientStore> events, commands;
  // Where this node serves its pause snapshot: the address it reaches node 0's store from.
  std::string snapshot_endpoint, address;
  try {
    const std::string here = sv::local_address_towards(plan_.master_addr, plan_.master_port);
    address = here;  // node 0 severs it when it gives this node up (keys::sever)
    snapshot_endpoint = serve_snapshots(here, here, plan_.run_id);
  } catch (const gpurun::Error& e) {
    print_err(fmt::format("warning: this node serves no pause snapshot: {}", e.what()));
  }
  sv::ElasticJoin joined;
  std::exception_ptr error;
  block_with_signals(
      [&] {
        try {
          sv::Node0StoreOptions o;
          o.host = plan_.master_addr;
          o.port = plan_.master_port;
          o.connect_timeout = node_opts_.connect_timeout;
          o.op_timeout = node_opts_.op_timeout;
          o.say = [](const std::string& line) { print_err(line); };
          events = sv::connect_to_node0(o, std::chrono::steady_clock::now(), cancelled);
          store::ClientOptions co;
          co.host = plan_.master_addr;
          co.port = plan_.master_port;
          co.timeout = node_opts_.op_timeout;
          if (opt_.node_timeout.count() > 0) {
            // A request node 0's store leaves unanswered for --node-timeout cuts this node off
            // (NodeAgentOptions::node_timeout): both connections wait that long for an answer.
            co.timeout = opt_.node_timeout;
            events = std::make_unique<store::ClientStore>(co);  // the probe above closes
          }
          commands = std::make_unique<store::ClientStore>(co);
          sv::ElasticJoinRequest r;
          r.where = where;
          r.run_id = opt_.run_id_given ? plan_.run_id : std::string();
          r.slots = slot_ids_;
          r.offer = agent_offer();
          r.device = plan_.device == sv::Device::kCuda ? "cuda" : "cpu";
          r.snapshot_endpoint = snapshot_endpoint;
          r.address = address;
          joined = sv::join_elastic_job(*events, r);
        } catch (...) {
          error = std::current_exception();
        }
      },
      [&](int sig) { cancel_sig = sig; });
  try {
    if (error) std::rethrow_exception(error);
  } catch (const sv::JoinError& e) {
    print_err(fmt::format("error: this node: {}", e.what()));
    return e.code;
  } catch (const gpurun::Error& e) {
    print_err(
        fmt::format("error: this node: joining node 0's elastic job at {}: {}", where, e.what()));
    return kExitLauncherError;
  }
  plan_.run_id = joined.run_id;
  plan_.node_rank = joined.node;
  if (snapshot_server_) {  // requests present node 0's run id
    snapshot_server_->set_run_id(joined.run_id);
    snapshot_fetcher_ = std::make_unique<sv::SnapshotFetcher>(
        joined.run_id, [this] { return sv::snapshot_files(plan_.run_dir); });
  }
  agent_stores_ = {std::move(commands), std::move(events)};
  print_err(fmt::format(
      "node {}: joined node 0's elastic job '{}' at {} with {} slot(s), offering {}; its "
      "processes start on node 0's commands (at a boundary)",
      joined.node, joined.run_id, where, slot_ids_.size(), offer_text(agent_offer())));
  return std::nullopt;
}

void Job::build_agent() {
  sv::NodeAgentOptions ao;
  ao.node = plan_.node_rank;
  ao.where = fmt::format("{}:{}", plan_.master_addr, plan_.master_port);
  ao.slots = slot_ids_;
  ao.config_path = std::filesystem::absolute(*opt_.config).string();
  ao.joined_offer = agent_offer();
  ao.node_timeout = opt_.node_timeout;  // heartbeats; cut off after that long unanswered
  ao.offer = [this] {
    // The config as it is now; a config that does not load keeps the offer as it was.
    try {
      config_ = gpurun::control::load_config(*opt_.config, slot_ids_);
    } catch (const gpurun::control::ConfigError& e) {
      print_err(fmt::format("node {}: warning: {}; this node's offer stays {}", plan_.node_rank,
                            e.what(), offer_text(agent_offer())));
    }
    return agent_offer();
  };
  ao.say = [](const std::string& line) { print_err(line); };
  ao.status_changed = [this] {
    if (agent_status_) agent_status_->publish();
  };
  if (snapshot_fetcher_) ao.fetch_snapshot = snapshot_fetch();
  // Said when node 0 is gone: whether this node holds the paused job's state.
  ao.snapshot_files = [this] { return sv::snapshot_files(plan_.run_dir); };
  agent_ = std::make_unique<sv::NodeAgent>(io_, *supervisor_, std::move(agent_stores_.first),
                                           std::move(agent_stores_.second), std::move(ao));
  supervisor_->set_controller(agent_.get());
  // Its own status.json (gpurun status on this host): this node's slots, node 0's endpoint.
  agent_status_ = std::make_unique<gpurun::control::StatusWriter>(
      io_, plan_.run_dir,
      [this] {
        std::string text =
            JsonObject()
                .add("run_id", plan_.run_id)
                .add("run_dir", plan_.run_dir)
                .add("supervisor_pid", static_cast<int>(::getpid()))
                .add("updated", sv::EventLog::format_timestamp(std::chrono::system_clock::now()))
                .add("elastic", true)
                .add("config", std::filesystem::absolute(*opt_.config).string())
                .str();
        text.pop_back();  // the closing brace: this node's members follow
        return text + ", " + agent_->status_members(plan_.gpu_ids) + "}";
      },
      [](const std::string& why) { print_err("warning: " + why); });
  agent_status_->publish();
}

std::string Job::serve_snapshots(const std::string& address, const std::string& advertise,
                                 const std::string& run_id) {
  sv::SnapshotServerOptions so;
  so.address = address;
  so.run_id = run_id;
  so.files = [this] { return sv::snapshot_files(plan_.run_dir); };
  so.log = [](const std::string& line) { print_err(line); };
  try {
    snapshot_server_ = std::make_unique<sv::SnapshotServer>(io_, std::move(so));
  } catch (const gpurun::Error& e) {
    print_err(fmt::format(
        "warning: {}: a pause snapshot written on this node cannot reach another node's slots",
        e.what()));
    return {};
  }
  snapshot_fetcher_ = std::make_unique<sv::SnapshotFetcher>(
      run_id, [this] { return sv::snapshot_files(plan_.run_dir); });
  return snapshot_server_->endpoint(advertise);
}

std::function<void(const std::string&, int64_t,
                   std::function<void(const gpurun::control::NodeEvent&)>)>
Job::snapshot_fetch() {
  return [this](const std::string& endpoint, int64_t serial,
                std::function<void(const gpurun::control::NodeEvent&)> done) {
    snapshot_fetcher_->start(endpoint, serial, std::move(done));
  };
}

void Job::wire_agent() {
  // This node's status is node 0's word (release: 0, exit: the job's), 1 when node 0 is gone,
  // 128 + signal after a stop signal of its own.
  supervisor_->final_status = [this](int) { return agent_->final_status(); };
  // Node 0 decides the ranks and tells this node none: its workers' lines name their slot
  // ("[gpu0]: "), not a rank of this node's own numbering.
  supervisor_->set_generation(std::vector<int>{});
  // The config file's edits change this node's offer (SIGHUP too: on_reload_request).
  gpurun::control::WatcherOptions wo;
  wo.log = [this](const std::string& line) {
    print_err(fmt::format("node {}: config watcher: {}", plan_.node_rank, line));
  };
  agent_watcher_ = std::make_unique<gpurun::control::ConfigWatcher>(
      io_, *opt_.config, wo, [this] { agent_->offer_changed(); });
}

}  // namespace gpurun::app
