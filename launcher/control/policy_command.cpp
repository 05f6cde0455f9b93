// gpurun lend / reclaim / set. Reference: docs/sharing.md.
#include "control/policy_command.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "control/config.hpp"
#include "control/lease_keeper.hpp"
#include "control/policy.hpp"
#include "control/status.hpp"
#include "gpurun/control/decision.hpp"

namespace gpurun::control {

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

void err(const std::string& msg) {
  std::fprintf(stderr, "gpurun: error: %s\n", msg.c_str());
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// What a command needs from the run's status.json.
struct RunFacts {
  std::string run_dir;
  std::string config;     ///< config.toml path; empty: a plain run
  std::vector<int> gpus;  ///< every slot id
};

std::optional<RunFacts> run_facts(const RunChoice& choice, int& code) {
  std::string error;
  const std::optional<std::string> dir = choose_run_dir(choice, error, code);
  if (!dir) return err(error), std::nullopt;
  code = 1;
  const fs::path file = fs::path(*dir) / "status.json";
  boost::system::error_code ec;
  json::value root = json::parse(slurp(file), ec);
  if (ec || !root.is_object())
    return err(fmt::format("cannot read '{}' (has the job ended?)", file.string())), std::nullopt;
  const json::object& o = root.as_object();
  RunFacts f;
  f.run_dir = *dir;
  if (const json::value* c = o.if_contains("config"); c && c->is_string())
    f.config = std::string(c->as_string());
  if (const json::value* s = o.if_contains("slots"); s && s->is_array())
    for (const json::value& sv : s->as_array())
      if (sv.is_object() && sv.as_object().contains("gpu") && sv.as_object().at("gpu").is_int64())
        f.gpus.push_back(static_cast<int>(sv.as_object().at("gpu").as_int64()));
  if (f.config.empty())
    return err(fmt::format("the run in '{}' is not elastic (no --config): its GPU set cannot "
                           "change while it runs",
                           *dir)),
           std::nullopt;
  return f;
}

/// Parses the command's own flags (`flags`: name -> value slot) and the run flags; the rest
/// are positional. Returns false after printing a usage error.
bool parse_args(const std::vector<std::string>& args, std::string_view command,
                std::string_view usage, RunChoice& choice,
                std::vector<std::pair<std::string, std::optional<std::string>*>> flags,
                std::vector<std::string>& positional, bool& help) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    std::string error;
    if (a == "-h" || a == "--help") {
      help = true;
      std::printf("%.*s\n", static_cast<int>(usage.size()), usage.data());
      return true;
    }
    if (take_run_flag(args, i, choice, error)) {
      if (!error.empty()) return err(fmt::format("{} ({})", error, usage)), false;
      continue;
    }
    bool taken = false;
    for (auto& [name, slot] : flags) {
      if (a == name && i + 1 < args.size()) {
        *slot = args[++i];
        taken = true;
      } else if (a.rfind(name + "=", 0) == 0) {
        *slot = a.substr(name.size() + 1);
        taken = true;
      } else if (a == name) {
        return err(fmt::format("{} needs a value ({})", name, usage)), false;
      }
      if (taken) break;
    }
    if (taken) continue;
    if (a.rfind("--", 0) == 0 && a.size() > 2)
      return err(fmt::format("unknown argument '{}' for gpurun {} (see gpurun {} --help)", a,
                             command, command)),
             false;
    positional.push_back(a);
  }
  return true;
}

std::string ids_text(const std::vector<int>& ids) {
  return "[" + join_ids(ids, ", ") + "]";
}

}  // namespace

int lend_command(const std::vector<std::string>& args) {
  constexpr std::string_view kUsage =
      "usage: gpurun lend GPUS [--for DURATION] [--note TEXT] "
      "[--run-id ID | --pid PID | --run-dir DIR]\n"
      "  GPUS: ids as in active_gpus, e.g. 2,3 or 2-3; DURATION: 90s, 30m, 2h, 1d "
      "(default: until gpurun reclaim)";
  RunChoice choice;
  std::optional<std::string> for_text, note;
  std::vector<std::string> pos;
  bool help = false;
  if (!parse_args(args, "lend", kUsage, choice, {{"--for", &for_text}, {"--note", &note}}, pos,
                  help))
    return 2;
  if (help) return 0;
  if (pos.size() != 1) return err(fmt::format("lend takes one GPU list ({})", kUsage)), 2;
  int code = 1;
  const std::optional<RunFacts> run = run_facts(choice, code);
  if (!run) return code;
  Lease lease;
  try {
    lease.gpus = parse_gpu_list(pos[0], run->gpus, "GPU list");
    lease.since_ms = unix_now_ms();
    if (for_text) lease.until_ms = lease.since_ms + parse_duration_ms(*for_text, "--for");
  } catch (const LeaseError& e) {
    return err(fmt::format("{} ({})", e.what(), kUsage)), 2;
  }
  for (int g : lease.gpus)
    if (!has_id(run->gpus, g))
      return err(fmt::format("GPU {} is not one of this job's GPUs; allowed: {}", g,
                             join_ids(run->gpus, ", "))),
             2;
  if (note) lease.note = *note;
  try {
    update_leases(leases_path(run->run_dir), [&](std::vector<Lease> l) {
      l = drop_ended(l, lease.since_ms);
      l.push_back(lease);
      return l;
    });
  } catch (const LeaseError& e) {
    return err(e.what()), 1;
  }
  std::printf("gpurun: lent GPUs %s until %s: the job stops using them at its next boundary\n",
              ids_text(lease.gpus).c_str(),
              lease.until_ms ? lease_time_text(*lease.until_ms).c_str() : "gpurun reclaim");
  return 0;
}

int reclaim_command(const std::vector<std::string>& args) {
  constexpr std::string_view kUsage =
      "usage: gpurun reclaim [GPUS] [--run-id ID | --pid PID | --run-dir DIR]\n"
      "  ends the leases of GPUS now (every lease without GPUS)";
  RunChoice choice;
  std::vector<std::string> pos;
  bool help = false;
  if (!parse_args(args, "reclaim", kUsage, choice, {}, pos, help)) return 2;
  if (help) return 0;
  if (pos.size() > 1) return err(fmt::format("reclaim takes at most one GPU list ({})", kUsage)), 2;
  int code = 1;
  const std::optional<RunFacts> run = run_facts(choice, code);
  if (!run) return code;
  std::optional<std::vector<int>> which;
  try {
    if (!pos.empty()) which = parse_gpu_list(pos[0], run->gpus, "GPU list");
  } catch (const LeaseError& e) {
    return err(fmt::format("{} ({})", e.what(), kUsage)), 2;
  }
  std::vector<int> back;
  try {
    update_leases(leases_path(run->run_dir), [&](std::vector<Lease> l) {
      std::vector<Lease> out;
      for (Lease& lease : drop_ended(l, unix_now_ms())) {
        std::vector<int> keep;
        for (int g : lease.gpus) (which && !has_id(*which, g) ? keep : back).push_back(g);
        if (keep.empty()) continue;
        lease.gpus = keep;
        out.push_back(lease);
      }
      return out;
    });
  } catch (const LeaseError& e) {
    return err(e.what()), 1;
  }
  std::sort(back.begin(), back.end());
  back.erase(std::unique(back.begin(), back.end()), back.end());
  if (back.empty())
    std::printf("gpurun: no lease of %s runs: nothing to reclaim\n",
                which ? ids_text(*which).c_str() : "any GPU");
  else
    std::printf("gpurun: reclaimed GPUs %s: the job takes them back at its next boundary\n",
                ids_text(back).c_str());
  return 0;
}

std::string set_config_key(std::string_view config, std::string_view key, std::string_view value) {
  std::vector<std::string> lines;
  {
    std::string cur;
    for (char c : config) {
      if (c == '\n') {
        lines.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) lines.push_back(cur);
  }
  const auto trim = [](std::string_view s) {
    const size_t a = s.find_first_not_of(" \t");
    return a == std::string_view::npos ? std::string_view() : s.substr(a);
  };
  const auto is_header = [&](const std::string& l) { return trim(l).rfind('[', 0) == 0; };
  const auto names_key = [&](const std::string& l, std::string_view k) {
    const std::string_view t = trim(l);
    if (t.rfind(k, 0) != 0) return false;
    const std::string_view rest = trim(t.substr(k.size()));
    return !rest.empty() && rest[0] == '=';
  };
  const size_t dot = key.find('.');
  const std::string table = dot == std::string_view::npos ? "" : std::string(key.substr(0, dot));
  const std::string name = std::string(dot == std::string_view::npos ? key : key.substr(dot + 1));
  const std::string line = fmt::format("{} = {}", name, value);
  // The section's line range [begin, end): top level before the first header, or the table's.
  size_t begin = 0, end = lines.size();
  bool found_table = table.empty();
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!is_header(lines[i])) continue;
    if (table.empty()) {
      end = i;
      break;
    }
    if (found_table) {
      end = i;
      break;
    }
    std::string_view h = trim(lines[i]);
    h.remove_prefix(1);
    const size_t close = h.find(']');
    if (close != std::string_view::npos && trim(h.substr(0, close)) == table) {
      found_table = true;
      begin = i + 1;
    }
  }
  if (!found_table) {
    std::string out(config);
    if (!out.empty() && out.back() != '\n') out += '\n';
    return out + fmt::format("\n[{}]\n{}\n", table, line);
  }
  for (size_t i = begin; i < end; ++i) {
    if (!names_key(lines[i], name)) continue;
    // A multi-line array: its lines up to the closing bracket go with it.
    size_t last = i;
    if (lines[i].find('[') != std::string::npos && lines[i].find(']') == std::string::npos)
      while (last + 1 < end && lines[last].find(']') == std::string::npos) ++last;
    lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                lines.begin() + static_cast<std::ptrdiff_t>(last) + 1);
    lines[i] = line;
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    return out;
  }
  // Not there: top-level keys go just before the first header (after the comments at the top),
  // a table's right after its header.
  const size_t at = table.empty() ? end : begin;
  lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(at), line);
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

int set_command(const std::vector<std::string>& args) {
  constexpr std::string_view kUsage =
      "usage: gpurun set KEY=VALUE... [--config PATH | --run-id ID | --pid PID | --run-dir DIR]\n"
      "  e.g. gpurun set active_gpus=0-3   gpurun set park.mode=hold   (docs/config.md keys)";
  RunChoice choice;
  std::optional<std::string> config_flag;
  std::vector<std::string> pos;
  bool help = false;
  if (!parse_args(args, "set", kUsage, choice, {{"--config", &config_flag}}, pos, help)) return 2;
  if (help) return 0;
  if (pos.empty()) return err(fmt::format("set needs at least one KEY=VALUE ({})", kUsage)), 2;
  std::string path;
  std::vector<int> gpus;
  if (config_flag) {
    path = *config_flag;
  } else {
    int code = 1;
    const std::optional<RunFacts> run = run_facts(choice, code);
    if (!run) return code;
    path = run->config;
    gpus = run->gpus;
  }
  std::error_code ec;
  const fs::path target = fs::exists(path, ec) ? fs::canonical(path, ec) : fs::path(path);
  std::string text = slurp(target);
  for (const std::string& kv : pos) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return err(fmt::format("'{}' is not KEY=VALUE ({})", kv, kUsage)), 2;
    const std::string key = kv.substr(0, eq);
    std::string value = kv.substr(eq + 1);
    if (key == "active_gpus") {
      if (value.empty() || value == "[]" || value == "none") {
        value = "[]";
      } else if (value.front() != '[') {
        try {
          value = ids_text(parse_gpu_list(value, gpus, "active_gpus"));
        } catch (const LeaseError& e) {
          return err(e.what()), 2;
        }
      }
    } else if (key.find('.') == std::string::npos) {
      return err(fmt::format("'{}': a key under a table is written table.key, e.g. park.mode "
                             "(docs/config.md)",
                             key)),
             2;
    } else {
      // A TOML value as written (5, 1.5, true, "x", [..]); a bare word is taken as a string.
      const bool literal =
          !value.empty() && (value.front() == '"' || value.front() == '\'' ||
                             value.front() == '[' || value == "true" || value == "false" ||
                             value.find_first_not_of("0123456789.+-eE_") == std::string::npos);
      if (!literal) value = json::serialize(json::value(value));
    }
    text = set_config_key(text, key, value);
  }
  // The same rules and messages as a hand edit; with --config alone any id is taken.
  try {
    std::vector<int> ids = gpus;
    if (ids.empty())
      for (int i = 0; i < 4096; ++i) ids.push_back(i);
    parse_config(text, target.string(), ids);
  } catch (const ConfigError& e) {
    err(fmt::format("the change was not written; {} would say:\n{}", target.string(), e.what()));
    return 1;
  }
  const std::string tmp = fmt::format("{}.gpurun-set.{}", target.string(), ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) return ::unlink(tmp.c_str()), err(fmt::format("cannot write '{}'", tmp)), 1;
  }
  fs::permissions(tmp, fs::status(target, ec).permissions(), ec);
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return err(fmt::format("cannot replace '{}'", target.string())), 1;
  }
  std::string what;
  for (const std::string& kv : pos) what += (what.empty() ? "" : ", ") + kv;
  std::printf("gpurun: %s: %s (takes effect at the job's next boundary)\n", target.string().c_str(),
              what.c_str());
  return 0;
}

}  // namespace gpurun::control
