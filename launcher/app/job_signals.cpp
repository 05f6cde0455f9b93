// Job, signals: which part each signal gpurun receives goes to — the start rendezvous (a
// stop cancels it), node 0's exit barrier, the supervisor (docs/cli.md#supervision), and with
// several nodes the other nodes too.
#include "app/job.hpp"

#include <signal.h>

#include <fmt/format.h>

#include "supervisor/worker_env.hpp"

namespace gpurun::app {

namespace asio = boost::asio;
namespace sv = gpurun::supervisor;

void Job::route_signals() {
  on_signal_ = [&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    // Node k > 0 of an elastic job: the first SIGTERM leaves the job at a boundary.
    if (agent_ && !supervisor_->done() && agent_->on_signal(sig)) {
      signals_.async_wait(on_signal_);
      return;
    }
    const bool stop = sig == SIGINT || sig == SIGTERM || sig == SIGQUIT;
    if (node_sync_ && node_sync_->rendezvous_pending()) {  // no worker runs yet
      if (stop) {
        rendezvous_signal_ = sig;
        node_sync_->cancel_rendezvous(
            fmt::format("node 0 received {} during the start rendezvous", sv::signal_name(sig)),
            128 + sig);
        return;
      }
    } else if (node_sync_ && node_sync_->waiting()) {  // the other nodes' end is awaited
      if (stop) node_sync_->interrupt(sig);
    } else {
      // Several nodes: the others stop the same way (e.g. SIGTERM: at their next boundary).
      if (node_sync_ && stop && !supervisor_->done())
        node_sync_->local_signal(supervisor_->attempt(), sig);
      supervisor_->handle_signal(sig);
    }
    if (!supervisor_->done()) signals_.async_wait(on_signal_);
  };
  // Added here, not with the others: the join above waits for a stop signal only once.
  signals_.add(SIGWINCH);  // a resized terminal: the workers' pseudo-terminals follow
  signals_.async_wait(on_signal_);
}

}  // namespace gpurun::app
