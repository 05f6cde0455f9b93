// Job, several nodes (--nnodes > 1, docs/cli.md#multi-node): the node's place, the join of
// node 0's store by the other nodes, and node 0's sync of every attempt across nodes.
#include "app/job.hpp"

#include <signal.h>

#include <exception>

#include <fmt/format.h>

#include "app/start_checks.hpp"
#include "gpurun/abstract_lock.hpp"
#include "gpurun/control/heartbeat.hpp"
#include "gpurun/error.hpp"
#include "nodes/master_address.hpp"

namespace gpurun::app {

namespace asio = boost::asio;
namespace sv = gpurun::supervisor;

std::optional<int> Job::prepare_nodes() {
  // --nnodes > 1 (docs/cli.md#multi-node): nodes > 0 join node 0's store before anything
  // else — node 0 starts the job once every node joined; its run id and --max-restarts hold
  // for every node. (Blocking, before gpurun handles signals: Ctrl-C ends it as usual.)
  if (plan_.nnodes > 1) {
    node_opts_.nnodes = plan_.nnodes;
    node_opts_.node_rank = plan_.node_rank;
    node_opts_.nproc = plan_.nproc;
    node_opts_.host = plan_.master_addr;
    node_opts_.port = plan_.master_port;
    node_opts_.run_id = plan_.run_id;
    node_opts_.max_restarts = plan_.max_restarts;
    node_opts_.barrier_timeout = opt_.exit_barrier_timeout;
    node_opts_.join_timeout = opt_.join_timeout;
    node_opts_.heartbeat_timeout = opt_.node_timeout;
    node_opts_.heartbeat_interval = gpurun::control::heartbeat_interval(opt_.node_timeout);
    node_opts_.say = [](const std::string& line) { print_err(line); };
    if (rank_by_join_) {
      node_opts_.nnodes = opt_.nnodes;
      node_opts_.nnodes_max = opt_.nnodes_max;
      node_opts_.rank_by_join = true;
      node_opts_.check_run_id = opt_.run_id_given;
      node_opts_.last_call_timeout = opt_.last_call_timeout;
    }
  }
  signals_.add(SIGINT);
  signals_.add(SIGTERM);
  signals_.add(SIGUSR1);
  signals_.add(SIGUSR2);
  signals_.add(SIGHUP);
  signals_.add(SIGQUIT);  // stops the job like SIGTERM (torchrun's agent does the same)
  if (opt_.preempt_signal != 0 && opt_.preempt_signal != SIGUSR1 && opt_.preempt_signal != SIGUSR2)
    signals_.add(opt_.preempt_signal);  // --preempt-signal (docs/cli.md#preemption)
  // c10d by join order: host candidates on one machine contend for @gpurun-c10d/<port> (held
  // for the process's life). The first hosts; the others, and a candidate that finds the port
  // taken by another program, join (torchrun's c10d backend falls back to a client too),
  // unless --rdzv-conf is_host=1 says it must host.
  if (rank_by_join_ && plan_.node_rank == 0 && !opt_.is_host.value_or(false)) {
    host_claim_ = gpurun::UniqueFd(
        gpurun::take_abstract_lock(fmt::format("gpurun-c10d/{}", plan_.master_port)));
    if (!host_claim_ || sv::port_in_use(plan_.master_port)) {
      plan_.node_rank = node_opts_.node_rank = 1;  // another process hosts: join it
      print_err(fmt::format(
          "the store's port {} is taken on this host: joining the node that listens there",
          plan_.master_port));
    }
  }
  // An elastic job (--config): node 0's slot agent, no start rendezvous (job_agent.cpp).
  if (agent_mode()) return join_elastic();
  if (plan_.nnodes > 1 && plan_.node_rank > 0) {
    // The join blocks on its own thread; this one handles signals meanwhile (a stop signal
    // ends the join within about a second, exit 128 + signal).
    node_sync_ = std::make_unique<sv::NodeSync>(io_, node_opts_);
    std::optional<sv::JobStart> joined;
    std::exception_ptr join_error;
    block_with_signals(
        [&] {
          try {
            joined = node_sync_->join();
          } catch (...) {
            join_error = std::current_exception();
          }
        },
        [&](int sig) { node_sync_->cancel_join(sig); });
    try {
      if (join_error) std::rethrow_exception(join_error);
      const sv::JobStart& js = *joined;
      if (js.max_restarts != plan_.max_restarts)
        print_err(fmt::format(
            "warning: node 0 runs with --max-restarts {}, this node was given {}: node 0 decides "
            "restarts for the whole job, so {} holds",
            js.max_restarts, plan_.max_restarts, js.max_restarts));
      plan_.run_id = js.run_id;
      plan_.max_restarts = js.max_restarts;
      plan_.node_rank = js.node_rank;  // c10d: given in join order
      plan_.nnodes = js.nnodes;        // --nnodes MIN:MAX: as node 0 closed the rendezvous
      plan_.world_size = plan_.nproc * plan_.nnodes;
    } catch (const sv::JoinError& e) {  // (node_label: the rank join() gave, if any)
      print_err(fmt::format("error: {}: {}", node_label(), e.what()));
      return e.code;
    } catch (const gpurun::Error& e) {
      print_err(fmt::format("error: {}: {}", node_label(), e.what()));
      return kExitLauncherError;
    }
  }
  return std::nullopt;
}

std::string Job::node_label() const {  // node_rank() < 0: a join-order rank not given yet
  return node_sync_ && node_sync_->node_rank() < 0
             ? std::string("this node")
             : fmt::format("node {}", node_sync_ ? node_sync_->node_rank() : plan_.node_rank);
}

void Job::wire_nodes() {
  if (agent_) {  // node k > 0 of an elastic job: the agent, not NodeSync (job_agent.cpp)
    wire_agent();
    return;
  }
  // --nnodes > 1: a failure anywhere stops every node; node 0 decides each attempt's end for
  // the whole job (restart or exit, the root cause) and keeps its store up until every node
  // is done (the exit barrier). docs/cli.md#multi-node.
  // An elastic job over several nodes (--config) has no start rendezvous and no restarts across
  // nodes: node 0's controller and its NodeHub hold it together (docs/cli.md#elastic-nodes).
  if (plan_.nnodes > 1 && store_ && !opt_.config) {
    node0_store_ = std::make_unique<gpurun::store::BackendStore>(store_->backend());
    node_sync_ = std::make_unique<sv::NodeSync>(io_, node_opts_, *node0_store_);
  }
  if (node_sync_) {
    node_sync_->on_peer_failure = [this](const std::string& why, int sig) {
      if (sig != 0)
        supervisor_->peer_signal(sig, why);
      else
        supervisor_->stop_for_peer(why);
    };
    node_sync_->on_root_cause = [this](int attempt, const sv::NodeFailure& root) {
      // A node's own failure ("node 1 (host)'s gpurun disconnected …") names its node, a
      // worker's ("rank 2 (pid 123) ended with …") its rank: each is said once.
      print_err(fmt::format(
          "root cause of attempt {} (first failure in time, of every node): {}", attempt,
          root.rank >= 0
              ? fmt::format("node {}, local rank {}: {}", root.node, root.local_rank, root.reason)
              : root.reason));
      events_.emit("root_cause", sv::JsonObject()
                                     .add("attempt", attempt)
                                     .add("node", root.node)
                                     .add("rank", root.rank)
                                     .add("local_rank", root.local_rank)
                                     .add("code", root.code)
                                     .add("reason", root.reason));
    };
    supervisor_->on_attempt_start = [this](int attempt) { node_sync_->attempt_started(attempt); };
    supervisor_->on_failure = [this](const sv::Supervisor::LocalFailure& f) {
      sv::NodeFailure nf;
      nf.rank = f.rank;
      nf.local_rank = f.local_rank;
      nf.code = f.code;
      nf.reason = f.reason;
      node_sync_->local_failure(f.attempt, nf);
    };
    supervisor_->attempt_gate = [&](int attempt, int code, bool by_signal,
                                    sv::Supervisor::AttemptDecision decide) {
      const auto then = [&, decide](const sv::AttemptOutcome& out) {
        if (out.restart && out.nnodes > 0) {  // re-formed with the nodes left (--nnodes MIN:MAX)
          plan_.node_rank = out.node_rank;
          plan_.nnodes = out.nnodes;
          plan_.world_size = plan_.nproc * plan_.nnodes;
          supervisor_->set_node(out.node_rank, out.nnodes);
        }
        decide(out.restart, out.code, out.reason);
      };
      node_sync_->attempt_ended(attempt, code, by_signal, then);
    };
  }
}

}  // namespace gpurun::app
