#include "fashion_mnist/progress.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace gpurun::fashion_mnist {

std::string format_duration(std::chrono::duration<double> d) {
  const auto total = static_cast<int64_t>(std::max(0.0, std::floor(d.count())));
  const int64_t h = total / 3600;
  const int64_t m = (total / 60) % 60;
  const int64_t s = total % 60;
  if (h > 0) return fmt::format("{}:{:02}:{:02}", h, m, s);
  return fmt::format("{:02}:{:02}", m, s);
}

std::string format_devices(const std::vector<int>& gpus) {
  if (gpus.empty()) return "cpu";
  return fmt::format("gpus[{}]", fmt::join(gpus, ","));
}

ProgressLine::ProgressLine(std::ostream& out, ProgressOptions options)
    : out_(out), options_(std::move(options)) {}

bool ProgressLine::stdout_is_tty() {
  return isatty(STDOUT_FILENO) == 1;
}

void ProgressLine::begin_epoch(int epoch, int num_epochs, int64_t total_steps,
                               std::vector<int> gpus) {
  epoch_ = epoch;
  num_epochs_ = num_epochs;
  total_ = total_steps;
  done_ = 0;
  gpus_ = std::move(gpus);
  train_ = {};
  start_ = options_.now();
  last_update_ = start_;
  last_draw_.reset();
  drawn_width_ = 0;
  if (options_.tty) draw(progress_text(), false);
}

void ProgressLine::set_gpus(std::vector<int> gpus) {
  gpus_ = std::move(gpus);
}

void ProgressLine::set_total(int64_t total_steps) {
  total_ = total_steps;
}

void ProgressLine::update(int64_t steps_done, const EpochStats& train) {
  done_ = steps_done;
  train_ = train;
  const auto now = options_.now();
  last_update_ = now;
  if (!options_.tty) return;
  if (last_draw_ && now - *last_draw_ < options_.min_redraw && done_ < total_) return;
  draw(progress_text(), false);
}

void ProgressLine::end_epoch(const std::optional<EpochStats>& val) {
  draw(summary_text(val), true);
}

double ProgressLine::seconds_since_start(ProgressOptions::Clock::time_point t) const {
  return std::chrono::duration<double>(t - start_).count();
}

std::string ProgressLine::progress_text() const {
  const double elapsed = seconds_since_start(options_.now());
  const double frac =
      total_ > 0 ? std::clamp(static_cast<double>(done_) / static_cast<double>(total_), 0.0, 1.0)
                 : 0.0;
  const int width = std::max(options_.bar_width, 1);
  const auto filled = static_cast<int>(std::floor(frac * width));
  const std::string bar = std::string(static_cast<size_t>(filled), '#') +
                          std::string(static_cast<size_t>(width - filled), ' ');
  std::string rate = "?";
  std::string eta = "?";
  if (done_ > 0 && elapsed > 0.0) {
    const double per_second = static_cast<double>(done_) / elapsed;
    rate = fmt::format("{:.2f}", per_second);
    eta = format_duration(std::chrono::duration<double>(
        static_cast<double>(std::max<int64_t>(total_ - done_, 0)) / per_second));
  }
  return fmt::format("epoch {}/{} {} {:3.0f}%|{}| {}/{} [{}<{}, {} it/s] loss {:.4f} acc {:.2f}%",
                     epoch_, num_epochs_, format_devices(gpus_), 100.0 * frac, bar, done_, total_,
                     format_duration(std::chrono::duration<double>(elapsed)), eta, rate,
                     train_.loss, 100.0 * train_.accuracy);
}

std::string ProgressLine::summary_text(const std::optional<EpochStats>& val) const {
  const double elapsed = seconds_since_start(last_update_);
  const std::string rate =
      elapsed > 0.0 ? fmt::format("{:.2f}", static_cast<double>(done_) / elapsed) : "?";
  std::string text = fmt::format(
      "epoch {}/{} {} {}/{} in {} ({} it/s) train loss {:.4f} acc {:.2f}%", epoch_, num_epochs_,
      format_devices(gpus_), done_, total_, format_duration(std::chrono::duration<double>(elapsed)),
      rate, train_.loss, 100.0 * train_.accuracy);
  if (val) text += fmt::format(" | val loss {:.4f} acc {:.2f}%", val->loss, 100.0 * val->accuracy);
  return text;
}

void ProgressLine::draw(const std::string& text, bool final_line) {
  if (options_.tty) {
    // Blank out what remains of a longer previous line instead of relying on ANSI escapes.
    const size_t pad = drawn_width_ > text.size() ? drawn_width_ - text.size() : 0;
    out_ << '\r' << text << std::string(pad, ' ');
    drawn_width_ = text.size();
    last_draw_ = options_.now();
  } else {
    out_ << text;
  }
  if (final_line) {
    out_ << '\n';
    drawn_width_ = 0;
  }
  out_.flush();
}

}  // namespace gpurun::fashion_mnist
