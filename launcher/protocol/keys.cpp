#include "gpurun/control/keys.hpp"

#include <charconv>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

namespace gpurun::control::keys {

std::string start(int64_t g) {
  return fmt::format("gpurun/gen/{}/start", g);
}
std::string joined(int64_t g, int rank) {
  return fmt::format("gpurun/gen/{}/joined/{}", g, rank);
}
std::string abort(int64_t g) {
  return fmt::format("gpurun/gen/{}/abort", g);
}
std::string report(int64_t g, int64_t n, int rank) {
  return fmt::format("gpurun/gen/{}/round/{}/report/{}", g, n, rank);
}
std::string decision(int64_t g, int64_t n) {
  return fmt::format("gpurun/gen/{}/round/{}/decision", g, n);
}
std::string timing(int64_t g, int gpu) {
  return fmt::format("gpurun/gen/{}/timing/{}", g, gpu);
}
std::string parked(int gpu, int64_t p) {
  return fmt::format("gpurun/slot/{}/parked/{}", gpu, p);
}
std::string wake(int gpu, int64_t p) {
  return fmt::format("gpurun/slot/{}/wake/{}", gpu, p);
}
std::string ready(int gpu, int64_t w) {
  return fmt::format("gpurun/slot/{}/ready/{}", gpu, w);
}
std::string admit(int gpu, int64_t w) {
  return fmt::format("gpurun/slot/{}/admit/{}", gpu, w);
}
std::string go(int gpu, int64_t w) {
  return fmt::format("gpurun/slot/{}/go/{}", gpu, w);
}
std::string program_error(int gpu, int64_t pid) {
  return fmt::format("gpurun/slot/{}/error/{}", gpu, pid);
}
std::string comm(int64_t g, std::string_view purpose) {
  return fmt::format("gpurun/gen/{}/comm/{}", g, purpose);
}
std::string static_comm(int64_t restart) {
  return fmt::format("gpurun/static/{}/comm/train", restart);
}
std::string arrived(std::string_view comm_prefix, int rank) {
  return fmt::format("{}/arrived/{}", comm_prefix, rank);
}
std::string slot_data(int64_t restart, int gpu, std::string_view name) {
  return fmt::format("gpurun/slotdata/{}/{}/{}", restart, gpu, name);
}

std::string energy_ask(int gpu, int64_t pid, int64_t n) {
  return fmt::format("gpurun/energy/{}/{}/{}", gpu, pid, n);
}
std::string energy_answer(int gpu, int64_t pid, int64_t n) {
  return fmt::format("gpurun/energy/{}/{}/{}/answer", gpu, pid, n);
}

std::string node_job() {
  return "gpurun/node/job";
}
std::string node_next() {
  return "gpurun/node/next";
}
std::string node_join(int node) {
  return fmt::format("gpurun/node/{}/join", node);
}
std::string node_answer(int node) {
  return fmt::format("gpurun/node/{}/answer", node);
}
std::string node_offer(int node) {
  return fmt::format("gpurun/node/{}/offer", node);
}
std::string node_leave(int node) {
  return fmt::format("gpurun/node/{}/leave", node);
}
std::string node_command(int node, int64_t n) {
  return fmt::format("gpurun/node/{}/cmd/{}", node, n);
}
std::string node_event(int node, int64_t n) {
  return fmt::format("gpurun/node/{}/event/{}", node, n);
}
std::string node_beat(int node) {
  return fmt::format("gpurun/node/{}/beat", node);
}
std::string sever(int64_t n) {
  return fmt::format("gpurun/sever/{}", n);
}
std::string sever_value(const Sever& s) {
  return fmt::format("{} {}", s.generation, s.address);
}
std::string node_live(int node) {
  return fmt::format("gpurun/live/node{}", node);
}
std::string node_lost(int node) {
  return fmt::format("gpurun/lost/node{}", node);
}

namespace {

// Consumes a non-negative decimal at the front of `s`; nullopt when there is none.
std::optional<int64_t> take_int(std::string_view& s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p == s.data() || v < 0) return std::nullopt;
  s.remove_prefix(static_cast<size_t>(p - s.data()));
  return v;
}

bool take(std::string_view& s, std::string_view lit) {
  if (s.substr(0, lit.size()) != lit) return false;
  s.remove_prefix(lit.size());
  return true;
}

// gpurun/slot/<gpu>/<what>/<n> -> (gpu, n). Either number may carry a sign, as the slot keys'
// reader always took them; nothing may follow <n>.
std::optional<std::pair<int, int64_t>> slot_key(std::string_view key, std::string_view what) {
  constexpr std::string_view kSlot = "gpurun/slot/";
  if (!take(key, kSlot)) return std::nullopt;
  int gpu = 0;
  auto [p, ec] = std::from_chars(key.data(), key.data() + key.size(), gpu);
  if (ec != std::errc{}) return std::nullopt;
  std::string_view rest(p, static_cast<size_t>(key.data() + key.size() - p));
  if (!take(rest, "/") || !take(rest, what) || !take(rest, "/")) return std::nullopt;
  int64_t n = 0;
  auto [p2, ec2] = std::from_chars(rest.data(), rest.data() + rest.size(), n);
  if (ec2 != std::errc{} || p2 != rest.data() + rest.size()) return std::nullopt;
  return std::make_pair(gpu, n);
}

std::optional<WorkerWrite> gen_write(std::string_view key, std::string_view value) {
  std::string_view s = key;
  if (!take(s, kGenPrefix)) return std::nullopt;
  const auto g = take_int(s);
  if (!g || !take(s, "/")) return std::nullopt;
  if (take(s, "joined/")) {
    const auto r = take_int(s);
    if (!r || !s.empty()) return std::nullopt;
    Joined j{*g, static_cast<int>(*r), -1};
    std::from_chars(value.data(), value.data() + value.size(), j.pid);
    return j;
  }
  if (take(s, "round/")) {
    const auto n = take_int(s);
    if (!n || !take(s, "/report/")) return std::nullopt;
    const auto r = take_int(s);
    if (!r || !s.empty()) return std::nullopt;
    Report rep = Report::from_json(value);
    if (rep.generation != *g || rep.round != *n || rep.rank != *r)
      throw ProtocolError(fmt::format("report under '{}' names generation {}, round {}, rank {}",
                                      key, rep.generation, rep.round, rep.rank));
    return Reported{std::move(rep)};
  }
  if (take(s, "timing/")) {
    int gpu = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), gpu);
    if (ec != std::errc{} || p != s.data() + s.size() || gpu < 0) return std::nullopt;
    return Timing{*g, gpu, std::string(value)};
  }
  return std::nullopt;
}

}  // namespace

std::optional<WorkerWrite> parse_worker_write(std::string_view key, std::string_view value) {
  if (auto w = gen_write(key, value)) return w;
  if (auto p = slot_key(key, "parked")) return Parked{p->first, p->second};
  if (auto r = slot_key(key, "ready")) return Ready{r->first, r->second};
  if (auto e = slot_key(key, "error")) return ProgramError{e->first, e->second, std::string(value)};
  return std::nullopt;
}

std::optional<NodeWrite> parse_node_write(std::string_view key) {
  std::string_view s = key;
  if (take(s, "gpurun/lost/node")) {
    const auto k = take_int(s);
    if (!k || *k < 1 || !s.empty()) return std::nullopt;
    return NodeWrite{NodeWrite::Kind::kLost, static_cast<int>(*k), -1};
  }
  if (!take(s, "gpurun/node/")) return std::nullopt;
  const auto k = take_int(s);
  if (!k || *k < 1 || !take(s, "/")) return std::nullopt;
  const int node = static_cast<int>(*k);
  if (s == "join") return NodeWrite{NodeWrite::Kind::kJoin, node, -1};
  if (s == "offer") return NodeWrite{NodeWrite::Kind::kOffer, node, -1};
  if (s == "leave") return NodeWrite{NodeWrite::Kind::kLeave, node, -1};
  if (s == "beat") return NodeWrite{NodeWrite::Kind::kBeat, node, -1};
  if (take(s, "event/")) {
    const auto n = take_int(s);
    if (!n || !s.empty()) return std::nullopt;
    return NodeWrite{NodeWrite::Kind::kEvent, node, *n};
  }
  return std::nullopt;
}

std::optional<Sever> parse_sever(std::string_view value) {
  std::string_view s = value;
  const auto g = take_int(s);
  if (!g || !take(s, " ") || s.empty() || s.find(' ') != std::string_view::npos)
    return std::nullopt;
  return Sever{*g, std::string(s)};
}

std::optional<EnergyAsk> parse_energy_ask(std::string_view key) {
  std::string_view s = key;
  if (!take(s, "gpurun/energy/")) return std::nullopt;
  const auto gpu = take_int(s);
  if (!gpu || !take(s, "/")) return std::nullopt;
  const auto pid = take_int(s);
  if (!pid || !take(s, "/")) return std::nullopt;
  const auto n = take_int(s);
  if (!n || !s.empty()) return std::nullopt;
  return EnergyAsk{static_cast<int>(*gpu), *pid, *n};
}

std::string key_of(const WorkerWrite& w) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Joined>)
          return joined(x.generation, x.rank);
        else if constexpr (std::is_same_v<T, Reported>)
          return report(x.report.generation, x.report.round, x.report.rank);
        else if constexpr (std::is_same_v<T, Parked>)
          return parked(x.gpu, x.park_generation);
        else if constexpr (std::is_same_v<T, Ready>)
          return ready(x.gpu, x.warm);
        else if constexpr (std::is_same_v<T, ProgramError>)
          return program_error(x.gpu, x.pid);
        else
          return timing(x.generation, x.gpu);
      },
      w);
}

}  // namespace gpurun::control::keys
