// tqdm-style progress line of the training loop (printed by rank 0 only).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace gpurun::fashion_mnist {

/// Mean loss and accuracy over the samples seen so far.
struct EpochStats {
  double loss = 0.0;      ///< mean cross-entropy, nats per sample
  double accuracy = 0.0;  ///< fraction correct, 0..1 (printed as a percentage)
};

/// Options of ProgressLine.
struct ProgressOptions {
  using Clock = std::chrono::steady_clock;
  /// Redraw one line in place with '\r' (a terminal). False: print nothing during the epoch and
  /// one summary line at its end (logs and pipes; see ProgressLine::stdout_is_tty()).
  bool tty = false;
  /// Time source; a test passes a fake clock.
  std::function<Clock::time_point()> now = [] { return Clock::now(); };
  /// A terminal is redrawn at most this often (the last step always redraws).
  std::chrono::milliseconds min_redraw{100};
  /// Characters between the bar's '|' delimiters.
  int bar_width = 24;
};

/// "mm:ss", or "h:mm:ss" from one hour on; negative durations print as "00:00".
std::string format_duration(std::chrono::duration<double> d);

/// "gpus[0,1,3]"; "cpu" for an empty list.
std::string format_devices(const std::vector<int>& gpus);

/// The progress line of one training process. Epochs are numbered from 1. Rates are averages
/// since begin_epoch() (no smoothing), the ETA is remaining steps / that rate. The summary's time
/// runs from begin_epoch() to the last update(), so validation between them and end_epoch() does
/// not count. Formats:
///   while training (terminal):
///     epoch 2/5 gpus[0,1] 50%|############            | 10/20 [00:10<00:10, 1.00 it/s]
///     loss 0.5000 acc 80.00%                                    (one line, redrawn with '\r')
///   end of epoch (terminal and plain; on a terminal it replaces the progress line):
///     epoch 2/5 gpus[0,1] 20/20 in 00:20 (1.00 it/s) train loss 0.5000 acc 80.00% |
///     val loss 0.4000 acc 85.00%                                (one line, '\n')
/// Not thread-safe: call from the training thread. Writes to `out` and flushes it; never throws
/// beyond what the stream does.
class ProgressLine {
 public:
  ProgressLine(std::ostream& out, ProgressOptions options);

  /// Whether standard output is a terminal: isatty(STDOUT_FILENO).
  static bool stdout_is_tty();

  /// Starts epoch `epoch` of `num_epochs` with `total_steps` steps on `gpus` (empty: CPU) and
  /// starts its clock. Draws the empty bar on a terminal.
  void begin_epoch(int epoch, int num_epochs, int64_t total_steps, std::vector<int> gpus);
  /// The active GPUs changed (an elastic resize); shown from the next redraw on.
  void set_gpus(std::vector<int> gpus);
  /// The epoch's step count changed (the world size changed, so each rank's share did).
  void set_total(int64_t total_steps);
  /// `steps_done` of the epoch's steps are finished with running `train` stats. Redraws on a
  /// terminal when min_redraw has passed since the last redraw or the epoch is complete.
  void update(int64_t steps_done, const EpochStats& train);
  /// Ends the epoch: prints the summary line with `val` when given.
  void end_epoch(const std::optional<EpochStats>& val);

  /// The progress line as it would be drawn now (no '\r', no padding).
  std::string progress_text() const;
  /// The end-of-epoch line as end_epoch(val) would print it now (no '\r', no '\n').
  std::string summary_text(const std::optional<EpochStats>& val) const;

 private:
  double seconds_since_start(ProgressOptions::Clock::time_point t) const;
  void draw(const std::string& text, bool final_line);

  std::ostream& out_;
  ProgressOptions options_;
  int epoch_ = 0;
  int num_epochs_ = 0;
  int64_t total_ = 0;
  int64_t done_ = 0;
  std::vector<int> gpus_;
  EpochStats train_;
  ProgressOptions::Clock::time_point start_{};
  std::optional<ProgressOptions::Clock::time_point> last_draw_;
  ProgressOptions::Clock::time_point last_update_{};
  size_t drawn_width_ = 0;  // characters of the line now on the terminal
};

}  // namespace gpurun::fashion_mnist
