// `gpurun report`: reads a JSON-lines event log (schema: docs/energy.md#events), prints its
// per-epoch rows and draws them with gnuplot (docs/energy.md#plots).
#include "report/report.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "gpurun/error.hpp"
#include "gpurun/helper_process.hpp"
#include "report/event_log.hpp"

namespace gpurun::report {
namespace detail {
namespace {

namespace fs = std::filesystem;
namespace json = boost::json;

constexpr std::chrono::seconds kGnuplotTimeout{60};
constexpr int kMaxSidePx = 16384;

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

constexpr const char* kUsage =
    "usage: gpurun report EVENTS.jsonl [-o OUT.png] [--title TEXT] [--size WxH]\n"
    "\n"
    "Draws a run's time, energy per GPU, active GPUs, Zeus cost and power-limit profile per\n"
    "epoch from its --event-log file with gnuplot, and prints the per-epoch rows.\n"
    "\n"
    "  -o, --output OUT.png  the picture (default: EVENTS with the extension .png)\n"
    "  --title TEXT          the picture's title (default: the event log's file name)\n"
    "  --size WxH            the picture's size in pixels (default 1200x900, 1200x1300 with\n"
    "                        a power-limit profile)\n"
    "  -h, --help            this text\n"
    "\n"
    "Needs gnuplot (Debian: gnuplot-nox). Reference: docs/energy.md#plots\n";

// ---------------------------------------------------------------------------------------------
// Command line

struct Options {
  std::string events;
  std::string out;  // empty: events with .png
  std::optional<std::string> title;
  int width = 0, height = 0;  // 0: chosen by the layout
  bool help = false;
};

std::pair<int, int> parse_size(const std::string& text) {
  const auto x = text.find('x');
  auto side = [&](std::string_view s) {
    int v = 0;
    if (s.size() > 6 || !all_digits(s)) return -1;
    for (char c : s) v = v * 10 + (c - '0');
    return v;
  };
  const int w = x == std::string::npos ? -1 : side(std::string_view(text).substr(0, x));
  const int h = x == std::string::npos ? -1 : side(std::string_view(text).substr(x + 1));
  if (w < 64 || h < 64 || w > kMaxSidePx || h > kMaxSidePx)
    throw UsageError(fmt::format(
        "--size '{}' is not WIDTHxHEIGHT in pixels between 64 and {} (e.g. --size 1200x900)", text,
        kMaxSidePx));
  return {w, h};
}

Options parse_args(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    // "--flag VALUE" or "--flag=VALUE" for each of `names`.
    auto value = [&](std::initializer_list<const char*> names) -> std::optional<std::string> {
      for (const char* n : names) {
        const std::string name(n);
        if (a.rfind(name + "=", 0) == 0 && name.rfind("--", 0) == 0)
          return a.substr(name.size() + 1);
        if (a == name) {
          if (i + 1 >= args.size()) throw UsageError(fmt::format("{} needs a value", name));
          return args[++i];
        }
      }
      return std::nullopt;
    };
    if (a == "-h" || a == "--help") {
      o.help = true;
    } else if (auto v = value({"-o", "--output"})) {
      if (v->empty()) throw UsageError("-o needs a file name");
      o.out = *v;
    } else if (auto t = value({"--title"})) {
      o.title = *t;
    } else if (auto s = value({"--size"})) {
      std::tie(o.width, o.height) = parse_size(*s);
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError(
          fmt::format("unknown option '{}' for gpurun report (see gpurun report --help)", a));
    } else if (o.events.empty()) {
      o.events = a;
    } else {
      throw UsageError(fmt::format(
          "gpurun report takes one event log, got '{}' and '{}' (see gpurun report --help)",
          o.events, a));
    }
  }
  if (!o.help && o.events.empty())
    throw UsageError("gpurun report needs an event log: gpurun report EVENTS.jsonl [-o OUT.png]");
  return o;
}

// ---------------------------------------------------------------------------------------------
// The text table

std::string table(const Run& run, const std::string& events) {
  const auto slots = run.slots();
  const auto& rows = run.rows();
  std::string out;
  double seconds = 0, energy = 0;
  for (const auto& r : rows) seconds += r.seconds, energy += r.energy_j;
  std::string slot_list;
  for (int s : slots) slot_list += fmt::format("{}{}", slot_list.empty() ? "" : ",", s);
  out += fmt::format("{}: {} {}, GPU slots [{}], {:.1f} s, {:.1f} J, cost {:.1f}\n", events,
                     rows.size(),
                     run.per_epoch() ? (rows.size() == 1 ? "epoch" : "epochs")
                                     : (rows.size() == 1 ? "energy window" : "energy windows"),
                     slot_list, seconds, energy, rows.empty() ? 0.0 : rows.back().cost_total);
  if (!run.per_epoch())
    out += "(no energy_epoch events: the workers do not link the runtime; one row per window)\n";
  std::string head = run.per_epoch() ? fmt::format("{:>6} ", "epoch")
                                     : fmt::format("{:>6} {:>10} ", "window", "start (s)");
  head += fmt::format("{:>9} {:>11}", "time (s)", "energy (J)");
  for (int s : slots) head += fmt::format(" {:>10}", fmt::format("gpu{} (J)", s));
  head += fmt::format(" {:>7} {:>9} {:>11} {:>11}\n", "active", "power (W)", "cost", "cost total");
  out += head;
  long index = 0;
  for (const auto& r : rows) {
    ++index;
    std::string line = run.per_epoch() ? fmt::format("{:>6} ", epoch_label(r))
                                       : fmt::format("{:>6} {:>10.1f} ", index, r.start_s);
    line += fmt::format("{:>9.1f} {:>11.1f}", r.seconds, r.energy_j);
    for (int s : slots) {
      const auto it = r.gpu_j.find(s);
      line +=
          it == r.gpu_j.end() ? fmt::format(" {:>10}", "-") : fmt::format(" {:>10.1f}", it->second);
    }
    line += fmt::format(" {:>7.2f} {:>9.1f} {:>11.1f} {:>11.1f}", r.active, r.avg_power_w, r.cost,
                        r.cost_total);
    if (run.per_epoch() && run.stop_epoch && *run.stop_epoch == r.epoch) line += "  <- early stop";
    out += line + "\n";
  }
  if (run.stop_epoch)
    out += fmt::format("early stop after epoch {}{}{}\n", *run.stop_epoch,
                       run.stop_reason.empty() ? "" : ": ", run.stop_reason);
  if (run.threshold) out += fmt::format("cost threshold: {:.1f}\n", *run.threshold);
  if (!run.profile.empty()) {
    out += fmt::format("power-limit profile ({} limits{}):\n", run.profile.size(),
                       run.chosen_limit_w ? fmt::format(", chosen {:g} W from {}",
                                                        *run.chosen_limit_w, run.chosen_source)
                                          : "");
    out += fmt::format("{:>10} {:>9} {:>14} {:>14}\n", "limit (W)", "steps/s", "avg power (W)",
                       "cost/step (J)");
    for (const auto& p : run.profile)
      out +=
          fmt::format("{:>10g} {:>9.2f} {:>14.1f} {:>14.2f}{}\n", p.limit_w, p.steps_per_s,
                      p.avg_power_w, p.cost_per_step,
                      run.chosen_limit_w && *run.chosen_limit_w == p.limit_w ? "  <- chosen" : "");
  } else if (run.chosen_limit_w) {
    out += fmt::format("power limit: {:g} W ({})\n", *run.chosen_limit_w, run.chosen_source);
  }
  if (!run.scale.empty()) {
    out += fmt::format("GPU-count profile (scale = auto, {} measurements{}):\n", run.scale.size(),
                       run.scale_choice ? fmt::format(", chosen {} GPUs", *run.scale_choice) : "");
    out += fmt::format("{:>5} {:>16} {:>18} {:>16}\n", "GPUs", "time/epoch (s)", "energy/epoch (J)",
                       "cost/epoch (J)");
    for (const auto& p : run.scale)
      out +=
          fmt::format("{:>5} {:>16.2f} {:>18.1f} {:>16.1f}{}\n", p.gpus, p.seconds, p.energy_j,
                      p.cost, run.scale_choice && *run.scale_choice == p.gpus ? "  <- chosen" : "");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// gnuplot

/// A gnuplot string literal: double quotes, with backslash and quote escaped.
std::string gp_string(std::string_view s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    if (c == '\n' || c == '\r') c = ' ';
    q += c;
  }
  return q + "\"";
}

/// A directory made by mkdtemp, removed at the end unless keep() was called.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "gpurun-report-XXXXXX").string();
    if (!::mkdtemp(tmpl.data()))
      throw Error(
          fmt::format("cannot create a temporary directory {}: {}", tmpl, std::strerror(errno)));
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!keep_) fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  void keep() { keep_ = true; }

 private:
  fs::path path_;
  bool keep_ = false;
};

/// Runs gnuplot with `args` (without argv[0]), stdin from /dev/null, stdout and stderr into
/// `log`. Blocks up to kGnuplotTimeout, then kills it. Returns the shell-style exit status.
/// Throws Error when gnuplot is not on PATH or ran past the timeout.
int run_gnuplot(const std::vector<std::string>& args, const fs::path& log) {
  HelperOptions o;
  o.argv = {"gnuplot"};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.search_path = true;
  o.stdin_stream = HelperStream::null();
  o.stdout_stream = HelperStream::file(log.string());
  o.stderr_stream = HelperStream::to_stdout();
  std::optional<HelperProcess> gnuplot;
  try {
    gnuplot.emplace(o);
  } catch (const HelperError& e) {
    if (e.error_number() == ENOENT)
      throw Error("gnuplot not found: install gnuplot-nox (scripts/setup.sh does)");
    throw Error(fmt::format("cannot start gnuplot: {}", std::strerror(e.error_number())));
  }
  std::optional<int> status;
  try {
    status = gnuplot->wait_for(kGnuplotTimeout);
  } catch (const HelperError& e) {
    throw Error(fmt::format("waiting for gnuplot (pid {}) failed: {}", gnuplot->pid(),
                            std::strerror(e.error_number())));
  }
  if (!status) {
    gnuplot->kill_and_wait();
    throw Error(fmt::format("gnuplot (pid {}) did not finish within {} s; killed it",
                            gnuplot->pid(), kGnuplotTimeout.count()));
  }
  return WIFSIGNALED(*status) ? 128 + WTERMSIG(*status) : WEXITSTATUS(*status);
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string last_lines(const std::string& text, int n) {
  size_t pos = text.size();
  while (pos > 0 && text[pos - 1] == '\n') --pos;
  const size_t end = pos;
  for (int i = 0; i < n && pos > 0; ++i) {
    pos = text.rfind('\n', pos - 1);
    if (pos == std::string::npos) {
      pos = 0;
      break;
    }
  }
  return text.substr(pos == 0 ? 0 : pos + 1, end - (pos == 0 ? 0 : pos + 1));
}

// One colour per slot (colour-blind friendly, Okabe-Ito), cycled.
constexpr const char* kSlotColours[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7",
                                        "#56B4E9", "#D55E00", "#F0E442", "#999999"};

/// rows.dat columns: 1 x, 2 bar width, 3 seconds, 4 energy_j, 5 active, 6 cost, 7 cost_total,
/// 8 avg_power_w, 9.. cumulative energy of the slots up to and including each slot (J).
/// The position of the early-stop epoch among the rows (the last row of that epoch).
std::optional<size_t> stop_index(const Run& run) {
  if (!run.stop_epoch) return std::nullopt;
  std::optional<size_t> at;
  for (size_t i = 0; i < run.epochs.size(); ++i)
    if (run.epochs[i].epoch == *run.stop_epoch) at = i;
  return at;
}

void write_rows(const Run& run, const fs::path& file) {
  const auto slots = run.slots();
  std::ofstream f(file);
  f << "# x width seconds energy_j active cost cost_total avg_power_w";
  for (int s : slots) f << " cum_gpu" << s << "_j";
  f << "\n";
  size_t i = 0;
  for (const auto& r : run.rows()) {
    // Epoch rows stand in order (a restart repeats epoch numbers): x is the position.
    const double x = run.per_epoch() ? static_cast<double>(i++) : r.start_s + r.seconds / 2;
    const double width = run.per_epoch() ? 0.7 : r.seconds * 0.9;
    f << fmt::format("{:.10g} {:.10g} {:.10g} {:.10g} {:.10g} {:.10g} {:.10g} {:.10g}", x, width,
                     r.seconds, r.energy_j, r.active, r.cost, r.cost_total, r.avg_power_w);
    double cum = 0;
    for (int s : slots) {
      const auto it = r.gpu_j.find(s);
      cum += it == r.gpu_j.end() ? 0 : it->second;
      f << fmt::format(" {:.10g}", cum);
    }
    f << "\n";
  }
  if (!f) throw Error(fmt::format("cannot write {}", file.string()));
}

void write_profile(const Run& run, const fs::path& file) {
  auto points = run.profile;
  std::sort(points.begin(), points.end(),
            [](const auto& a, const auto& b) { return a.limit_w < b.limit_w; });
  std::ofstream f(file);
  f << "# limit_w steps_per_s avg_power_w cost_per_step\n";
  for (const auto& p : points)
    f << fmt::format("{:.10g} {:.10g} {:.10g} {:.10g}\n", p.limit_w, p.steps_per_s, p.avg_power_w,
                     p.cost_per_step);
  if (!f) throw Error(fmt::format("cannot write {}", file.string()));
}

/// The scale search's rows, by GPU count (the last measurement of a count wins).
void write_scale(const Run& run, const fs::path& file) {
  std::map<int, ScalePoint> by_count;
  for (const auto& p : run.scale) by_count[p.gpus] = p;
  std::ofstream f(file);
  f << "# gpus seconds energy_j cost\n";
  for (const auto& [n, p] : by_count)
    f << fmt::format("{} {:.10g} {:.10g} {:.10g}\n", n, p.seconds, p.energy_j, p.cost);
  if (!f) throw Error(fmt::format("cannot write {}", file.string()));
}

struct Layout {
  int width, height;
  bool profile;
  bool scale = false;  // the GPU-count panel ([energy] scale = "auto")
};

/// Panel (5) of script(): the power-limit profile, at `origin` ("set origin …\nset size …").
std::string profile_panel(const Run& run, const fs::path& dir, const std::string& origin) {
  std::string s;
  const std::string prof = gp_string((dir / "profile.dat").string());
  s += origin;
  s += "set title \"power-limit profile (just-in-time profiler)\"\n";
  s += "set xlabel \"power limit (W)\"\nset xrange [*:*]\nset xtics autofreq\nset offsets graph "
       "0.05,graph 0.05,graph 0.12,0\n";
  s += "set ylabel \"throughput (steps/s)\"\nset y2label \"cost per step (J)\"\n";
  // Headroom above both curves for the key (offsets do not apply to y2).
  double max_rate = 0, max_cost = 0;
  for (const auto& p : run.profile)
    max_rate = std::max(max_rate, p.steps_per_s), max_cost = std::max(max_cost, p.cost_per_step);
  s +=
      fmt::format("set ytics nomirror\nset y2tics\nset yrange [0:{:.6g}]\nset y2range [0:{:.6g}]\n",
                  max_rate > 0 ? max_rate * 1.3 : 1, max_cost > 0 ? max_cost * 1.3 : 1);
  s += "set rmargin 11\n";
  if (run.chosen_limit_w)
    s += fmt::format(
        "set arrow 2 from {0:.10g}, graph 0 to {0:.10g}, graph 1 nohead front lc rgb '#D00000' "
        "lw 2 dt 2\nset label 2 \"chosen {0:g} W\" at {0:.10g}, graph 0.96 offset 0.6,0 front tc "
        "rgb "
        "'#D00000'\n",
        *run.chosen_limit_w);
  s += fmt::format(
      "plot {0} using 1:2 axes x1y1 with linespoints lc rgb '#0072B2' lw 2 pt 7 title "
      "\"steps/s (left)\", {0} using 1:4 axes x1y2 with linespoints lc rgb '#E69F00' lw 2 pt 5 "
      "title \"cost per step (right)\"\n",
      prof);
  return s;
}

/// Panel (6) of script(): the GPU-count profile of scale = "auto", at `origin`.
std::string scale_panel(const Run& run, const fs::path& dir, const std::string& origin) {
  std::string s;
  const std::string sc = gp_string((dir / "scale.dat").string());
  s += "unset arrow 2\nunset label 2\nset rmargin 11\n";
  s += origin;
  s += "set title \"GPU count (scale = auto): cost and time per epoch by the GPUs trained on\"\n";
  s += "set xlabel \"GPUs\"\nset xtics 1\nset offsets 0.5,0.5,0,0\n";
  s += "set ylabel \"cost per epoch (J)\"\nset y2label \"time per epoch (s)\"\n";
  double max_cost = 0, max_s = 0;
  int max_n = 1;
  for (const auto& p : run.scale)
    max_cost = std::max(max_cost, p.cost), max_s = std::max(max_s, p.seconds),
    max_n = std::max(max_n, p.gpus);
  s += fmt::format(
      "set xrange [0.5:{}.5]\nset ytics nomirror\nset y2tics\nset yrange [0:{:.6g}]\n"
      "set y2range [0:{:.6g}]\n",
      max_n, max_cost > 0 ? max_cost * 1.3 : 1, max_s > 0 ? max_s * 1.3 : 1);
  if (run.scale_choice)
    s += fmt::format(
        "set label 3 \"chosen: {0} GPU{1}\" at {0}, graph 0.82 center front tc rgb "
        "'#D00000'\n",
        *run.scale_choice, *run.scale_choice == 1 ? "" : "s");
  s += fmt::format(
      "plot {0} using 1:4:(0.6) axes x1y1 with boxes lc rgb '#8172B2' title \"cost per epoch "
      "(left)\", {0} using 1:2 axes x1y2 with linespoints lc rgb '#E69F00' lw 2 pt 7 title "
      "\"time per epoch (right)\"\n",
      sc);
  return s;
}

std::string script(const Run& run, const fs::path& dir, const std::string& terminal,
                   const Layout& layout, const std::string& title) {
  const std::string rows = gp_string((dir / "rows.dat").string());
  const auto slots = run.slots();
  const bool epochs = run.per_epoch();
  const auto& data = run.rows();
  std::string s;
  s += fmt::format("set terminal {} size {},{} noenhanced{}\n", terminal, layout.width,
                   layout.height, terminal == "pngcairo" ? " font \"Sans,10\"" : "");
  s += fmt::format("set output {}\n", gp_string((dir / "out.png").string()));
  s += "set encoding utf8\nset style fill solid 0.85 border -1\nset grid ytics lc rgb '#dddddd'\n";
  s += "set key inside top left horizontal samplen 2 opaque\nset yrange [0:*]\nset offsets "
       "0,0,graph 0.2,0\n";
  s += "set lmargin 11\nset rmargin 4\n";
  if (epochs) {
    s += fmt::format("set xrange [{}:{}]\nset xlabel \"epoch\"\n", -0.6,
                     static_cast<double>(data.size()) - 0.4);
    if (data.size() <= 30) {
      std::string tics;
      for (size_t i = 0; i < data.size(); ++i)
        tics += fmt::format("{}\"{}\" {}", i ? ", " : "", epoch_label(data[i]), i);
      s += "set xtics (" + tics + ")\n";
    } else {
      s += "set xtics autofreq\n";
    }
  } else {
    const auto& last = data.back();
    s += fmt::format("set xrange [0:{:.10g}]\nset xlabel \"time since the first window (s)\"\n",
                     last.start_s + last.seconds);
  }
  s += fmt::format("set multiplot title {} font \",14\"\n", gp_string(title));

  // Panels: 2 x 2, then the profile across the whole width.
  const int rows_of_panels = 2 + (layout.profile ? 1 : 0) + (layout.scale ? 1 : 0);
  const double top = 1.0 - 40.0 / layout.height;  // room for the title
  const double h = top / rows_of_panels;
  auto place = [&](int row, int col, int cols) {
    return fmt::format("set origin {:.4f},{:.4f}\nset size {:.4f},{:.4f}\n", col * (1.0 / cols),
                       top - (row + 1) * h, 1.0 / cols, h);
  };
  const std::string unit = epochs ? "epoch" : "window";
  const std::optional<size_t> stop_at = stop_index(run);
  // The label sits below the legend (top left) so the two never overlap.
  const std::string stop_mark = epochs && stop_at
                                    ? fmt::format(
                                          "set arrow 1 from {0}, graph 0 to {0}, graph 1 nohead "
                                          "front lc rgb '#D00000' lw 2 dt 2\n"
                                          "set label 1 \"early stop\" at {0}, graph 0.72 offset "
                                          "0.6,0 front tc rgb '#D00000'\n",
                                          *stop_at)
                                    : "";
  const std::string unmark = "unset arrow 1\nunset label 1\n";

  // (1) time per epoch, or power per window.
  s += place(0, 0, 2);
  if (epochs) {
    s += "set title \"time per epoch\"\nset ylabel \"time (s)\"\n" + stop_mark;
    s += fmt::format("plot {} using 1:3:2 with boxes lc rgb '#4C72B0' notitle\n", rows);
  } else {
    s += "set title \"average power per window (all GPUs)\"\nset ylabel \"power (W)\"\n";
    s += fmt::format("plot {} using 1:8:2 with boxes lc rgb '#4C72B0' notitle\n", rows);
  }
  s += unmark;

  // (2) energy per GPU (stacked: the tallest cumulative bar first) and in total.
  s += place(0, 1, 2);
  s += fmt::format("set title \"energy per GPU per {} (stacked) and total\"\n", unit);
  s += "set ylabel \"energy (J)\"\n" + stop_mark + "plot ";
  std::vector<int> order(slots.begin(), slots.end());
  // Cumulative bars from the last slot down, so each slot's own share shows; the key lists
  // the slots in order.
  for (size_t k = order.size(); k-- > 0;)
    s += fmt::format("{} using 1:{}:2 with boxes lc rgb '{}' notitle, ", rows, 9 + k,
                     kSlotColours[k % std::size(kSlotColours)]);
  for (size_t k = 0; k < order.size(); ++k)
    s += fmt::format("keyentry with boxes lc rgb '{}' title \"GPU {}\", ",
                     kSlotColours[k % std::size(kSlotColours)], order[k]);
  s += fmt::format(
      "{} using 1:4 with linespoints lc rgb 'black' lw 2 pt 7 ps 0.8 title \"total\"\n", rows);
  s += unmark;

  // (3) active GPUs.
  s += place(1, 0, 2);
  double max_active = 1;
  for (const auto& r : data) max_active = std::max(max_active, r.active);
  s += fmt::format("set title \"active GPUs per {}{}\"\nset ylabel \"GPUs\"\nset yrange [0:{:g}]\n",
                   unit, epochs ? " (time-weighted mean)" : "", std::ceil(max_active) + 0.5);
  s += std::ceil(max_active) <= 16 ? "set ytics 1\n" : "";
  s += stop_mark;
  s += fmt::format("plot {} using 1:5:2 with boxes lc rgb '#55A868' notitle\n", rows);
  s += unmark + "set yrange [0:*]\nset ytics autofreq\n";

  // (4) Zeus cost per epoch and cumulative, threshold, early stop.
  s += place(1, 1, 2);
  s +=
      fmt::format("set title \"Zeus cost per {} and cumulative\"\nset ylabel \"cost (J)\"\n", unit);
  s += stop_mark;
  s += fmt::format(
      "plot {0} using 1:6:2 with boxes lc rgb '#8172B2' title \"per {1}\", "
      "{0} using 1:7 with linespoints lc rgb 'black' lw 2 pt 7 ps 0.8 title \"cumulative\"",
      rows, unit);
  if (run.threshold && epochs)
    s += fmt::format(", {:.10g} with lines lc rgb '#D00000' lw 1.5 dt 3 title \"threshold {:.0f}\"",
                     *run.threshold, *run.threshold);
  s += "\n" + unmark;

  // (5) the power-limit profile.
  if (layout.profile) s += profile_panel(run, dir, place(2, 0, 1));

  // (6) the GPU-count profile of scale = "auto": time and cost per epoch by count.
  if (layout.scale) s += scale_panel(run, dir, place(layout.profile ? 3 : 2, 0, 1));
  s += "unset multiplot\nset output\n";
  return s;
}

std::string default_output(const std::string& events) {
  fs::path p(events);
  if (p.extension() == ".png") return events + ".png";
  return p.replace_extension(".png").string();
}

int report(const Options& opt) {
  const Run run = read_log(opt.events);
  if (run.runs > 1)
    std::fprintf(
        stderr,
        "gpurun report: warning: %s holds %d runs (appended logs); reporting the last one, "
        "from line %zu\n",
        opt.events.c_str(), run.runs, run.run_line);
  if (run.rows().empty())
    throw Error(fmt::format(
        "{} has no energy events (`energy_epoch` or `energy`): the energy monitor was off; run "
        "with --device cuda and --event-log, or --energy on (docs/energy.md)",
        opt.events));
  std::fputs(table(run, opt.events).c_str(), stdout);
  std::fflush(stdout);

  Layout layout{1200, 900 + (run.profile.empty() ? 0 : 400) + (run.scale.empty() ? 0 : 400),
                !run.profile.empty(), !run.scale.empty()};
  if (opt.width > 0) layout.width = opt.width, layout.height = opt.height;
  const std::string out = opt.out.empty() ? default_output(opt.events) : opt.out;
  std::string title =
      opt.title.value_or("gpurun report: " + fs::path(opt.events).filename().string());
  if (!opt.title && run.stop_epoch)
    title += fmt::format(" (stopped early after epoch {})", *run.stop_epoch);

  TempDir dir;
  write_rows(run, dir.path() / "rows.dat");
  if (layout.profile) write_profile(run, dir.path() / "profile.dat");
  if (layout.scale) write_scale(run, dir.path() / "scale.dat");
  // pngcairo draws antialiased text; the libgd png terminal is the fallback.
  const std::string terminal =
      run_gnuplot({"-e", "set terminal pngcairo"}, dir.path() / "probe.log") == 0 ? "pngcairo"
                                                                                  : "png";
  const fs::path gp = dir.path() / "report.gp";
  {
    std::ofstream f(gp);
    f << script(run, dir.path(), terminal, layout, title);
    if (!f) throw Error(fmt::format("cannot write the gnuplot script {}", gp.string()));
  }
  const fs::path log = dir.path() / "gnuplot.log";
  const int status = run_gnuplot({gp.string()}, log);
  const std::string messages = read_text(log);
  if (status != 0 || !fs::exists(dir.path() / "out.png")) {
    dir.keep();
    throw Error(
        fmt::format("gnuplot failed (exit status {}) on {}; the data and script are kept "
                    "in {}:\n{}",
                    status, gp.string(), dir.path().string(), last_lines(messages, 10)));
  }
  if (!messages.empty())
    std::fprintf(stderr, "gpurun report: gnuplot said:\n%s\n", last_lines(messages, 10).c_str());
  std::error_code ec;
  fs::copy_file(dir.path() / "out.png", out, fs::copy_options::overwrite_existing, ec);
  if (ec) throw Error(fmt::format("cannot write the picture {}: {}", out, ec.message()));
  std::printf("gpurun report: wrote %s (%dx%d, gnuplot %s)\n", out.c_str(), layout.width,
              layout.height, terminal.c_str());
  return 0;
}

void err(const std::string& msg) {
  std::fprintf(stderr, "gpurun report: error: %s\n", msg.c_str());
}

}  // namespace
}  // namespace detail

int report_command(const std::vector<std::string>& args) {
  detail::Options opt;
  try {
    opt = detail::parse_args(args);
  } catch (const UsageError& e) {
    detail::err(e.what());
    return 2;
  }
  if (opt.help) {
    std::fputs(detail::kUsage, stdout);
    return 0;
  }
  try {
    return detail::report(opt);
  } catch (const std::exception& e) {
    detail::err(e.what());
    return 1;
  }
}

}  // namespace gpurun::report
