#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/report.h"

namespace strata::bench {
namespace {

std::string rate_text(double rate, ProgressDisplay::Unit unit, const std::string& noun) {
  if (unit == ProgressDisplay::Unit::kBytes) return fixed(rate / 1e9, 2) + " GB/s";
  return fixed(rate, 2) + (noun.empty() ? "" : " " + noun) + "/s";
}

std::string eta_text(double eta) {
  return std::isfinite(eta) && eta >= 0 ? human_duration(eta) : std::string("?");
}

std::string count_text(double value, ProgressDisplay::Unit unit) {
  if (unit == ProgressDisplay::Unit::kBytes) return fixed(value / 1e9, 2) + " GB";
  return std::to_string(std::llround(value));
}

}  // namespace

bool is_interactive_terminal(bool json) {
  return !json && ::isatty(2) != 0;
}

std::string human_duration(double seconds) {
  if (seconds < 60) return fixed(seconds, 1) + " s";
  const auto whole = static_cast<uint64_t>(seconds);
  char buffer[48];
  if (whole < 3600) {
    std::snprintf(buffer, sizeof buffer, "%llu min %02llu s",
                  static_cast<unsigned long long>(whole / 60),
                  static_cast<unsigned long long>(whole % 60));
  } else {
    std::snprintf(buffer, sizeof buffer, "%llu h %02llu min",
                  static_cast<unsigned long long>(whole / 3600),
                  static_cast<unsigned long long>(whole % 3600 / 60));
  }
  return buffer;
}

std::string ProgressDisplay::bar_line(const std::string& label, double fraction, double rate,
                                      Unit unit, const std::string& noun, double elapsed,
                                      double eta) {
  constexpr int kWidth = 20;
  const int filled = std::clamp(static_cast<int>(fraction * kWidth), 0, kWidth);
  char percent[8];
  std::snprintf(percent, sizeof percent, "%3.0f%%", 100 * fraction);
  return "[" + label + "] [" + std::string(static_cast<size_t>(filled), '#') +
         std::string(static_cast<size_t>(kWidth - filled), '.') + "] " + percent + "  " +
         rate_text(rate, unit, noun) + "  elapsed " + human_duration(elapsed) + "  ETA " +
         eta_text(eta);
}

std::string ProgressDisplay::plain_line(const std::string& label, double fraction, double done,
                                        double total, const std::string& noun, double rate,
                                        Unit unit, double elapsed, double eta) {
  return "[" + label + "] " + fixed(100 * fraction, 0) + "% (" + count_text(done, unit) + " of " +
         count_text(total, unit) + (noun.empty() ? "" : " " + noun) + "), " +
         rate_text(rate, unit, noun) + ", elapsed " + human_duration(elapsed) + ", ETA " +
         eta_text(eta);
}

ProgressDisplay::ProgressDisplay(std::string label, double total, Unit unit, std::string noun,
                                 bool interactive)
    : label_(std::move(label)),
      total_(total > 0 ? total : 1),
      unit_(unit),
      noun_(std::move(noun)),
      interactive_(interactive) {}

void ProgressDisplay::update(double done, double rate_amount) {
  if (finished_) return;
  done_ = std::clamp(done, 0.0, total_);
  rate_amount_ = rate_amount < 0 ? done_ : rate_amount;
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double fraction = done_ / total_;
  const double rate = elapsed > 0 ? rate_amount_ / elapsed : 0;
  const double eta = fraction > 0 ? elapsed * (1 - fraction) / fraction : NAN;
  if (interactive_) {
    if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100) && fraction < 1) return;
    last_draw_ = now;
    drawn_ = true;
    // \033[K clears what a longer previous line left to the right.
    std::fprintf(stderr, "\r%s\033[K",
                 bar_line(label_, fraction, rate, unit_, noun_, elapsed, eta).c_str());
    std::fflush(stderr);
    return;
  }
  const int tenth = static_cast<int>(fraction * 10);
  if (tenth == last_tenth_) return;
  last_tenth_ = tenth;
  std::fprintf(
      stderr, "%s\n",
      plain_line(label_, fraction, done_, total_, noun_, rate, unit_, elapsed, eta).c_str());
}

void ProgressDisplay::finish() {
  if (finished_) return;
  if (interactive_ && drawn_) std::fprintf(stderr, "\n");
  finished_ = true;
}

}  // namespace strata::bench
