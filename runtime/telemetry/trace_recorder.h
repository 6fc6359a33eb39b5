// The trace recorder: spans ("nvme read" of tensor "wq.3" took 812 us, 4 MiB) and counter
// samples ("pinned bytes" over time) recorded from any thread, exported as a Chrome trace-event
// JSON file that Perfetto and chrome://tracing open.
//
// Why it looks the way it does:
//  - Recording runs on I/O completion threads and in the training loop, so it must not allocate,
//    lock or grow: every event slot is allocated when the recorder is created, events are
//    fixed-size (names are copied into a fixed buffer and truncated), and a slot is claimed with
//    one atomic add on one of a few cache-line-separated shards (picked by thread) so threads do
//    not contend on a single counter.
//  - The capacity is a hard cap. When every shard is full, events are dropped and counted (the
//    count is in the exported file), never buffered elsewhere.
//  - A disabled recorder costs one relaxed atomic load per call site.
//  - A trace carries names and sizes only, never tensor contents: the record calls take no data
//    pointer at all.
//
// Thread rules: every member may be called from any thread, concurrently, including
// export_chrome_trace while others record (events still being written are left out).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata::telemetry {

// Explicit limits.
inline constexpr size_t kMaxTraceNameBytes = 63;  // longer span / counter names are truncated
inline constexpr uint32_t kMaxTracks = 64;
inline constexpr uint32_t kMaxTraceShards = 64;
inline constexpr uint64_t kMaxTraceEvents = uint64_t{1}
                                            << 26;  // 64 Mi events (~6 GiB): a typo guard

// A row in the trace viewer. Spans on one track that overlap in time (several reads in flight)
// are spread over numbered sub-rows at export, because a Chrome trace row must nest.
struct TrackId {
  uint16_t index = 0;
  friend bool operator==(TrackId, TrackId) = default;
};

// The tracks every recorder has, registered in this order at creation.
inline constexpr TrackId kTrackNvmeRead{0};
inline constexpr TrackId kTrackNvmeWrite{1};
inline constexpr TrackId kTrackH2DCopy{2};
inline constexpr TrackId kTrackD2HCopy{3};
inline constexpr TrackId kTrackCompute{4};
inline constexpr TrackId kTrackOptimizer{5};
inline constexpr TrackId kTrackWait{6};
inline constexpr uint32_t kStandardTrackCount = 7;

// No optional argument on a span.
inline constexpr int64_t kNoBytes = -1;

// The tensor a span moved, when it moved one: its kind (the STRATA_KIND_* value) and layer.
// Exported as the span's args ("kind": "parameter", "layer": 3) beside its bytes; the span's
// name is the tensor's name. Never tensor data.
inline constexpr uint8_t kNoTensorKind = 0xff;
struct SpanTensor {
  uint8_t kind = kNoTensorKind;
  int32_t layer = -1;
};

struct TraceConfig {
  // Total events (spans + counter samples) the recorder can hold; each takes sizeof(TraceEvent)
  // = 96 bytes, allocated up front. The default (262144 events, 24 MiB) covers several steps of
  // a 70B model at tensor granularity.
  uint64_t capacity_events = uint64_t{1} << 18;
  // Slots are split evenly over this many shards. More shards, less contention between
  // recording threads, but a single busy thread spills over to other shards only when its own is
  // full (a short scan), so the total cap holds either way.
  uint32_t shards = 8;
  bool start_enabled = false;
};

// One recorded event, stored in place. Public only so that its size can be stated and checked.
struct TraceEvent {
  enum Kind : uint8_t { kSpan = 1, kCounter = 2 };
  // 0 while the slot is being written; set last with release order so that an exporter that
  // reads it with acquire order sees a complete event.
  std::atomic<uint8_t> committed{0};
  uint8_t kind = 0;
  uint16_t track = 0;
  uint8_t name_len = 0;
  uint8_t tensor_kind = kNoTensorKind;  // SpanTensor, in what would otherwise be padding
  int16_t tensor_layer = -1;            // clamped to int16
  uint64_t begin_us = 0;
  uint64_t end_us = 0;
  int64_t value = 0;  // a counter's sample, or a span's byte count (kNoBytes: none)
  char name[kMaxTraceNameBytes + 1] = {};
};
static_assert(sizeof(TraceEvent) == 96);

// What export_chrome_trace wrote, for logs and tests.
struct TraceStats {
  uint64_t capacity = 0;
  uint64_t recorded = 0;  // events held (including ones still being written)
  uint64_t dropped = 0;   // events refused because the recorder was full
};

class TraceRecorder {
 public:
  // Allocates every slot now. STRATA_E_INVALID for a capacity of 0 or above kMaxTraceEvents, a
  // shard count of 0 or above kMaxTraceShards; STRATA_E_NOMEM when the slots cannot be had.
  static Result<std::unique_ptr<TraceRecorder>> create(const TraceConfig& config = {});
  ~TraceRecorder();
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  void set_enabled(bool enabled) noexcept { enabled_.store(enabled, std::memory_order_relaxed); }
  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }

  // Microseconds on the steady clock since the recorder was created: the time base of every
  // event. Cheap (a vDSO clock read); never goes backwards.
  uint64_t now_us() const noexcept {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                     std::chrono::steady_clock::now() - epoch_)
                                     .count());
  }

  // Registers a custom track ("prefetch", "checksum"). Returns the existing id when the name is
  // known. Not for the hot path (takes a lock, may allocate): register at start-up.
  // STRATA_E_INVALID for an empty or over-long name, STRATA_E_LIMIT beyond kMaxTracks.
  Result<TrackId> register_track(std::string_view name);
  // The track's name, or "" for an unknown id.
  std::string track_name(TrackId track) const;

  // Records a finished span [begin_us, end_us) (times from now_us()). bytes is shown as the
  // span's "bytes" argument unless kNoBytes. An end before begin is clamped to a zero duration;
  // an unknown track is counted as dropped. Never blocks, never allocates.
  void record_span(TrackId track, std::string_view name, uint64_t begin_us, uint64_t end_us,
                   int64_t bytes = kNoBytes, SpanTensor tensor = {}) noexcept {
    if (!enabled()) {
      return;
    }
    record(TraceEvent::kSpan, track.index, name, begin_us, end_us, bytes, tensor);
  }
  // Records the value of a counter series (e.g. "pinned bytes") at time now_us().
  void record_counter(std::string_view name, int64_t value) noexcept {
    if (!enabled()) {
      return;
    }
    const uint64_t t = now_us();
    record(TraceEvent::kCounter, 0, name, t, t, value);
  }

  TraceStats stats() const noexcept;

  // Writes {"traceEvents":[...]} to path atomically (a temporary file next to it, fsync,
  // rename, fsync of the directory), so a reader never sees half a trace and an earlier trace
  // at path survives a failed export. STRATA_E_IO (with errno) when the file cannot be written.
  Status export_chrome_trace(const std::string& path) const;

 private:
  struct alignas(64) Shard {
    std::atomic<uint64_t> next{0};  // slots claimed; may run past capacity when full
    std::atomic<uint64_t> dropped{0};
    TraceEvent* slots = nullptr;
    uint64_t capacity = 0;
  };

  TraceRecorder(const TraceConfig& config, std::unique_ptr<TraceEvent[]> slots);
  void record(uint8_t kind, uint16_t track, std::string_view name, uint64_t begin_us,
              uint64_t end_us, int64_t value, SpanTensor tensor = {}) noexcept;
  TraceEvent* claim_slot() noexcept;
  std::string render_json() const;

  const std::chrono::steady_clock::time_point epoch_;
  std::atomic<bool> enabled_{false};
  std::atomic<uint32_t> track_count_{0};
  std::unique_ptr<TraceEvent[]> slots_;
  std::unique_ptr<Shard[]> shards_;
  uint32_t shard_count_ = 0;
  uint64_t capacity_ = 0;

  mutable std::mutex tracks_mutex_;  // guards track_names_ growth
  std::vector<std::string> track_names_;
};

// Records a span on `track` covering the object's lifetime. When the recorder is null or
// disabled at construction it does nothing at all (one relaxed load). The name is copied, so a
// temporary string may be passed.
class ScopedSpan {
 public:
  ScopedSpan(TraceRecorder* recorder, TrackId track, std::string_view name,
             int64_t bytes = kNoBytes) noexcept;
  ~ScopedSpan();
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

  // Sets or replaces the "bytes" argument (e.g. once a short read's size is known).
  void set_bytes(int64_t bytes) noexcept { bytes_ = bytes; }

 private:
  TraceRecorder* recorder_ = nullptr;  // null: inactive
  TrackId track_;
  uint8_t name_len_ = 0;
  int64_t bytes_ = kNoBytes;
  uint64_t begin_us_ = 0;
  char name_[kMaxTraceNameBytes + 1];
};

}  // namespace strata::telemetry
