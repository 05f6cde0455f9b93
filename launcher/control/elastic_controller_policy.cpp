// ElasticController, its policies (docs/sharing.md, docs/energy.md#scale): the set the job
// trains on — config.toml's declared set (node 0's, plus the other nodes' offers) less the GPUs
// lent (`gpurun lend`), yielded to another user's process (`[policy] yield_to_foreign`) or given
// back by `[energy] scale`, kept at `[policy] min_gpus` — and status.json's "policy" object.
// The rest of the controller: elastic_controller.cpp.
#include "control/elastic_controller.hpp"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace gpurun::control {

using supervisor::StreamId;

std::vector<int> ElasticController::declared_set(const Config& declared) const {
  return declared.active_gpus ? *declared.active_gpus : opt_.launch.value_or(opt_.slots);
}

std::vector<std::pair<int, std::string>> ElasticController::policy_out(
    const Config& declared) const {
  std::vector<std::pair<int, std::string>> out = declared.policy.yield_to_foreign
                                                     ? foreign_.yielded()
                                                     : std::vector<std::pair<int, std::string>>{};
  for (const auto& [gpu, why] : scale_out_) {
    const int g = gpu;
    if (std::none_of(out.begin(), out.end(), [g](const auto& o) { return o.first == g; }))
      out.emplace_back(gpu, why);
  }
  return out;
}

std::vector<int> ElasticController::lent_now() const {
  return leases_ ? lent_gpus(leases_->leases(), clock_.unix_ms()) : std::vector<int>{};
}

std::vector<int> ElasticController::yielded_now() const {
  std::vector<int> out;
  if (declared_.policy.yield_to_foreign)
    for (const auto& [gpu, why] : foreign_.yielded()) out.push_back(gpu);
  return out;
}

EffectiveSet ElasticController::effective_now(const Config& declared) const {
  const std::vector<Lease> none;
  return effective_set(declared_set(declared), leases_ ? leases_->leases() : none, clock_.unix_ms(),
                       declared.policy.min_gpus, &lease_time_text, policy_out(declared),
                       scheduler_.active());
}

Config ElasticController::effective_config(const Config& declared) const {
  const std::vector<int> offered = hub_ ? hub_->offered() : std::vector<int>{};
  Config c = declared;
  if ((leases_ && !leases_->leases().empty()) || !policy_out(declared).empty()) {
    const EffectiveSet e = effective_now(declared);
    if (e.active != declared_set(declared)) c.active_gpus = e.active;
  }
  // Several nodes: node 0's own set (after its policies) and every live node's offer.
  if (!offered.empty()) {
    std::vector<int> all = declared_set(c);
    all.insert(all.end(), offered.begin(), offered.end());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    c.active_gpus = all;
  }
  return c;
}

void ElasticController::set_scale(std::vector<std::pair<int, std::string>> out,
                                  std::string status_json) {
  scale_out_ = std::move(out);
  scale_status_ = std::move(status_json);
  if (in_boundary_)
    policy_pending_ = true;  // given to the scheduler before this boundary's decision
  else
    apply_policy();
}

void ElasticController::on_leases(const std::vector<LeaseKeeper::Change>& changes) {
  for (const auto& ch : changes) {
    const Lease& l = ch.lease;
    const std::string until = l.until_ms ? lease_time_text(*l.until_ms) : "reclaimed";
    const std::string note = l.note.empty() ? "" : fmt::format(" ({})", l.note);
    if (ch.event == "lease")
      console_.write(StreamId::kStderr, fmt::format("gpurun: lease: GPUs [{}] lent until {}{}\n",
                                                    join_ids(l.gpus, ", "), until, note));
    else
      console_.write(StreamId::kStderr,
                     fmt::format("gpurun: lease ended ({}): GPUs [{}] come back{}\n", ch.why,
                                 join_ids(l.gpus, ", "), note));
    supervisor::JsonObject f;
    f.add_raw("gpus", ids_json(l.gpus)).add("since_ms", l.since_ms);
    if (l.until_ms)
      f.add("until_ms", *l.until_ms);
    else
      f.add_raw("until_ms", "null");
    if (!l.note.empty()) f.add("note", l.note);
    if (!ch.why.empty()) f.add("why", ch.why);
    events_.emit(ch.event, f);
  }
  apply_policy();
}

void ElasticController::apply_policy(bool effects) {
  Config c = effective_config(declared_);
  if (c.active_gpus != scheduler_.config().active_gpus) {
    const std::vector<int> set = declared_set(c);
    const bool policy = c.active_gpus != declared_.active_gpus;
    const bool nodes = hub_ && !hub_->offered().empty();
    console_.write(StreamId::kStderr,
                   fmt::format("gpurun: the job trains on [{}] from {} boundary{}\n",
                               join_ids(set, ", "), effects ? "the next" : "this",
                               !policy ? ""
                               : nodes ? " (node 0's config.toml and the other nodes' offers)"
                                       : " (policies in force; config.toml unchanged)"));
    c.warnings.clear();  // said when the file was loaded
    scheduler_.config_loaded(std::move(c), opt_.config_path.string());
  }
  if (effects) run_effects();
}

namespace {

// Whose `pid` is: gpurun's (gpurun or a process below it, by /proc/<pid>/stat's parent
// chain), another's, or not visible in this pid namespace (not taken as another user's).
ForeignGpus::Owner pid_owner(unsigned pid) {
  const int self = static_cast<int>(::getpid());
  int p = static_cast<int>(pid);
  for (int depth = 0; depth < 64 && p > 1; ++depth) {
    if (p == self) return ForeignGpus::Owner::kOurs;
    std::ifstream in("/proc/" + std::to_string(p) + "/stat");
    std::string line;
    if (!std::getline(in, line))
      return depth == 0 ? ForeignGpus::Owner::kUnknown : ForeignGpus::Owner::kForeign;
    const size_t close = line.rfind(')');
    if (close == std::string::npos || close + 2 >= line.size()) return ForeignGpus::Owner::kUnknown;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    int ppid = 0;
    rest >> state >> ppid;
    p = ppid;
  }
  return ForeignGpus::Owner::kForeign;
}

std::string pid_text(unsigned pid) {
  struct stat st {};
  std::string user = "?";
  if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) == 0) {
    const passwd* pw = ::getpwuid(st.st_uid);
    user = pw ? std::string(pw->pw_name) : "uid " + std::to_string(st.st_uid);
  }
  return fmt::format("pid {} ({})", pid, user);
}

}  // namespace

void ElasticController::on_gpu_processes(const ForeignGpus::Listing& listing) {
  if (!declared_.policy.yield_to_foreign) {
    if (!foreign_.yielded().empty()) {  // turned off by a reload: every yielded GPU is back
      for (const auto& [gpu, why] : foreign_.yielded()) {
        console_.write(StreamId::kStderr,
                       fmt::format("gpurun: yield ended: GPU {}: [policy] yield_to_foreign is "
                                   "off: the job takes it back\n",
                                   gpu));
        events_.emit("yield_end", supervisor::JsonObject()
                                      .add("gpu", gpu)
                                      .add("processes", why)
                                      .add("why", "policy off"));
      }
      foreign_.clear();
      apply_policy();
    }
    return;
  }
  const ForeignGpus::Probe probe{&pid_owner, &pid_text};
  const auto changes =
      foreign_.update(listing, clock_.unix_ms(), probe, declared_.policy.reclaim_after.count());
  const EffectiveSet now = effective_now(declared_);
  for (const auto& ch : changes) {
    const std::string kept = kept_note(now, {ch.gpu}, declared_.policy.min_gpus);
    console_.write(
        StreamId::kStderr,
        ch.event == "yield"
            ? fmt::format("gpurun: yield: GPU {} is used by {}: {}\n", ch.gpu, ch.who,
                          kept.empty() ? std::string("the job gives it up")
                                       : "the job would give it up" + kept)
            : fmt::format("gpurun: yield ended: GPU {} has had no other user's process for {} s: "
                          "the job takes it back\n",
                          ch.gpu,
                          static_cast<double>(declared_.policy.reclaim_after.count()) / 1000.0));
    events_.emit(ch.event, supervisor::JsonObject().add("gpu", ch.gpu).add("processes", ch.who));
  }
  if (!changes.empty()) apply_policy();
}

std::string ElasticController::policy_status() const {
  const std::vector<int> set = declared_set(declared_);
  const std::vector<Lease> none;
  const std::vector<Lease>& leases = leases_ ? leases_->leases() : none;
  const EffectiveSet e = effective_now(declared_);
  std::string arr = "[";
  for (const Lease& l : leases) {
    supervisor::JsonObject o;
    o.add_raw("gpus", ids_json(l.gpus)).add("since_ms", l.since_ms);
    if (l.until_ms)
      o.add("until_ms", *l.until_ms).add("until", lease_time_text(*l.until_ms));
    else
      o.add_raw("until_ms", "null");
    if (!l.note.empty()) o.add("note", l.note);
    arr += (arr.size() > 1 ? "," : "") + o.str();
  }
  arr += "]";
  const auto pairs = [](const std::vector<std::pair<int, std::string>>& v) {
    std::string out = "[";
    for (const auto& [gpu, why] : v)
      out += (out.size() > 1 ? "," : "") +
             supervisor::JsonObject().add("gpu", gpu).add("why", why).str();
    return out + "]";
  };
  supervisor::JsonObject p;
  p.add_raw("declared_active", ids_json(set))
      .add("min_gpus", declared_.policy.min_gpus)
      .add_raw("leases", arr)
      .add_raw("excluded", pairs(e.excluded))
      .add_raw("kept", pairs(e.kept))
      .add_raw("scale", scale_status_.empty() ? "null" : scale_status_);
  if (leases_ && !leases_->error().empty()) p.add("leases_error", leases_->error());
  return p.str();
}

}  // namespace gpurun::control
