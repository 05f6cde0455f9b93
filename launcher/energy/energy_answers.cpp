#include "energy/energy_answers.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "energy/cost.hpp"
#include "energy/monitor.hpp"

namespace gpurun::energy {

namespace keys = control::keys;
using control::EnergyQuestion;
using detail::json_number;
using detail::json_string;

namespace {

class MonitorReader final : public EnergyReader {
 public:
  explicit MonitorReader(const EnergyMonitor& m) : m_(m) {}
  std::optional<std::map<int, double>> counters_at(double t_s) const override {
    return m_.counters_at(t_s);
  }
  std::vector<int> active() const override { return m_.active_slots(); }
  std::map<int, std::pair<double, double>> job_and_epoch_j() const override {
    std::map<int, std::pair<double, double>> out;
    for (const auto& [slot, e] : m_.status()) out[slot] = {e.job_energy_j, e.epoch_energy_j};
    return out;
  }
  const std::vector<EpochRecord>& epochs() const override { return m_.epoch_records(); }
  std::optional<double> threshold_j() const override { return m_.threshold_j(); }

 private:
  const EnergyMonitor& m_;
};

const char* const kOffWhy =
    "gpurun's GPU energy monitor is off for this job (no NVML, --energy off, or --device cpu "
    "without --energy on or --simulate-gpus; gpurun's console said which at the start)";

}  // namespace

std::unique_ptr<EnergyReader> monitor_reader(const EnergyMonitor& monitor) {
  return std::make_unique<MonitorReader>(monitor);
}

EnergyAnswers::EnergyAnswers(store::Store& store, gpurun::Clock& clock,
                             supervisor::EventLog& events, std::function<std::string()> stop_fields,
                             AnswerOptions options)
    : store_(store),
      clock_(clock),
      events_(events),
      stop_fields_(std::move(stop_fields)),
      opt_(options),
      off_why_(kOffWhy) {}

EnergyAnswers::~EnergyAnswers() = default;

void EnergyAnswers::set_reader(std::unique_ptr<EnergyReader> reader, std::string off_why) {
  reader_ = std::move(reader);
  off_why_ = off_why.empty() ? std::string(kOffWhy) : std::move(off_why);
  if (!reader_) retry();  // what waits for readings is answered now: none will come
}

void EnergyAnswers::restart() {
  timer_.cancel();
  open_.clear();
  pending_.clear();
}

void EnergyAnswers::answer(const keys::EnergyAsk& ask, const std::string& json) {
  store_.set(keys::energy_answer(ask.gpu, ask.pid, ask.n), json);
}

bool EnergyAnswers::on_key(const std::string& key) {
  const std::optional<keys::EnergyAsk> ask = keys::parse_energy_ask(key);
  if (!ask) return false;
  const std::optional<std::string> value = store_.try_get(key);
  if (!value) return true;  // already read (a write observed twice)
  store_.remove(key);
  EnergyQuestion q;
  try {
    q = EnergyQuestion::from_json(*value);
  } catch (const control::ProtocolError& e) {
    answer(*ask, fmt::format(R"({{"v":1,"error":{}}})", json_string(e.what())));
    return true;
  }
  switch (q.op) {
    case EnergyQuestion::Op::kStop: {
      const std::string f = stop_fields_ ? stop_fields_() : std::string();
      answer(*ask, f.empty() ? std::string(R"({"v":1})") : "{\"v\":1," + f + "}");
      return true;
    }
    case EnergyQuestion::Op::kEnergy:
      answer(*ask,
             reader_ ? energy_json() : fmt::format(R"({{"v":1,"off":{}}})", json_string(off_why_)));
      return true;
    case EnergyQuestion::Op::kBegin: {
      if (!reader_) return true;  // its end is told why
      const auto mine = std::count_if(open_.begin(), open_.end(), [&](const auto& kv) {
        return std::get<0>(kv.first) == ask->gpu && std::get<1>(kv.first) == ask->pid;
      });
      if (static_cast<std::size_t>(mine) >= opt_.max_open) return true;  // its end is refused
      Open& o = open_[{ask->gpu, ask->pid, q.name}];
      o = Open{q.t_s, reader_->counters_at(q.t_s)};
      if (!o.at_t0 && !timer_.armed())
        timer_ = clock_.schedule_after(opt_.retry, [this] { retry(); });
      return true;
    }
    case EnergyQuestion::Op::kEnd:
      break;
  }
  Pending p{*ask, std::move(q), clock_.now()};
  if (!try_end(p)) {
    pending_.push_back(std::move(p));
    if (!timer_.armed()) timer_ = clock_.schedule_after(opt_.retry, [this] { retry(); });
  }
  return true;
}

bool EnergyAnswers::try_end(const Pending& p) {
  const auto refuse = [&](const std::string& why) {
    answer(p.ask, fmt::format(R"({{"v":1,"error":{}}})", json_string(why)));
    return true;
  };
  if (!reader_) {
    open_.erase({p.ask.gpu, p.ask.pid, p.q.name});
    answer(p.ask, fmt::format(R"({{"v":1,"off":{}}})", json_string(off_why_)));
    return true;
  }
  const auto it = open_.find({p.ask.gpu, p.ask.pid, p.q.name});
  if (it == open_.end())
    return refuse(fmt::format(
        "no energy window named '{}' is open for slot {} (pid {}): begin it first (at most {} "
        "open at once per process)",
        p.q.name, p.ask.gpu, p.ask.pid, opt_.max_open));
  Open& o = it->second;
  if (!o.at_t0) o.at_t0 = reader_->counters_at(o.t0_s);
  std::optional<std::map<int, double>> at_t1;
  if (o.at_t0) at_t1 = reader_->counters_at(p.q.t_s);
  if (!at_t1) {
    const auto waited = clock_.now() - p.since;
    if (waited < opt_.give_up) return false;
    const bool started = o.at_t0.has_value();
    open_.erase(it);
    return refuse(fmt::format(
        "energy window '{}' of slot {}: no GPU reading came after its {} within {} s (the "
        "energy monitor stopped: the job is ending)",
        p.q.name, p.ask.gpu, started ? "end" : "start",
        std::chrono::duration<double>(opt_.give_up).count()));
  }
  const double t0 = o.t0_s, t1 = std::max(p.q.t_s, o.t0_s);
  std::string gpus;
  double total = 0;
  for (int slot : reader_->active()) {
    const auto a = o.at_t0->find(slot);
    const auto b = at_t1->find(slot);
    if (a == o.at_t0->end() || b == at_t1->end()) continue;
    const double j = std::max(0.0, b->second - a->second);
    total += j;
    gpus += fmt::format(R"({}{{"slot":{},"energy_j":{}}})", gpus.empty() ? "" : ",", slot,
                        json_number(j));
  }
  open_.erase(it);
  const std::string fields = fmt::format(
      R"({{"name":{},"rank":{},"slot":{},"t0":{},"t1":{},"seconds":{},"gpus":[{}],"energy_j":{}}})",
      json_string(p.q.name), p.q.rank, p.ask.gpu, json_number(t0), json_number(t1),
      json_number(t1 - t0), gpus, json_number(total));
  events_.emit("energy_window", supervisor::JsonObject::from_object(fields));
  answer(p.ask, "{\"v\":1," + fields.substr(1));
  return true;
}

void EnergyAnswers::retry() {
  timer_.cancel();
  if (reader_)
    for (auto& [id, o] : open_)
      if (!o.at_t0) o.at_t0 = reader_->counters_at(o.t0_s);
  std::vector<Pending> waiting;
  for (Pending& p : pending_)
    if (!try_end(p)) waiting.push_back(std::move(p));
  pending_ = std::move(waiting);
  const bool begins_wait = reader_ && std::any_of(open_.begin(), open_.end(),
                                                  [](const auto& kv) { return !kv.second.at_t0; });
  if (!pending_.empty() || begins_wait)
    timer_ = clock_.schedule_after(opt_.retry, [this] { retry(); });
}

std::string EnergyAnswers::energy_json() const {
  const double now = clock_.unix_seconds();
  std::string gpus;
  double job = 0, epoch = 0;
  for (const auto& [slot, je] : reader_->job_and_epoch_j()) {
    job += je.first;
    epoch += je.second;
    gpus += fmt::format(R"({}{{"slot":{},"job_j":{},"epoch_j":{}}})", gpus.empty() ? "" : ",", slot,
                        json_number(je.first), json_number(je.second));
  }
  std::string epochs;
  const std::vector<EpochRecord>& recs = reader_->epochs();
  for (const EpochRecord& r : recs)
    epochs += (epochs.empty() ? "" : ",") + r.to_json_fields(reader_->threshold_j());
  const int64_t current = recs.empty() ? 0 : recs.back().epoch + 1;
  return fmt::format(
      R"({{"v":1,"t":{},"seconds":{},"epoch":{},"gpus":[{}],"job_j":{},"epoch_j":{},"epochs":[{}]}})",
      json_number(now), json_number(opt_.job_start_s > 0 ? now - opt_.job_start_s : 0), current,
      gpus, json_number(job), json_number(epoch), epochs);
}

}  // namespace gpurun::energy
