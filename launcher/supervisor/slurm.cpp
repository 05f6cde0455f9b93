#include "supervisor/slurm.hpp"

#include <algorithm>
#include <charconv>
#include <initializer_list>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "gpurun/error.hpp"
#include "supervisor/gpu_inventory.hpp"

namespace gpurun::supervisor {
namespace detail {
namespace {

/// One "[...]" item: lo..hi, each printed zero-padded to `width` digits.
struct HostRange {
  uint64_t lo = 0;
  uint64_t hi = 0;
  int width = 0;
};

/// A host name split at its bracket groups: text[0] group[0] text[1] ... group[n-1] text[n].
struct HostPattern {
  std::vector<std::string> text;
  std::vector<std::vector<HostRange>> groups;
};

[[noreturn]] void bad_hostlist(std::string_view expr, std::size_t pos, std::string_view what) {
  throw UsageError(fmt::format("invalid hostlist '{}' at position {}: {}", expr, pos + 1, what));
}

bool is_separator(char c) {
  return c == ',' || c == ' ' || c == '\t' || c == '\n';
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// The number `s` (digits only) that starts at `pos` of `expr`.
uint64_t range_number(std::string_view expr, std::string_view item, std::size_t pos,
                      std::string_view s) {
  if (s.empty()) bad_hostlist(expr, pos, fmt::format("empty range '{}'", item));
  if (!all_digits(s))
    bad_hostlist(
        expr, pos,
        fmt::format("non-numeric range '{}' (ranges are decimal numbers, e.g. 01-04)", item));
  uint64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size())
    bad_hostlist(expr, pos, fmt::format("number '{}' in range '{}' is too large", s, item));
  return v;
}

/// Parses the inside of one bracket group; `start` is the position of its first character.
std::vector<HostRange> parse_group(std::string_view expr, std::string_view body,
                                   std::size_t start) {
  std::vector<HostRange> out;
  if (body.empty()) bad_hostlist(expr, start - 1, "empty range '[]'");
  std::size_t from = 0;
  while (true) {
    const std::size_t comma = body.find(',', from);
    const std::string_view item =
        body.substr(from, comma == std::string_view::npos ? body.npos : comma - from);
    const std::size_t pos = start + from;
    if (item.empty())
      bad_hostlist(expr, pos, "empty item in '[...]' (two commas or a comma at an end)");
    const std::size_t dash = item.find('-');
    HostRange r;
    if (dash == std::string_view::npos) {
      r.lo = r.hi = range_number(expr, item, pos, item);
      r.width = static_cast<int>(item.size());
    } else {
      const std::string_view lo = item.substr(0, dash), hi = item.substr(dash + 1);
      r.lo = range_number(expr, item, pos, lo);
      r.hi = range_number(expr, item, pos + dash + 1, hi);
      r.width = static_cast<int>(lo.size());
      if (r.lo > r.hi)
        bad_hostlist(
            expr, pos,
            fmt::format("reversed range '{}' (write the low end first: {}-{})", item, hi, lo));
    }
    if (r.hi - r.lo >= kMaxHostlistHosts)
      bad_hostlist(expr, pos,
                   fmt::format("range '{}' names more than {} hosts", item, kMaxHostlistHosts));
    out.push_back(r);
    if (comma == std::string_view::npos) break;
    from = comma + 1;
  }
  return out;
}

/// Splits one host token (from `start` in `expr`) into text and bracket groups.
HostPattern parse_pattern(std::string_view expr, std::string_view token, std::size_t start) {
  HostPattern p;
  p.text.emplace_back();
  for (std::size_t i = 0; i < token.size(); ++i) {
    if (token[i] != '[') {
      p.text.back() += token[i];
      continue;
    }
    const std::size_t close = token.find(']', i + 1);  // the tokenizer saw it balanced
    p.groups.push_back(parse_group(expr, token.substr(i + 1, close - i - 1), start + i + 1));
    p.text.emplace_back();
    i = close;
  }
  return p;
}

/// Hosts a pattern expands to, capped at kMaxHostlistHosts + 1 (no overflow).
uint64_t pattern_count(const HostPattern& p) {
  uint64_t total = 1;
  for (const auto& group : p.groups) {
    uint64_t n = 0;
    for (const HostRange& r : group) n += r.hi - r.lo + 1;  // each <= kMaxHostlistHosts
    total = std::min<uint64_t>(total * std::min<uint64_t>(n, kMaxHostlistHosts + 1),
                               kMaxHostlistHosts + 1);
  }
  return total;
}

/// Appends the hosts of `p` to `out`, leftmost group slowest (Slurm's _push_range_list).
void expand_pattern(const HostPattern& p, std::size_t g, std::string& prefix,
                    std::vector<std::string>& out) {
  if (g == p.groups.size()) {
    out.push_back(prefix);
    return;
  }
  const std::size_t keep = prefix.size();
  for (const HostRange& r : p.groups[g]) {
    for (uint64_t v = r.lo;; ++v) {
      prefix.resize(keep);
      fmt::format_to(std::back_inserter(prefix), "{:0{}}{}", v, r.width, p.text[g + 1]);
      expand_pattern(p, g + 1, prefix, out);
      if (v == r.hi) break;
    }
  }
  prefix.resize(keep);
}

std::optional<std::pair<std::string, std::string>> first_of(
    const SlurmEnv::Map& env, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (auto it = env.find(name); it != env.end() && !it->second.empty())
      return std::make_pair(std::string(name), it->second);
  return std::nullopt;
}

std::string names_of(std::initializer_list<const char*> names) {
  std::string out;
  for (const char* n : names) out += (out.empty() ? "" : " / ") + std::string(n);
  return out;
}

[[noreturn]] void bad_var(std::string_view name, std::string_view value, std::string_view want) {
  throw UsageError(fmt::format("Slurm: {}='{}' is not {}", name, value, want));
}

/// A required variable (the first set of `names`), or a UsageError naming them all.
std::pair<std::string, std::string> required(const SlurmEnv::Map& env,
                                             std::initializer_list<const char*> names) {
  if (auto v = first_of(env, names)) return *v;
  throw UsageError(fmt::format(
      "Slurm: {} is not set; gpurun reads it when it runs as a task of a Slurm step (srun)",
      names_of(names)));
}

int int_var(std::string_view name, std::string_view value, int lo, std::string_view want) {
  int v = 0;
  const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || ec != std::errc{} || p != value.data() + value.size() || v < lo)
    bad_var(name, value, want);
  return v;
}

std::optional<int> optional_int(const SlurmEnv::Map& env, const char* name, int lo,
                                std::string_view want) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return int_var(name, it->second, lo, want);
}

/// True when a SLURM_STEP_TASKS_PER_NODE value ("1(x4)", "2,1(x3)") gives every node 1 task.
bool one_task_each(std::string_view value) {
  std::size_t from = 0;
  while (from <= value.size()) {
    std::size_t comma = value.find(',', from);
    if (comma == std::string_view::npos) comma = value.size();
    std::string_view piece = value.substr(from, comma - from);
    if (const auto paren = piece.find('('); paren != std::string_view::npos)
      piece = piece.substr(0, paren);
    if (piece != "1") return false;
    from = comma + 1;
  }
  return true;
}

[[noreturn]] void not_one_per_node(std::string_view what) {
  throw UsageError(fmt::format(
      "Slurm: {}, but gpurun must run as one task per node and starts the workers itself: "
      "srun --ntasks-per-node=1 gpurun ... (--nproc sets the workers per node)",
      what));
}

}  // namespace
}  // namespace detail

std::vector<std::string> expand_hostlist(std::string_view expr) {
  using detail::bad_hostlist;
  // Tokens: split at separators outside brackets; brackets balanced, never nested.
  std::vector<std::pair<std::size_t, std::size_t>> tokens;  // [begin, end)
  std::size_t open = std::string_view::npos, begin = std::string_view::npos;
  for (std::size_t i = 0; i <= expr.size(); ++i) {
    const char c = i < expr.size() ? expr[i] : '\0';
    if (c == '[') {
      if (open != std::string_view::npos)
        bad_hostlist(
            expr, i,
            fmt::format("nested '[' (brackets do not nest; the '[' at position {} is open)",
                        open + 1));
      open = i;
    } else if (c == ']') {
      if (open == std::string_view::npos) bad_hostlist(expr, i, "']' without a '['");
      open = std::string_view::npos;
    } else if (i == expr.size() && open != std::string_view::npos) {
      bad_hostlist(expr, open, "'[' never closed");
    }
    const bool ends =
        i == expr.size() || (open == std::string_view::npos && detail::is_separator(c));
    if (ends) {
      if (begin != std::string_view::npos) tokens.emplace_back(begin, i);
      begin = std::string_view::npos;
    } else if (begin == std::string_view::npos) {
      begin = i;
    }
  }
  if (tokens.empty())
    throw UsageError(fmt::format("invalid hostlist '{}': it names no host", expr));

  std::vector<detail::HostPattern> patterns;
  uint64_t total = 0;
  for (const auto& [b, e] : tokens) {
    patterns.push_back(detail::parse_pattern(expr, expr.substr(b, e - b), b));
    total += detail::pattern_count(patterns.back());
    if (total > kMaxHostlistHosts)
      throw UsageError(fmt::format(
          "invalid hostlist '{}': more than {} hosts (the host at position {} passes the limit)",
          expr, kMaxHostlistHosts, b + 1));
  }
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<std::size_t>(total));
  for (const auto& p : patterns) {
    std::string prefix = p.text[0];
    detail::expand_pattern(p, 0, prefix, hosts);
  }
  return hosts;
}

bool SlurmEnv::detect(const Map& env) {
  return detail::first_of(env, {"SLURM_JOB_ID", "SLURM_JOBID"}) &&
         detail::first_of(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
}

SlurmEnv SlurmEnv::parse(const Map& env) {
  SlurmEnv s;
  const auto [job_var, job] = detail::required(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  uint64_t number = 0;
  const auto [p, ec] = std::from_chars(job.data(), job.data() + job.size(), number);
  if (!detail::all_digits(job) || ec != std::errc{} || p != job.data() + job.size())
    detail::bad_var(job_var, job, "a job id (decimal digits)");
  s.job_id = job;
  s.job_number = number;
  s.step_id = detail::required(env, {"SLURM_STEP_ID", "SLURM_STEPID"}).second;

  const auto [nn_var, nn] =
      detail::required(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
  s.nnodes = detail::int_var(nn_var, nn, 1, "a positive node count");
  s.nnodes_var = nn_var;
  const auto [id_var, id] = detail::required(env, {"SLURM_NODEID"});
  s.node_id = detail::int_var(id_var, id, 0, "a node index (a non-negative integer)");
  const auto [list_var, list] =
      detail::required(env, {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"});
  s.nodelist = list;
  s.nodelist_var = list_var;
  try {
    s.nodes = expand_hostlist(list);
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("Slurm: {}: {}", list_var, e.what()));
  }
  if (static_cast<int>(s.nodes.size()) != s.nnodes)
    throw UsageError(fmt::format("Slurm: {}='{}' names {} host{}, but {}={}", list_var, list,
                                 s.nodes.size(), s.nodes.size() == 1 ? "" : "s", nn_var, nn));
  if (s.node_id >= s.nnodes)
    throw UsageError(
        fmt::format("Slurm: SLURM_NODEID={} is not below {}={}", s.node_id, nn_var, s.nnodes));

  s.ntasks = detail::optional_int(env, "SLURM_NTASKS", 1, "a positive task count");
  s.ntasks_per_node =
      detail::optional_int(env, "SLURM_NTASKS_PER_NODE", 1, "a positive task count");
  s.local_id = detail::optional_int(env, "SLURM_LOCALID", 0, "a non-negative task index");
  if (auto it = env.find("SLURM_STEP_TASKS_PER_NODE"); it != env.end())
    s.step_tasks_per_node = it->second;

  if (auto it = env.find("CUDA_VISIBLE_DEVICES"); it != env.end()) {
    s.gpus = static_cast<int>(parse_visible_devices(it->second).size());
    s.gpus_var = "CUDA_VISIBLE_DEVICES";
  } else if (auto step = env.find("SLURM_STEP_GPUS"); step != env.end()) {
    s.gpus = static_cast<int>(parse_visible_devices(step->second).size());
    s.gpus_var = "SLURM_STEP_GPUS";
  } else if (auto on_node = env.find("SLURM_GPUS_ON_NODE"); on_node != env.end()) {
    s.gpus = detail::int_var("SLURM_GPUS_ON_NODE", on_node->second, 0,
                             "a GPU count (a non-negative integer)");
    s.gpus_var = "SLURM_GPUS_ON_NODE";
  }
  return s;
}

uint16_t slurm_master_port(uint64_t job_number) {
  return static_cast<uint16_t>(20000 + job_number % 10000);
}

void apply_slurm(Options& o, const SlurmEnv& s) {
  if (o.standalone)
    throw UsageError(fmt::format(
        "--standalone runs one node on a free port and cannot be combined with Slurm (job {} "
        "step {}, {} node{}); drop --standalone, or pass --no-slurm",
        s.job_id, s.step_id, s.nnodes, s.nnodes == 1 ? "" : "s"));
  if (s.local_id && *s.local_id != 0)
    detail::not_one_per_node(
        fmt::format("SLURM_LOCALID={}: this is not the node's first task", *s.local_id));
  if (s.ntasks_per_node && *s.ntasks_per_node != 1)
    detail::not_one_per_node(fmt::format("SLURM_NTASKS_PER_NODE={} asks for several tasks per node",
                                         *s.ntasks_per_node));
  if (s.step_tasks_per_node && !detail::one_task_each(*s.step_tasks_per_node))
    detail::not_one_per_node(fmt::format(
        "SLURM_STEP_TASKS_PER_NODE='{}' gives a node more than one task", *s.step_tasks_per_node));
  if (s.ntasks && *s.ntasks != s.nnodes)
    detail::not_one_per_node(
        fmt::format("SLURM_NTASKS={} tasks run on {}={} nodes", *s.ntasks, s.nnodes_var, s.nnodes));
  // An elastic job (--config) with --nnodes MIN:MAX: Slurm's count is where it starts, MAX the
  // most nodes it may have; later allocations' gpurun join it
  // (docs/cli.md#an-elastic-job-over-several-nodes-under-slurm).
  const bool elastic_range = o.config && o.nnodes_given && o.nnodes != o.nnodes_max;
  if (elastic_range && (s.nnodes < o.nnodes || s.nnodes > o.nnodes_max))
    throw UsageError(fmt::format(
        "--nnodes {}:{} does not hold Slurm's {}={}; ask Slurm for {} to {} nodes or give a "
        "range that holds {}",
        o.nnodes, o.nnodes_max, s.nnodes_var, s.nnodes, o.nnodes, o.nnodes_max, s.nnodes));
  if (o.nnodes_given && o.nnodes != s.nnodes && !elastic_range)
    throw UsageError(fmt::format(
        "--nnodes {} disagrees with Slurm's {}={}; drop --nnodes (Slurm sets it) or pass "
        "--no-slurm",
        o.nnodes, s.nnodes_var, s.nnodes));
  if (o.node_rank_given && o.node_rank != s.node_id)
    throw UsageError(fmt::format(
        "--node-rank {} disagrees with Slurm's SLURM_NODEID={}; drop --node-rank (Slurm sets it) "
        "or pass --no-slurm",
        o.node_rank, s.node_id));
  // No --rdzv-id: the job id, as torchrun users pass it (--rdzv-id $SLURM_JOB_ID), never
  // torchrun's "none". Not "given": a node joining from another allocation still joins the
  // job of the allocation it names and takes that job's id (elastic-join.sbatch).
  if (!o.run_id_given) o.run_id = s.job_id;
  o.nnodes = s.nnodes;
  if (!o.nnodes_given) o.nnodes_max = s.nnodes;  // no range given: Slurm's count is the most
  o.node_rank = s.node_id;
  if (!o.master_addr_given) o.master_addr = s.nodes.front();
  if (!o.master_port_given) o.master_port = slurm_master_port(s.job_number);
  if (o.master_port == 0 && o.nnodes > 1 && o.node_rank > 0)
    throw UsageError(fmt::format(
        "--master-port 0 cannot be used with Slurm's {} nodes: node {} cannot learn the port "
        "node 0 bound; drop --master-port (gpurun derives one from the job id) or give a number",
        s.nnodes, o.node_rank));
  if (!o.nproc_given && o.device == Device::kCuda && s.gpus && *s.gpus > 0) {
    o.nproc_mode = NprocMode::kCount;
    o.nproc = *s.gpus;
  }
}

std::string slurm_banner(const Options& o, const SlurmEnv& s) {
  std::string line = fmt::format("Slurm job {} step {}: node {} of {}, master {}:{}", s.job_id,
                                 s.step_id, o.node_rank, s.nnodes, o.master_addr, o.master_port);
  if (o.config && o.nnodes_max > s.nnodes)
    line += fmt::format("; an elastic job of up to {} nodes (--nnodes)", o.nnodes_max);
  if (!o.nproc_given && o.device == Device::kCuda && s.gpus && *s.gpus > 0)
    line += fmt::format("; --nproc {} from {}", o.nproc, s.gpus_var);
  return line;
}

std::optional<std::string> use_slurm(Options& o, const SlurmEnv::Map& env) {
  if (o.slurm == SlurmMode::kOff) return std::nullopt;
  const bool inside = SlurmEnv::detect(env);
  if (o.slurm == SlurmMode::kOn) {
    if (!inside)
      throw UsageError(
          "--slurm: not inside a Slurm step (SLURM_JOB_ID and SLURM_STEP_ID must both be set); "
          "start gpurun with srun, one task per node: srun --ntasks-per-node=1 gpurun ...");
    SlurmEnv s = SlurmEnv::parse(env);
    apply_slurm(o, s);
    return slurm_banner(o, s);
  }
  if (!inside) return std::nullopt;
  std::vector<std::string> given;
  if (o.nnodes_given) given.emplace_back("--nnodes");
  if (o.node_rank_given) given.emplace_back("--node-rank");
  if (o.standalone) given.emplace_back("--standalone");
  if (!given.empty()) {
    const auto job = detail::first_of(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
    const auto step = detail::first_of(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
    return fmt::format(
        "Slurm job {} step {} detected but not used: {} given (pass --slurm to check {} against "
        "Slurm's, --no-slurm to silence this)",
        job->second, step->second, fmt::join(given, ", "), given.size() == 1 ? "it" : "them");
  }
  try {
    SlurmEnv s = SlurmEnv::parse(env);
    apply_slurm(o, s);
    return slurm_banner(o, s);
  } catch (const UsageError& e) {
    throw UsageError(fmt::format(
        "{} (gpurun found a Slurm step and reads it by default; --no-slurm ignores it)", e.what()));
  }
}

const std::vector<std::string>& slurm_vars_for_workers() {
  static const std::vector<std::string> kept = {
      "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_CLUSTER_NAME", "SLURM_CONF",
      "SLURM_JOB_ID",       "SLURM_JOB_NAME",      "SLURM_SUBMIT_DIR",
  };
  return kept;
}

void remove_slurm_task_vars(std::map<std::string, std::string>& env) {
  const auto& kept = slurm_vars_for_workers();
  for (auto it = env.lower_bound("SLURM_"); it != env.end() && it->first.rfind("SLURM_", 0) == 0;) {
    if (std::binary_search(kept.begin(), kept.end(), it->first))
      ++it;
    else
      it = env.erase(it);
  }
}

}  // namespace gpurun::supervisor
