// gpurun lend / reclaim / set. Reference: docs/sharing.md.
#include "commands/policy_command.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>
#include <boost/json.hpp>

#include "commands/status_command.hpp"
#include "control/config.hpp"
#include "control/lease_keeper.hpp"
#include "control/policy.hpp"
#include "control/status.hpp"
#include "gpurun/control/decision.hpp"
#include "gpurun/regular_file.hpp"
#include "gpurun/unique_fd.hpp"

namespace gpurun::commands {

using namespace gpurun::control;  // the config, leases and policy these commands edit

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

/// Rounds of "the file changed under us: read it again" before `gpurun set` gives up.
constexpr int kSetAttempts = 5;

/// What a command needs from the run's status.json.
struct RunFacts {
  std::string run_dir;
  std::string config;     ///< config.toml path; empty: a plain run
  std::vector<int> gpus;  ///< every slot id
  // status.json's policy: the declared set, min_gpus, and the GPUs other policies keep out
  // (yields, scale): what a new lease does, said by the command.
  std::vector<int> declared;
  std::vector<int> current;  ///< the set the job trains on now (current_active)
  int min_gpus = 0;
  std::vector<std::pair<int, std::string>> others_out;

  /// The set the job will train on with `leases` in force at `now_ms`.
  EffectiveSet effective(const std::vector<Lease>& leases, int64_t now_ms) const {
    return effective_set(declared, leases, now_ms, min_gpus, &lease_time_text, others_out, current);
  }
};

std::optional<RunFacts> run_facts(const RunChoice& choice, int& code) {
  std::string error;
  const std::optional<std::string> dir = choose_run_dir(choice, error, code);
  if (!dir) return command_error(error), std::nullopt;
  code = 1;
  const fs::path file = fs::path(*dir) / "status.json";
  std::optional<FileContent> text;
  try {
    text = read_regular_file_if_exists(file, kDefaultMaxFileBytes, "the run's status");
  } catch (const FileError& e) {
    return command_error(e.what()), std::nullopt;
  }
  boost::system::error_code ec;
  json::value root = json::parse(text ? std::string_view(text->bytes) : std::string_view(), ec);
  if (ec || !root.is_object())
    return command_error(fmt::format("cannot read '{}' (has the job ended?)", file.string())),
           std::nullopt;
  const json::object& o = root.as_object();
  RunFacts f;
  f.run_dir = *dir;
  if (const json::value* c = o.if_contains("config"); c && c->is_string())
    f.config = std::string(c->as_string());
  if (const json::value* s = o.if_contains("slots"); s && s->is_array())
    for (const json::value& sv : s->as_array())
      if (sv.is_object() && sv.as_object().contains("gpu") && sv.as_object().at("gpu").is_int64())
        f.gpus.push_back(static_cast<int>(sv.as_object().at("gpu").as_int64()));
  f.declared = f.gpus;
  if (const json::value* c = o.if_contains("current_active"); c && c->is_array())
    for (const json::value& g : c->as_array())
      if (g.is_int64()) f.current.push_back(static_cast<int>(g.as_int64()));
  std::sort(f.current.begin(), f.current.end());
  if (const json::value* p = o.if_contains("policy"); p && p->is_object()) {
    const json::object& po = p->as_object();
    if (const json::value* d = po.if_contains("declared_active"); d && d->is_array()) {
      f.declared.clear();
      for (const json::value& g : d->as_array())
        if (g.is_int64()) f.declared.push_back(static_cast<int>(g.as_int64()));
    }
    if (const json::value* m = po.if_contains("min_gpus"); m && m->is_int64())
      f.min_gpus = static_cast<int>(m->as_int64());
    for (const char* list : {"excluded", "kept"})
      if (const json::value* x = po.if_contains(list); x && x->is_array())
        for (const json::value& e : x->as_array()) {
          if (!e.is_object()) continue;
          const json::value* g = e.as_object().if_contains("gpu");
          const json::value* w = e.as_object().if_contains("why");
          if (!g || !g->is_int64() || !w || !w->is_string()) continue;
          std::string why(w->as_string());
          if (const size_t k = why.find(", kept: [policy]"); k != std::string::npos)
            why.resize(k);                // the floor is applied again below
          if (why.rfind("lent", 0) != 0)  // a lease's is recomputed with the new leases
            f.others_out.emplace_back(static_cast<int>(g->as_int64()), why);
        }
  }
  if (f.config.empty())
    return command_error(
               fmt::format("the run in '{}' is not elastic (no --config): its GPU set cannot "
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
      if (!error.empty()) return command_error(fmt::format("{} ({})", error, usage)), false;
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
        return command_error(fmt::format("{} needs a value ({})", name, usage)), false;
      }
      if (taken) break;
    }
    if (taken) continue;
    if (a.rfind("--", 0) == 0 && a.size() > 2)
      return command_error(fmt::format("unknown argument '{}' for gpurun {} (see gpurun {} --help)",
                                       a, command, command)),
             false;
    positional.push_back(a);
  }
  return true;
}

}  // namespace

int lend_command(const std::vector<std::string>& args, const ReplaceHook& hook) {
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
  if (pos.size() != 1) return command_error(fmt::format("lend takes one GPU list ({})", kUsage)), 2;
  int code = 1;
  const std::optional<RunFacts> run = run_facts(choice, code);
  if (!run) return code;
  Lease lease;
  try {
    lease.gpus = parse_gpu_list(pos[0], run->gpus, "GPU list");
    lease.since_ms = unix_now_ms();
    if (for_text) lease.until_ms = lease.since_ms + parse_duration_ms(*for_text, "--for");
  } catch (const LeaseError& e) {
    return command_error(fmt::format("{} ({})", e.what(), kUsage)), 2;
  }
  for (int g : lease.gpus)
    if (!has_id(run->gpus, g))
      return command_error(fmt::format("GPU {} is not one of this job's GPUs; allowed: {}", g,
                                       join_ids(run->gpus, ", "))),
             2;
  if (note) lease.note = *note;
  std::vector<Lease> now_lent;
  try {
    now_lent = update_leases(
        leases_path(run->run_dir),
        [&](std::vector<Lease> l) {
          l = drop_ended(l, lease.since_ms);
          l.push_back(lease);
          return l;
        },
        hook);
  } catch (const LeaseError& e) {
    return command_error(e.what()), 1;
  }
  const EffectiveSet e = run->effective(now_lent, lease.since_ms);
  std::printf("gpurun: lent GPUs %s until %s: %s\n", ids_text(lease.gpus).c_str(),
              lease.until_ms ? lease_time_text(*lease.until_ms).c_str() : "gpurun reclaim",
              lend_effect(lease.gpus, run->current, e, run->min_gpus).c_str());
  return 0;
}

int reclaim_command(const std::vector<std::string>& args, const ReplaceHook& hook) {
  constexpr std::string_view kUsage =
      "usage: gpurun reclaim [GPUS] [--run-id ID | --pid PID | --run-dir DIR]\n"
      "  ends the leases of GPUS now (every lease without GPUS)";
  RunChoice choice;
  std::vector<std::string> pos;
  bool help = false;
  if (!parse_args(args, "reclaim", kUsage, choice, {}, pos, help)) return 2;
  if (help) return 0;
  if (pos.size() > 1)
    return command_error(fmt::format("reclaim takes at most one GPU list ({})", kUsage)), 2;
  int code = 1;
  const std::optional<RunFacts> run = run_facts(choice, code);
  if (!run) return code;
  std::optional<std::vector<int>> which;
  try {
    if (!pos.empty()) which = parse_gpu_list(pos[0], run->gpus, "GPU list");
  } catch (const LeaseError& e) {
    return command_error(fmt::format("{} ({})", e.what(), kUsage)), 2;
  }
  if (which)  // as lend: a GPU the job does not have is a typo, not "nothing to reclaim"
    for (int g : *which)
      if (!has_id(run->gpus, g))
        return command_error(fmt::format("GPU {} is not one of this job's GPUs; allowed: {}", g,
                                         join_ids(run->gpus, ", "))),
               2;
  std::vector<int> back;
  std::vector<Lease> left;
  const int64_t now_ms = unix_now_ms();
  try {
    left = update_leases(
        leases_path(run->run_dir),
        [&](std::vector<Lease> l) {
          back.clear();  // runs again when the file changed under it
          std::vector<Lease> out;
          for (Lease& lease : drop_ended(l, now_ms)) {
            std::vector<int> keep;
            for (int g : lease.gpus) (which && !has_id(*which, g) ? keep : back).push_back(g);
            if (keep.empty()) continue;
            lease.gpus = keep;
            out.push_back(lease);
          }
          return out;
        },
        hook);
  } catch (const LeaseError& e) {
    return command_error(e.what()), 1;
  }
  std::sort(back.begin(), back.end());
  back.erase(std::unique(back.begin(), back.end()), back.end());
  if (back.empty())
    std::printf("gpurun: no lease of %s runs: nothing to reclaim\n",
                which ? ids_text(*which).c_str() : "any GPU");
  else
    std::printf(
        "gpurun: reclaimed GPUs %s: %s\n", ids_text(back).c_str(),
        reclaim_effect(back, run->declared, run->current, run->effective(left, now_ms)).c_str());
  return 0;
}

namespace {

/// Byte offset of TOML position (line, column), both 1-based, columns in code points.
size_t offset_of(std::string_view text, uint32_t line, uint32_t column) {
  size_t i = 0;
  for (uint32_t l = 1; l < line && i < text.size(); ++i)
    if (text[i] == '\n') ++l;
  for (uint32_t c = 1; c < column && i < text.size(); ++c) {
    ++i;
    while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) ++i;
  }
  return i;
}

std::string_view trimmed(std::string_view s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string_view::npos) return {};
  const size_t b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}

/// "[ park ]" -> "park"; "" for a line that is no table header.
std::string header_name(std::string_view line) {
  std::string_view t = trimmed(line);
  if (t.size() < 2 || t[0] != '[' || t[1] == '[') return {};
  const size_t close = t.find(']');
  if (close == std::string_view::npos) return {};
  return std::string(trimmed(t.substr(1, close - 1)));
}

}  // namespace

std::string set_config_key(std::string_view config, std::string_view key, std::string_view value) {
  toml::table root;
  try {
    root = toml::parse(config);
  } catch (const toml::parse_error& e) {
    throw ConfigError(
        fmt::format("the file is not valid TOML now ({}); fix it by hand first", e.description()));
  }
  const size_t dot = key.find('.');
  const std::string table = dot == std::string_view::npos ? "" : std::string(key.substr(0, dot));
  const std::string name = std::string(dot == std::string_view::npos ? key : key.substr(dot + 1));
  const toml::node* node = table.empty() ? root.get(name) : nullptr;
  const toml::table* t = table.empty() ? &root : root.get_as<toml::table>(table);
  if (!table.empty() && root.get(table) && !t)
    throw ConfigError(fmt::format("'{}' is not a table in the file; edit it by hand", table));
  if (t && !table.empty()) node = t->get(name);
  std::string out(config);
  if (node != nullptr) {
    // The value's own characters are replaced: the key as written (dotted, quoted, in an
    // inline table) and any comment after it stay.
    const toml::source_region& r = node->source();
    if (r.begin.line == 0 || r.end.line == 0)
      throw ConfigError(fmt::format("cannot tell where '{}' is in the file; edit it by hand", key));
    const size_t b = offset_of(config, r.begin.line, r.begin.column);
    const size_t e = offset_of(config, r.end.line, r.end.column);
    return out.replace(b, e - b, value);
  }
  // Missing: a line of its own. Top-level keys before the first table header; a table's key
  // right after its [header]; a missing table at the end.
  std::vector<std::string_view> lines;
  for (size_t start = 0; start < config.size();) {
    const size_t nl = config.find('\n', start);
    lines.push_back(config.substr(start, nl == std::string_view::npos ? nl : nl - start));
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  const auto insert_at = [&](size_t line_index) {
    size_t off = 0;
    for (size_t i = 0; i < line_index && i < lines.size(); ++i) off += lines[i].size() + 1;
    if (off > out.size()) {  // after a last line without its newline
      out += '\n';
      off = out.size();
    }
    out.insert(off, fmt::format("{} = {}\n", name, value));
    return out;
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string h = header_name(lines[i]);
    if (table.empty() && !h.empty()) return insert_at(i);
    if (!table.empty() && h == table) return insert_at(i + 1);
  }
  if (table.empty()) return insert_at(lines.size());
  if (t != nullptr)
    throw ConfigError(
        fmt::format("[{}] is written as an inline table or with dotted keys; add "
                    "'{}' to it by hand",
                    table, name));
  if (!out.empty() && out.back() != '\n') out += '\n';
  return out + fmt::format("\n[{}]\n{} = {}\n", table, name, value);
}

namespace {
/// The TOML text `gpurun set KEY=VALUE` writes for `value`: active_gpus as an id list (from
/// the job's `gpus`), a value as written, a bare word as a string. nullopt after saying why
/// (exit status 2).
std::optional<std::string> set_value_text(const std::string& key, std::string value,
                                          const std::vector<int>& gpus) {
  if (key == "active_gpus") {
    if (value.empty() || value == "[]" || value == "none") {
      value = "[]";
    } else if (value == "all" && gpus.empty()) {
      return command_error(
                 "active_gpus=all needs the running job's GPUs: name them (e.g. 0-3), or "
                 "give the job (--run-id, --pid, --run-dir) instead of --config"),
             std::nullopt;
    } else if (value.front() != '[') {
      try {
        value = ids_text(parse_gpu_list(value, gpus, "active_gpus"));
      } catch (const LeaseError& e) {
        return command_error(e.what()), std::nullopt;
      }
    }
  } else if (key.find('.') == std::string::npos) {
    return command_error(
               fmt::format("'{}': a key under a table is written table.key, e.g. park.mode "
                           "(docs/config.md)",
                           key)),
           std::nullopt;
  } else {
    // A TOML value as written (5, 1.5, true, "x", [..]); a bare word is taken as a string.
    const bool literal =
        !value.empty() &&
        (value.front() == '"' || value.front() == '\'' || value.front() == '[' || value == "true" ||
         value == "false" || value.find_first_not_of("0123456789.+-eE_") == std::string::npos);
    if (!literal) value = json::serialize(json::value(value));
  }
  return value;
}
}  // namespace

int set_command(const std::vector<std::string>& args, const ReplaceHook& hook) {
  constexpr std::string_view kUsage =
      "usage: gpurun set KEY=VALUE... [--config PATH | --run-id ID | --pid PID | --run-dir DIR]\n"
      "  e.g. gpurun set active_gpus=0-3   gpurun set park.mode=hold   (docs/config.md keys)";
  RunChoice choice;
  std::optional<std::string> config_flag;
  std::vector<std::string> pos;
  bool help = false;
  if (!parse_args(args, "set", kUsage, choice, {{"--config", &config_flag}}, pos, help)) return 2;
  if (help) return 0;
  if (pos.empty())
    return command_error(fmt::format("set needs at least one KEY=VALUE ({})", kUsage)), 2;
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
  // The checks and messages of every reader (docs/errors.md, "Files gpurun reads"): a FIFO,
  // a device, a directory, a symlink loop, a file over the bound, each named.
  try {
    if (!read_regular_file_if_exists(path, kMaxConfigBytes, "the config file"))
      return command_error(fmt::format("cannot read the config file {}: it does not exist; "
                                       "gpurun set changes an existing config file",
                                       path)),
             1;
  } catch (const FileError& e) {
    return command_error(e.what()), 1;
  }
  std::error_code ec;
  const fs::path target = fs::canonical(path, ec);
  if (ec)
    return command_error(fmt::format("cannot read the config file {}: {}", path, ec.message())), 1;
  // Read-only by its mode: refused even for root (whom access() lets write anything).
  if ((fs::status(target, ec).permissions() & (fs::perms::owner_write | fs::perms::group_write |
                                               fs::perms::others_write)) == fs::perms::none)
    return command_error(
               fmt::format("'{}' is read-only (no write permission in its mode): not changed",
                           target.string())),
           1;
  if (::access(target.c_str(), R_OK | W_OK) != 0)
    return command_error(fmt::format("'{}' cannot be {}: {}", target.string(),
                                     ::access(target.c_str(), R_OK) != 0 ? "read" : "written",
                                     std::strerror(errno))),
           1;
  // One `gpurun set` at a time per directory (flock on it): no concurrent one loses a change.
  const UniqueFd dir_lock(::open(target.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_lock || ::flock(dir_lock.get(), LOCK_EX) != 0)
    return command_error(fmt::format("cannot lock the directory of '{}': {}", target.string(),
                                     std::strerror(errno))),
           1;
  const std::vector<int> any_ids = [&] {
    std::vector<int> ids = gpus;
    if (ids.empty())  // --config alone: any id is taken
      for (int i = 0; i < 4096; ++i) ids.push_back(i);
    return ids;
  }();
  const auto mode = static_cast<mode_t>(fs::status(target, ec).permissions());
  // Read, change, check, and replace only if the file still holds what was read: a hand edit
  // (or an editor's save) between the read and the rename is read again, never overwritten.
  for (int attempt = 1;; ++attempt) {
    std::optional<FileContent> before;
    try {
      before = read_regular_file(target, kMaxConfigBytes, "the config file");
    } catch (const FileError& e) {
      return command_error(e.what()), 1;
    }
    std::string text = before->bytes;
    std::vector<std::string> warned_before;
    try {
      warned_before = parse_config(text, target.string(), any_ids).warnings;
    } catch (const ConfigError&) {
      // A file with an error now: the change may fix it; the check below says.
    }
    for (const std::string& kv : pos) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0)
        return command_error(fmt::format("'{}' is not KEY=VALUE ({})", kv, kUsage)), 2;
      const std::string key = kv.substr(0, eq);
      const std::optional<std::string> toml = set_value_text(key, kv.substr(eq + 1), gpus);
      if (!toml) return 2;
      const std::string& value = *toml;
      try {
        text = set_config_key(text, key, value);
      } catch (const ConfigError& e) {
        return command_error(fmt::format("{}: {}: {}", target.string(), key, e.what())), 1;
      }
    }
    // The same rules and messages as a hand edit; a key the file would only warn about (an
    // unknown one, a misspelling) is refused as well: set writes keys that take effect.
    try {
      const Config c = parse_config(text, target.string(), any_ids);
      for (const std::string& w : c.warnings)
        if (std::find(warned_before.begin(), warned_before.end(), w) == warned_before.end())
          return command_error(fmt::format("the change was not written; {} would warn: {}",
                                           target.string(), w)),
                 2;
    } catch (const ConfigError& e) {
      command_error(
          fmt::format("the change was not written; {} would say:\n{}", target.string(), e.what()));
      return 1;
    }
    try {
      if (replace_file_if_unchanged(target, before, text, mode, hook)) break;
    } catch (const FileError& e) {
      return command_error(e.what()), 1;
    }
    if (attempt == kSetAttempts)
      return command_error(
                 fmt::format("'{}' changed {} times while gpurun set rewrote it (a hand edit or "
                             "another program): the change was not written; try again",
                             target.string(), kSetAttempts)),
             1;
  }
  std::string what;
  bool at_start = false;  // [energy] and [notify] are read when the job starts
  for (const std::string& kv : pos) {
    what += (what.empty() ? "" : ", ") + kv;
    at_start = at_start || kv.rfind("energy.", 0) == 0 || kv.rfind("notify.", 0) == 0;
  }
  std::printf(
      "gpurun: %s: %s (takes effect at the job's %s)\n", target.string().c_str(), what.c_str(),
      at_start ? "next run: [energy] and [notify] are read when a job starts" : "next boundary");
  return 0;
}

}  // namespace gpurun::commands
