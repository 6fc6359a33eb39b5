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

// Label values escaped per the exposition format: backslash, double quote and line feed.
void append_labels(std::string& out,
                   const std::vector<std::pair<std::string, std::string>>& labels) {
  if (labels.empty()) return;
  out += '{';
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ',';
    out += labels[i].first;
    out += "=\"";
    for (char c : labels[i].second) {
      if (c == '\\' || c == '"') {
        out += '\\';
        out += c;
      } else if (c == '\n') {
        out += "\\n";
      } else {
        out += c;
      }
    }
    out += '"';
  }
  out += '}';
}

void render_header(std::string& out, std::string_view name, const MetricInfo& info,
                   std::string_view help_suffix, const char* type) {
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
}

void render_sample(std::string& out, std::string_view name, const MetricInfo& info, int64_t raw) {
  out += name;
  append_labels(out, info.labels);
  out += ' ';
  append_value(out, info.render_scale, raw);
  out += '\n';
}

bool valid_label_name(const std::string& name) {
  if (name.empty() || name.starts_with("__") || (name[0] >= '0' && name[0] <= '9')) return false;
  return is_lower_word(name, /*allow_digits=*/true);
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
  for (size_t i = 0; i < info.labels.size(); ++i) {
    const std::string& label = info.labels[i].first;
    if (!valid_label_name(label)) {
      return invalid_argument("metric '" + info.name + "': label name '" + label +
                              "' must match [a-z_][a-z0-9_]* without a leading '__'");
    }
    for (size_t j = 0; j < i; ++j) {
      if (info.labels[j].first == label) {
        return invalid_argument("metric '" + info.name + "': label '" + label + "' twice");
      }
    }
  }
  for (const Entry& e : entries_) {
    if (e.info.name == name) {
      // Another series of the same family: it must agree on everything but its labels.
      if (e.info.labels == info.labels) {
        return invalid_argument("metric '" + info.name +
                                "' with these labels is already registered");
      }
      if (e.type != type || e.info.help != info.help || e.info.unit != info.unit ||
          e.info.with_peak != info.with_peak || e.info.render_scale != info.render_scale) {
        return invalid_argument("metric '" + info.name +
                                "' is registered already with another type, help, unit or peak "
                                "setting; the series of one name form one family");
      }
      continue;
    }
    // A gauge's "_peak" companion occupies a name too.
    const bool clash =
        (e.type == MetricType::kGauge && e.info.with_peak && e.info.name + "_peak" == name) ||
        (type == MetricType::kGauge && info.with_peak && info.name + "_peak" == e.info.name);
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
  // Families in the order of their first registration; a family's samples are contiguous, as
  // the exposition format requires.
  std::vector<bool> done(entries_.size(), false);
  for (size_t first = 0; first < entries_.size(); ++first) {
    if (done[first]) continue;
    const Entry& head = entries_[first];
    std::vector<const Entry*> family;
    for (size_t i = first; i < entries_.size(); ++i) {
      if (!done[i] && entries_[i].info.name == head.info.name) {
        family.push_back(&entries_[i]);
        done[i] = true;
      }
    }
    if (head.type == MetricType::kCounter) {
      render_header(out, head.info.name, head.info, "", "counter");
      for (const Entry* e : family) {
        // A counter is unsigned; clamp to the int64 range the renderer shares with gauges
        // (2^63 bytes is beyond any run).
        const uint64_t v = e->counter->value();
        const int64_t raw =
            v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v);
        render_sample(out, head.info.name, e->info, raw);
      }
      continue;
    }
    render_header(out, head.info.name, head.info, "", "gauge");
    for (const Entry* e : family) render_sample(out, head.info.name, e->info, e->gauge->value());
    if (!head.info.with_peak) continue;
    const std::string peak = head.info.name + "_peak";
    // The peak's help is the gauge's, as a sentence, then what the peak adds.
    const bool sentence = head.info.help.empty() || head.info.help.ends_with('.');
    render_header(out, peak, head.info, sentence ? " Highest value seen." : ". Highest value seen.",
                  "gauge");
    for (const Entry* e : family) render_sample(out, peak, e->info, e->gauge->peak());
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
    s.labels = e.info.labels;
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
