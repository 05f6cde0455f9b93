#include "testing/fake_spawner.hpp"

#include <signal.h>

#include <fmt/format.h>
#include <boost/asio/post.hpp>

#include "gpurun/check.hpp"

namespace gpurun::supervisor {

namespace {
class FakeWorker : public WorkerProcess {
 public:
  FakeWorker(std::shared_ptr<FakeSpawner::Proc> p, std::function<void(int)> on_signal)
      : p_(std::move(p)), on_signal_(std::move(on_signal)) {}
  ~FakeWorker() override { p_->detached = true; }
  int pid() const override { return p_->pid; }
  bool signal_group(int sig) override {
    if (!p_->group_alive) return false;
    p_->signals.push_back(sig);
    on_signal_(sig);
    return true;
  }
  bool group_alive() const override { return p_->group_alive; }

 private:
  std::shared_ptr<FakeSpawner::Proc> p_;
  std::function<void(int)> on_signal_;
};
}  // namespace

std::unique_ptr<WorkerProcess> FakeSpawner::spawn(const SpawnRequest& request,
                                                  WorkerCallbacks callbacks) {
  if (fail_spawn && fail_spawn(request))
    throw ProcessError(
        fmt::format("cannot start rank {} ('{}'): fake failure", request.rank, request.argv.at(0)));
  auto p = std::make_shared<Proc>();
  p->request = request;
  p->callbacks = std::move(callbacks);
  p->pid = next_pid_++;
  if (configure) configure(*p);
  procs.push_back(p);
  std::weak_ptr<Proc> weak = p;
  return std::make_unique<FakeWorker>(p, [this, weak](int sig) {
    auto proc = weak.lock();
    if (!proc) return;
    if (sig == SIGKILL) {
      proc->leaves_children = false;
      if (proc->exited) {
        proc->group_alive = false;
        return;
      }
    } else if (sig == SIGTERM || sig == SIGINT) {
      if (proc->ignores_sigterm || proc->exited) return;
    } else {
      return;  // SIGUSR1 etc.: recorded only
    }
    boost::asio::post(io_, [this, proc, sig] {
      if (!proc->exited) end(proc, ExitStatus{0, sig});
    });
  });
}

void FakeSpawner::output(std::size_t index, StreamId stream, std::string_view text) {
  auto& p = procs.at(index);
  if (!p->detached && p->callbacks.on_output) p->callbacks.on_output(stream, text);
}

void FakeSpawner::exit(std::size_t index, ExitStatus status) {
  end(procs.at(index), status);
}

void FakeSpawner::end(const std::shared_ptr<Proc>& p, ExitStatus status) {
  GPURUN_CHECK(!p->exited, "fake pid {} exited twice", p->pid);
  p->exited = true;
  if (!p->leaves_children) p->group_alive = false;
  if (p->detached) return;
  if (p->callbacks.on_stream_closed) {
    p->callbacks.on_stream_closed(StreamId::kStdout);
    p->callbacks.on_stream_closed(StreamId::kStderr);
  }
  if (!p->detached && p->callbacks.on_exit) p->callbacks.on_exit(status);
}

}  // namespace gpurun::supervisor
