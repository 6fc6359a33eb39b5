#include "telemetry/counters.h"

#include <charconv>
#include <cmath>

#include "common/assert.h"

namespace strata::telemetry {
namespace {

bool is_lower_word(std::string_view s, bool allow_digits) {
  if (s.empty()) {
    return false;
  }
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || c == '_' || (allow_digits && c >= '0' && c <= '9');
    if (!ok) {
      return false;
    }
  }
  return true;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Prometheus wants sample values as Go-parsable floats; integers are printed exactly so that
// byte counts above 2^53 do not lose precision when the scale is 1.
void append_value(std::string& out, double scale, int64_t raw) {
  if (scale == 1.0) {
    out += std::to_string(raw);
    return;
  }
  const double v = static_cast<double>(raw) * scale;
  if (!std::isfinite(v)) {
    out += v > 0 ? "+Inf" : (v < 0 ? "-Inf" : "NaN");
    return;
  }
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  STRATA_ASSERT(ec == std::errc());
  out.append(buf, end);
}

// HELP text escaping per the exposition format: backslash and line feed.
void append_help(std::string& out, std::string_view help) {
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

void render_one(std::string& out, std::string_view name, const MetricInfo& info,
                std::string_view help_suffix, const char* type, int64_t raw) {
  out += "# HELP ";
  out += name;
  out += ' ';
  append_help(out, info.help);
  out += help_suffix;
  if (!info.unit.empty()) {
    out += " (unit: ";
    out += info.unit;
    out += ')';
  }
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
  out += name;
  out += ' ';
  append_value(out, info.render_scale, raw);
  out += '\n';
}

}  // namespace

Status MetricsRegistry::check_new(const MetricInfo& info, MetricType type) const {
  const std::string_view name = info.name;
  if (name.size() > kMaxMetricNameBytes || !name.starts_with("strata_") ||
      !is_lower_word(name, /*allow_digits=*/true)) {
    return invalid_argument("metric name '" + info.name +
                            "' must match strata_[a-z0-9_]* and be at most " +
                            std::to_string(kMaxMetricNameBytes) + " bytes");
  }
  if (!info.unit.empty() && !is_lower_word(info.unit, /*allow_digits=*/false)) {
    return invalid_argument("metric '" + info.name + "': unit '" + info.unit +
                            "' must be a lower-case Prometheus base unit such as 'bytes'");
  }
  const std::string unit_suffix = info.unit.empty() ? "" : "_" + info.unit;
  if (type == MetricType::kCounter) {
    if (!ends_with(name, unit_suffix + "_total")) {
      return invalid_argument("counter '" + info.name + "' must end in '" + unit_suffix +
                              "_total'");
    }
  } else {
    if (ends_with(name, "_total") || ends_with(name, "_peak") ||
        (!unit_suffix.empty() && !ends_with(name, unit_suffix))) {
      return invalid_argument("gauge '" + info.name + "' must end in its unit ('" + unit_suffix +
                              "') and not in '_total' or '_peak'");
    }
  }
  if (info.help.empty() || info.help.size() > kMaxMetricHelpBytes) {
    return invalid_argument("metric '" + info.name + "' needs a help text of 1.." +
                            std::to_string(kMaxMetricHelpBytes) + " bytes");
  }
  if (!(info.render_scale > 0) || !std::isfinite(info.render_scale)) {
    return invalid_argument("metric '" + info.name + "': render_scale must be positive");
  }
  if (entries_.size() >= kMaxMetrics) {
    return Status::error(STRATA_E_LIMIT, "metric '" + info.name + "': the registry holds its " +
                                             std::to_string(kMaxMetrics) + " metrics already");
  }
  for (const Entry& e : entries_) {
    // A gauge's "_peak" companion occupies a name too.
    const bool clash = e.info.name == name ||
                       (e.type == MetricType::kGauge && e.info.name + "_peak" == name) ||
                       (type == MetricType::kGauge && info.name + "_peak" == e.info.name);
    if (clash) {
      return invalid_argument("metric '" + info.name + "' is already registered");
    }
  }
  return Status::ok();
}

Result<Counter*> MetricsRegistry::add_counter(const MetricInfo& info) {
  std::lock_guard lock(mutex_);
  STRATA_TRY(check_new(info, MetricType::kCounter));
  Counter* c = &counters_.emplace_back();
  entries_.push_back(Entry{info, MetricType::kCounter, c, nullptr});
  return c;
}

Result<Gauge*> MetricsRegistry::add_gauge(const MetricInfo& info) {
  std::lock_guard lock(mutex_);
  STRATA_TRY(check_new(info, MetricType::kGauge));
  Gauge* g = &gauges_.emplace_back();
  entries_.push_back(Entry{info, MetricType::kGauge, nullptr, g});
  return g;
}

std::string MetricsRegistry::render_prometheus() const {
  std::lock_guard lock(mutex_);
  std::string out;
  out.reserve(entries_.size() * 160);
  for (const Entry& e : entries_) {
    if (e.type == MetricType::kCounter) {
      // A counter is unsigned; clamp to the int64 range the renderer shares with gauges
      // (2^63 bytes is beyond any run).
      const uint64_t v = e.counter->value();
      const int64_t raw =
          v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v);
      render_one(out, e.info.name, e.info, "", "counter", raw);
    } else {
      render_one(out, e.info.name, e.info, "", "gauge", e.gauge->value());
      render_one(out, e.info.name + "_peak", e.info, " Highest value seen.", "gauge",
                 e.gauge->peak());
    }
  }
  return out;
}

std::vector<MetricSample> MetricsRegistry::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<MetricSample> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_) {
    MetricSample s;
    s.name = e.info.name;
    s.type = e.type;
    if (e.type == MetricType::kCounter) {
      s.value = static_cast<double>(e.counter->value()) * e.info.render_scale;
    } else {
      s.value = static_cast<double>(e.gauge->value()) * e.info.render_scale;
      s.peak = static_cast<double>(e.gauge->peak()) * e.info.render_scale;
    }
    out.push_back(std::move(s));
  }
  return out;
}

size_t MetricsRegistry::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace strata::telemetry
