// A small metrics registry: named monotonic counters and gauges (with their peaks), rendered in
// the Prometheus text exposition format. One registry is owned by each runtime; there is no
// global instance, so two runtimes in one process never mix their numbers.
//
// Thread rules: registration (add_counter / add_gauge) and rendering may run on any thread; the
// returned Counter / Gauge pointers stay valid for the registry's lifetime and are updated with
// relaxed atomics from any thread, so the hot path is one atomic add (plus a compare-exchange
// loop on the peak for gauges, taken only while the value is rising past it).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata::telemetry {

// Explicit limits. A registry is meant for tens of metrics; the cap catches a caller that
// registers one metric per tensor by mistake instead of growing without bound.
inline constexpr size_t kMaxMetrics = 256;
inline constexpr size_t kMaxMetricNameBytes = 128;
inline constexpr size_t kMaxMetricHelpBytes = 512;

// How a metric is registered. Names follow Prometheus conventions, which the registry checks
// so that a dashboard never has to guess: they start with "strata_", use [a-z0-9_], carry the
// unit as a suffix ("strata_nvme_read_bytes_total", "strata_pinned_bytes") and counters end
// in "_total". unit is a Prometheus base unit ("bytes", "seconds", ...) or "" when the metric
// is a plain count.
struct MetricInfo {
  std::string name;
  std::string help;
  std::string unit;
  // Stored values are integers (atomics); rendering multiplies by render_scale. It lets a hot
  // path count microseconds while the exposition reports seconds, as Prometheus expects.
  double render_scale = 1.0;
  // The series' labels, (name, value) pairs: dimensions such as strategy, tier, kind and
  // direction are labels, never parts of the name. Metrics registered under one name form a
  // family: same type, help, unit and peak setting, different label sets; it is rendered with
  // one HELP and one TYPE line. Label names match [a-z_][a-z0-9_]* (no leading "__").
  std::vector<std::pair<std::string, std::string>> labels = {};
  // Gauges: also render N_peak, the high-water mark. For levels whose peak matters (memory);
  // off for flags and rates, where a peak means nothing.
  bool with_peak = true;
};

class Counter {
 public:
  void add(uint64_t n = 1) noexcept { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A level that goes up and down (bytes resident, requests in flight) and remembers its highest
// value since creation (or since reset_peak), because peaks are what Strata is judged on.
class Gauge {
 public:
  void set(int64_t v) noexcept {
    value_.store(v, std::memory_order_relaxed);
    raise_peak(v);
  }
  void add(int64_t delta) noexcept {
    raise_peak(value_.fetch_add(delta, std::memory_order_relaxed) + delta);
  }
  void sub(int64_t delta) noexcept { add(-delta); }
  int64_t value() const noexcept { return value_.load(std::memory_order_relaxed); }
  int64_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }
  // A value this gauge was not set to but held between two updates (a sampler finer than its
  // reports): the peak rises to it, the value stays.
  void observe(int64_t v) noexcept { raise_peak(v); }
  // Starts a new peak window at the current value (e.g. per training step).
  void reset_peak() noexcept { peak_.store(value(), std::memory_order_relaxed); }

 private:
  void raise_peak(int64_t v) noexcept {
    int64_t seen = peak_.load(std::memory_order_relaxed);
    while (v > seen && !peak_.compare_exchange_weak(seen, v, std::memory_order_relaxed)) {
    }
  }
  std::atomic<int64_t> value_{0};
  std::atomic<int64_t> peak_{0};
};

enum class MetricType : uint8_t { kCounter, kGauge };

// One metric's value at the time of a snapshot, for the C API's stats call and for tests.
struct MetricSample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;
  MetricType type = MetricType::kCounter;
  double value = 0;  // scaled by render_scale
  double peak = 0;   // gauges only
};

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registers a metric. Fails with STRATA_E_INVALID on a name that breaks the conventions above
  // or is already taken, and with STRATA_E_LIMIT beyond kMaxMetrics. The pointer is owned by
  // the registry and valid until it is destroyed.
  Result<Counter*> add_counter(const MetricInfo& info);
  // A gauge named N with with_peak also renders N_peak (its high-water mark) as a second gauge.
  Result<Gauge*> add_gauge(const MetricInfo& info);

  // The Prometheus text exposition format (version 0.0.4): per family a "# HELP" line (the
  // help text and its unit), a "# TYPE" line and its samples, families in registration order.
  std::string render_prometheus() const;
  std::vector<MetricSample> snapshot() const;
  size_t size() const;

 private:
  struct Entry {
    MetricInfo info;
    MetricType type;
    Counter* counter = nullptr;
    Gauge* gauge = nullptr;
  };
  Status check_new(const MetricInfo& info, MetricType type) const;

  mutable std::mutex mutex_;
  // deques never move their elements, which keeps the handed-out pointers valid.
  std::deque<Counter> counters_;
  std::deque<Gauge> gauges_;
  std::vector<Entry> entries_;
};

}  // namespace strata::telemetry
