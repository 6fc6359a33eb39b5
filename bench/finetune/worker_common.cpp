#include "finetune/worker_common.h"

#include <fcntl.h>
#include <strata/strata.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/unique_fd.h"
#include "finetune/memory_sampler.h"

namespace strata::bench::finetune {

ProcIo read_proc_io() {
  ProcIo io;
  UniqueFd fd(::open("/proc/self/io", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return io;
  char text[1024];
  const ssize_t n = ::read(fd.get(), text, sizeof text - 1);
  if (n <= 0) return io;
  text[n] = '\0';
  if (const char* r = std::strstr(text, "\nread_bytes:"))
    io.read = std::strtoull(r + 12, nullptr, 10);
  if (const char* w = std::strstr(text, "\nwrite_bytes:")) {
    io.written = std::strtoull(w + 13, nullptr, 10);
  }
  return io;
}

double load_average() {
  char text[64] = {};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fgets(text, sizeof text, f) == nullptr) text[0] = '\0';
    std::fclose(f);
  }
  char* end = nullptr;
  const double load = std::strtod(text, &end);
  return end != text ? load : -1;
}

std::vector<Unit> build_units(const std::vector<TensorSpec>& inventory, uint32_t layers) {
  std::vector<Unit> units;
  Unit pre{-1, {}}, post{static_cast<int32_t>(layers), {}};
  std::vector<Unit> body(layers);
  for (uint32_t l = 0; l < layers; ++l) body[l].layer = static_cast<int32_t>(l);
  bool seen_layer = false;
  for (size_t i = 0; i < inventory.size(); ++i) {
    const TensorSpec& t = inventory[i];
    if (t.layer >= 0) seen_layer = true;
    if (t.kind != TensorKind::kParameter) continue;
    ParamEntry e;
    e.param = i;
    for (size_t j = i + 1; j < inventory.size() && inventory[j].kind != TensorKind::kParameter;
         ++j) {
      switch (inventory[j].kind) {
        case TensorKind::kGradient:
          e.grad = j;
          break;
        case TensorKind::kMasterWeight:
          e.master = j;
          break;
        case TensorKind::kAdamM:
          e.adam_m = j;
          break;
        case TensorKind::kAdamV:
          e.adam_v = j;
          break;
        default:
          break;
      }
    }
    if (t.layer >= 0) {
      body[static_cast<size_t>(t.layer)].params.push_back(e);
    } else {
      (seen_layer ? post : pre).params.push_back(e);
    }
  }
  if (!pre.params.empty()) units.push_back(std::move(pre));
  for (Unit& u : body) units.push_back(std::move(u));
  if (!post.params.empty()) units.push_back(std::move(post));
  return units;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

StepTotals summarize_steps(const std::vector<StepRecord>& steps) {
  StepTotals t;
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepRecord& r = steps[i];
    t.steps.push_back({{"seconds", r.seconds},
                       {"stall_seconds", r.stall},
                       {"compute_seconds", r.compute},
                       {"optimizer_seconds", r.optimizer},
                       {"overflow_check_seconds", r.overflow_check},
                       {"nvme_read_bytes", r.read},
                       {"nvme_write_bytes", r.written},
                       {"runtime_nvme_read_bytes", r.runtime_read},
                       {"runtime_nvme_write_bytes", r.runtime_written},
                       {"skipped", r.skipped},
                       {"grad_norm", r.grad_norm}});
    if (i == 0 && steps.size() > 1) continue;
    t.measured.push_back(r.seconds);
    t.read += r.read;
    t.written += r.written;
    t.seconds += r.seconds;
    t.stall += r.stall;
  }
  return t;
}

Status write_worker_trace(const std::string& path, json header, const std::vector<Span>& spans) {
  json list = json::array();
  for (const Span& s : spans) {
    json e = {
        {"track", s.track}, {"name", s.name}, {"ts", s.begin_us}, {"dur", s.end_us - s.begin_us}};
    if (s.bytes >= 0) e["bytes"] = s.bytes;
    list.push_back(std::move(e));
  }
  header["spans"] = std::move(list);
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return errno_status(STRATA_E_IO, "writing " + path, errno);
  const std::string text = header.dump();
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return errno_status(STRATA_E_IO, "writing " + path, errno);
  return Status::ok();
}

json memory_series_json(const MemorySampler& sampler) {
  json series = json::array();
  for (const MemoryReading& m : sampler.series(kSeriesPoints)) {
    series.push_back({m.seconds, m.host, m.pinned, m.device});
  }
  return series;
}

std::unique_ptr<MemorySampler> start_sampler(Channel& channel, std::string name,
                                             const std::atomic<uint64_t>& stall_us,
                                             std::function<void(json&)> add) {
  return std::make_unique<MemorySampler>(
      std::chrono::duration_cast<std::chrono::microseconds>(kSampleInterval), kSeriesEvery,
      kMetricsInterval,
      [&channel, &stall_us, name = std::move(name), add = std::move(add)](
          const MemoryReading& m, const MemoryPeaks& peaks) {
        const ProcIo io = read_proc_io();
        json event = {
            {"event", "metrics"},
            {"strategy", name},
            {"host_bytes", m.host},
            {"pinned_bytes", m.pinned},
            {"device_bytes", m.device},
            // Every sample's peak so far: a spike between two reports is the gauges' peak too.
            {"peak_host_bytes", peaks.host},
            {"peak_pinned_bytes", peaks.pinned},
            {"peak_device_bytes", peaks.device},
            {"nvme_read_bytes", io.read},
            {"nvme_write_bytes", io.written},
            {"stall_seconds", static_cast<double>(stall_us.load(std::memory_order_relaxed)) / 1e6},
            {"seconds", m.seconds}};
        if (add) add(event);
        channel.send(event);
      });
}

json error_event(const std::string& name, const Status& status) {
  return {{"event", "error"},
          {"strategy", name},
          {"message", status.message()},
          {"code", strata_strerror(status.code())}};
}

}  // namespace strata::bench::finetune
