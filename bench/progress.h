// One progress display for every long command (`strata bench io`, `optimizer`, `adam`,
// `finetune`), on stderr so that stdout stays the result:
//  - on a terminal (and without --json): one line redrawn in place, at most 10 times a second,
//      [io write] [##########..........]  50%  1.21 GB/s  elapsed 4.1 s  ETA 4.1 s
//  - otherwise (a log, a pipe, --json): a plain line at each tenth of the work and at the end,
//      [io write] 50% (2 of 4 passes), 1.21 GB/s, elapsed 4.1 s, ETA 4.1 s
// The rate is in decimal units (GB/s for bytes; "steps/s" for counts), as rates are everywhere.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace strata::bench {

class ProgressDisplay {
 public:
  enum class Unit { kBytes, kCount };
  // total: the amount of work (bytes or items); noun names an item in the plain lines ("passes",
  // "steps"); interactive: redraw in place (pass is_interactive_terminal(json)).
  ProgressDisplay(std::string label, double total, Unit unit, std::string noun, bool interactive);
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;
  ~ProgressDisplay() { finish(); }

  // done: work completed so far (0..total); rate_amount: what the rate is computed from when it
  // differs from done (e.g. bytes while done counts steps); < 0 means done.
  void update(double done, double rate_amount = -1);
  void set_label(std::string label) { label_ = std::move(label); }
  // Ends the display: a last line (or the bar at its final state and a newline). Idempotent.
  void finish();

  // The text of one update, for the tests: elapsed and done as given.
  static std::string bar_line(const std::string& label, double fraction, double rate, Unit unit,
                              const std::string& noun, double elapsed, double eta);
  static std::string plain_line(const std::string& label, double fraction, double done,
                                double total, const std::string& noun, double rate, Unit unit,
                                double elapsed, double eta);

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  const double total_;
  const Unit unit_;
  const std::string noun_;
  const bool interactive_;
  const Clock::time_point start_ = Clock::now();
  Clock::time_point last_draw_{};
  int last_tenth_ = -1;
  double done_ = 0, rate_amount_ = 0;
  bool drawn_ = false, finished_ = false;
};

// stderr is a terminal and the output is not --json: where a redrawn bar belongs.
bool is_interactive_terminal(bool json);

// "4.1 s", "3 min 20 s", "1 h 05 min": durations as a person reads them.
std::string human_duration(double seconds);

}  // namespace strata::bench
