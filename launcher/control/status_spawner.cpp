#include "control/status_spawner.hpp"

#include <fmt/format.h>

namespace gpurun::control {

namespace sv = gpurun::supervisor;

StatusSpawner::StatusSpawner(boost::asio::io_context& io, sv::ProcessSpawner& inner,
                             sv::Console& console, int nproc, StatusSnapshot snapshot)
    : inner_(inner), console_(console), snapshot_(std::move(snapshot)) {
  writer_ = std::make_unique<StatusWriter>(
      io, snapshot_.run_dir, [this] { return render_status(status_, snapshot_); },
      [this](const std::string& error) {
        console_.write(sv::StreamId::kStderr, "gpurun: warning: " + error + "\n");
      });
  status_.elastic = false;
  status_.generation = 0;
  for (int i = 0; i < nproc; ++i) {
    status_.current_active.push_back(i);
    SlotStatus s;
    s.gpu = i;
    s.generation = 0;
    status_.slots.push_back(s);
  }
  status_.desired_active = status_.current_active;
  write();
}

void StatusSpawner::set(int local_rank, SlotState to, int pid, const std::string& reason) {
  if (local_rank < 0 || local_rank >= static_cast<int>(status_.slots.size())) return;
  SlotStatus& s = status_.slots[static_cast<size_t>(local_rank)];
  // STARTING -> ACTIVE -> EXITED/FAILED (or STARTING -> FAILED) follow the slot table; a
  // restart attempt starting a finished slot again is a reset. Status never throws: it
  // must not disturb the run.
  s.state = to;
  s.pid = pid;
  s.reason = reason;
  write();
}

std::unique_ptr<sv::WorkerProcess> StatusSpawner::spawn(const sv::SpawnRequest& request,
                                                        sv::WorkerCallbacks callbacks) {
  const int local = request.local_rank;
  if (local >= 0 && local < static_cast<int>(status_.slots.size()))
    status_.slots[static_cast<size_t>(local)].rank = request.rank;
  auto on_exit = std::move(callbacks.on_exit);
  callbacks.on_exit = [this, local, on_exit = std::move(on_exit),
                       alive = std::weak_ptr<int>(alive_)](sv::ExitStatus st) {
    if (!alive.expired())
      set(local, st.success() ? SlotState::kExited : SlotState::kFailed, -1, st.describe());
    if (on_exit) on_exit(st);
  };
  std::unique_ptr<sv::WorkerProcess> proc;
  try {
    proc = inner_.spawn(request, std::move(callbacks));
  } catch (const Error& e) {
    set(local, SlotState::kFailed, -1, e.what());
    throw;
  }
  set(local, SlotState::kActive, proc->pid(), "started");
  return proc;
}

void StatusSpawner::write() {
  writer_->publish();
}

}  // namespace gpurun::control
