// What the two worker processes of `strata bench finetune` share (the Strata worker,
// finetune_worker.cpp, and the DeepSpeed baseline worker, deepspeed_worker.cpp): the pipe to the
// parent, the process's own I/O counters and load, and the training loop's units.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "vocabulary/tensor_spec.h"

namespace strata::bench::finetune {

using json = nlohmann::ordered_json;

// One JSON object per line on the pipe to the parent. Lines come from the training thread and
// the sampler thread, so writes are serialized; a parent that went away is ignored (SIGPIPE is
// ignored in the worker).
class Channel {
 public:
  explicit Channel(int fd) : fd_(fd) {}
  void send(const json& message) {
    const std::string line = message.dump() + "\n";
    std::lock_guard lock(mutex_);
    size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }

 private:
  int fd_;
  std::mutex mutex_;
};

// Bytes this process read from and wrote to storage (/proc/self/io: read_bytes / write_bytes,
// what reached the block layer; O_DIRECT I/O counts, the page cache does not hide any).
struct ProcIo {
  uint64_t read = 0;
  uint64_t written = 0;
};

ProcIo read_proc_io();

// The 1-minute load average: this benchmark's figures depend on the CPUs being free, so each
// result says how busy the machine was.
double load_average();

// Explicit limits and rates, the same for both workers.
inline constexpr size_t kMaxSpans = size_t{1} << 20;  // a worker's own trace spans
inline constexpr size_t kSeriesPoints = 2000;         // memory samples sent for the plot
inline constexpr auto kSampleInterval = std::chrono::milliseconds(5);
inline constexpr uint32_t kSeriesEvery = 4;  // one series point per 20 ms
inline constexpr auto kMetricsInterval = std::chrono::milliseconds(250);
// A wait shorter than this is bookkeeping, not a stall worth a trace span.
inline constexpr uint64_t kMinWaitSpanUs = 50;

struct Span {
  const char* track;
  std::string name;
  uint64_t begin_us;
  uint64_t end_us;
  int64_t bytes;
};

// A worker's clock and its own trace spans, kept only when a trace was asked for, at most
// kMaxSpans. Spans may come from several threads (the DeepSpeed worker's aio handles).
class SpanLog {
 public:
  explicit SpanLog(bool enabled) : enabled_(enabled) {}
  std::chrono::steady_clock::time_point epoch() const { return epoch_; }
  uint64_t now_us() const {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                     std::chrono::steady_clock::now() - epoch_)
                                     .count());
  }
  void add(const char* track, std::string name, uint64_t begin, uint64_t end, int64_t bytes = -1) {
    if (!enabled_) return;
    std::lock_guard lock(mutex_);
    if (spans_.size() < kMaxSpans) spans_.push_back({track, std::move(name), begin, end, bytes});
  }
  // After every thread that adds spans has stopped.
  const std::vector<Span>& spans() const { return spans_; }

 private:
  const bool enabled_;
  const std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  std::mutex mutex_;
  std::vector<Span> spans_;
};

// A parameter and the indices (into the inventory) of its states.
struct ParamEntry {
  size_t param = 0, grad = SIZE_MAX, master = SIZE_MAX, adam_m = SIZE_MAX, adam_v = SIZE_MAX;
};

// A unit of the loop: the embedding ("pre", layer -1), a transformer layer, or the final norm
// and LM head ("post", layer L), as sched/training_step.h numbers them.
struct Unit {
  int32_t layer = 0;
  std::vector<ParamEntry> params;
};

std::vector<Unit> build_units(const std::vector<TensorSpec>& inventory, uint32_t layers);

double median(std::vector<double> v);

// One training step as a worker measured it.
struct StepRecord {
  double seconds = 0, stall = 0, overflow_check = 0, optimizer = 0, compute = 0;
  uint64_t read = 0, written = 0;  // /proc/self/io
  // Strata: the runtime's own count; DeepSpeed: the bytes its aio handles were asked to move.
  uint64_t runtime_read = 0, runtime_written = 0;
  bool skipped = false;  // Strata: a non-finite gradient
  double grad_norm = 0;
};

// The steps as the result reports them: each one, and the totals over the measured ones (every
// step but the first, which records the schedule and fills the pipeline, when there are more).
struct StepTotals {
  json steps = json::array();
  std::vector<double> measured;  // seconds
  uint64_t read = 0, written = 0;
  double seconds = 0, stall = 0;
};
StepTotals summarize_steps(const std::vector<StepRecord>& steps);

// A worker's trace file: `header` (its name, the runtime's trace and clock) with `spans` added.
Status write_worker_trace(const std::string& path, json header, const std::vector<Span>& spans);

class MemorySampler;
// The memory series of the result, max-pooled to kSeriesPoints.
json memory_series_json(const MemorySampler& sampler);
// A worker's sampler: a sample every kSampleInterval, and every kMetricsInterval a "metrics"
// event on `channel` (what the parent's Prometheus endpoint serves) with the stall so far.
// `add` (may be empty) puts a worker's own live figures into each "metrics" event, on the
// sampler's thread.
std::unique_ptr<MemorySampler> start_sampler(Channel& channel, std::string name,
                                             const std::atomic<uint64_t>& stall_us,
                                             std::function<void(json&)> add = {});
// The "error" event a failed worker sends instead of its result.
json error_event(const std::string& name, const Status& status);

// Runs a worker (anything with Status run() and send_error(Status)) as the worker process's
// body: an exception never escapes (out of memory is STRATA_E_NOMEM), a failure is sent to the
// parent. Returns the process exit code.
template <typename Worker>
int run_worker_process(Worker& worker) {
  ::signal(SIGPIPE, SIG_IGN);  // a parent that went away is the channel's concern
  Status status;
  try {
    status = worker.run();
  } catch (const std::bad_alloc&) {
    status = Status::error(STRATA_E_NOMEM, "out of host memory");
  } catch (const std::exception& e) {
    status = Status::error(STRATA_E_INTERNAL, std::string("unexpected exception: ") + e.what());
  }
  if (!status) {
    worker.send_error(status);
    return 1;
  }
  return 0;
}

// The initial model both workers start from: small weights, the same for every run.
inline float initial_weight(uint64_t seed, uint64_t i) {
  const uint64_t x = (seed * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
  return static_cast<float>((x >> 40) & 0xFFFF) * (0.02f / 65535.0f) - 0.01f;
}

}  // namespace strata::bench::finetune
