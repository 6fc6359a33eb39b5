#include "telemetry/trace_recorder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <concepts>
#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <thread>

#include "common/assert.h"
#include "common/unique_fd.h"

namespace strata::telemetry {
namespace {

constexpr const char* kStandardTrackNames[kStandardTrackCount] = {
    "nvme read", "nvme write", "h2d copy", "d2h copy", "compute", "optimizer", "wait"};

// Copies at most kMaxTraceNameBytes of name, cutting before a UTF-8 continuation byte so that
// truncation never splits a character (the exporter would otherwise have to replace it).
uint8_t copy_name(char* dst, std::string_view name) noexcept {
  size_t n = name.size();
  if (n > kMaxTraceNameBytes) {
    n = kMaxTraceNameBytes;
    while (n > 0 && (static_cast<unsigned char>(name[n]) & 0xC0) == 0x80) {
      --n;
    }
  }
  std::memcpy(dst, name.data(), n);
  dst[n] = '\0';
  return static_cast<uint8_t>(n);
}

// Length of the valid UTF-8 sequence at s[i], or 0 when it is invalid (overlong forms,
// surrogates, code points above U+10FFFF and truncated sequences included).
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) {
    return 1;
  }
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) {
      lo = 0xA0;
    }
    if (c == 0xED) {
      hi = 0x9F;
    }
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) {
      lo = 0x90;
    }
    if (c == 0xF4) {
      hi = 0x8F;
    }
  } else {
    return 0;
  }
  if (i + len > s.size()) {
    return 0;
  }
  if (byte(i + 1) < lo || byte(i + 1) > hi) {
    return 0;
  }
  for (size_t k = 2; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) {
      return 0;
    }
  }
  return len;
}

// Names come from the training framework and can hold anything; the output must stay valid
// JSON, so escape what JSON requires and replace invalid UTF-8 with U+FFFD.
void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      ++i;
    } else {
      const size_t len = utf8_sequence_length(s, i);
      if (len == 0) {
        out += "\xEF\xBF\xBD";
        ++i;
      } else {
        out.append(s.data() + i, len);
        i += len;
      }
    }
  }
  out += '"';
}

// append(out, "text", 42, ...): the exporter's one way to build output, without temporaries.
void put(std::string& out, std::string_view text) {
  out.append(text);
}
template <std::integral T>
void put(std::string& out, T value) {
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  STRATA_ASSERT(ec == std::errc());
  out.append(buf, end);
}
template <typename... Parts>
void append(std::string& out, const Parts&... parts) {
  (put(out, parts), ...);
}

// Buffers output and writes it in large chunks, so exporting a full recorder needs a bounded
// amount of memory for the text. The first error sticks.
class FileWriter {
 public:
  static constexpr size_t kFlushBytes = size_t{1} << 20;
  explicit FileWriter(int fd) : fd_(fd) { buffer_.reserve(kFlushBytes + 4096); }

  std::string& buffer() { return buffer_; }
  void maybe_flush() {
    if (buffer_.size() >= kFlushBytes) {
      flush();
    }
  }
  void flush() {
    size_t done = 0;
    while (errno_ == 0 && done < buffer_.size()) {
      const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        errno_ = errno;
      } else {
        done += static_cast<size_t>(n);
      }
    }
    buffer_.clear();
  }
  int error() const { return errno_; }

 private:
  int fd_;
  int errno_ = 0;
  std::string buffer_;
};

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) {
    return ".";
  }
  if (slash == 0) {
    return "/";
  }
  return path.substr(0, slash);
}

// A track's spans are split into rows ("lanes") so that no two spans on a row partly overlap:
// a Chrome trace row shows a stack of nested spans, and partial overlaps render wrongly or are
// dropped by Perfetto. A span joins the first lane where it either starts after everything open
// there has ended or nests inside the innermost open span.
struct LaneAssigner {
  std::vector<std::vector<uint64_t>> open_ends;  // per lane, a stack of end times

  uint32_t place(uint64_t begin, uint64_t end) {
    for (size_t lane = 0; lane < open_ends.size(); ++lane) {
      std::vector<uint64_t>& stack = open_ends[lane];
      while (!stack.empty() && stack.back() <= begin) {
        stack.pop_back();
      }
      if (stack.empty() || end <= stack.back()) {
        stack.push_back(end);
        return static_cast<uint32_t>(lane);
      }
    }
    open_ends.push_back({end});
    return static_cast<uint32_t>(open_ends.size() - 1);
  }
};

// STRATA_KIND_* in strata.h order (PARAMETER = 0 ... OTHER = 6).
std::string_view tensor_kind_name(uint8_t kind) {
  static constexpr const char* kNames[] = {"parameter", "gradient", "master_weight",
                                           "adam_m",    "adam_v",   "activation_checkpoint",
                                           "other"};
  return kind < std::size(kNames) ? kNames[kind] : "unknown";
}

}  // namespace

Result<std::unique_ptr<TraceRecorder>> TraceRecorder::create(const TraceConfig& config) {
  if (config.capacity_events == 0 || config.capacity_events > kMaxTraceEvents) {
    return invalid_argument("trace capacity must be 1.." + std::to_string(kMaxTraceEvents) +
                            " events, got " + std::to_string(config.capacity_events));
  }
  if (config.shards == 0 || config.shards > kMaxTraceShards) {
    return invalid_argument("trace shards must be 1.." + std::to_string(kMaxTraceShards) +
                            ", got " + std::to_string(config.shards));
  }
  std::unique_ptr<TraceEvent[]> slots(new (std::nothrow) TraceEvent[config.capacity_events]);
  if (!slots) {
    return Status::error(
        STRATA_E_NOMEM,
        "cannot allocate " + std::to_string(config.capacity_events) + " trace event slots");
  }
  std::unique_ptr<TraceRecorder> recorder(new (std::nothrow)
                                              TraceRecorder(config, std::move(slots)));
  if (!recorder) {
    return Status::error(STRATA_E_NOMEM, "cannot allocate the trace recorder");
  }
  return recorder;
}

TraceRecorder::TraceRecorder(const TraceConfig& config, std::unique_ptr<TraceEvent[]> slots)
    : epoch_(std::chrono::steady_clock::now()),
      slots_(std::move(slots)),
      shard_count_(
          static_cast<uint32_t>(std::min<uint64_t>(config.shards, config.capacity_events))),
      capacity_(config.capacity_events) {
  shards_ = std::make_unique<Shard[]>(shard_count_);
  const uint64_t per_shard = capacity_ / shard_count_;
  const uint64_t remainder = capacity_ % shard_count_;
  uint64_t offset = 0;
  for (uint32_t i = 0; i < shard_count_; ++i) {
    shards_[i].slots = slots_.get() + offset;
    shards_[i].capacity = per_shard + (i < remainder ? 1 : 0);
    offset += shards_[i].capacity;
  }
  STRATA_ASSERT(offset == capacity_);
  // Reserved up front so that registering a track never moves the names under a reader.
  track_names_.reserve(kMaxTracks);
  for (const char* name : kStandardTrackNames) {
    track_names_.emplace_back(name);
  }
  track_count_.store(kStandardTrackCount, std::memory_order_release);
  enabled_.store(config.start_enabled, std::memory_order_relaxed);
}

TraceRecorder::~TraceRecorder() = default;

Result<TrackId> TraceRecorder::register_track(std::string_view name) {
  if (name.empty() || name.size() > kMaxTraceNameBytes) {
    return invalid_argument("track name must be 1.." + std::to_string(kMaxTraceNameBytes) +
                            " bytes");
  }
  std::lock_guard lock(tracks_mutex_);
  for (size_t i = 0; i < track_names_.size(); ++i) {
    if (track_names_[i] == name) {
      return TrackId{static_cast<uint16_t>(i)};
    }
  }
  if (track_names_.size() >= kMaxTracks) {
    return Status::error(STRATA_E_LIMIT,
                         "trace recorder already has " + std::to_string(kMaxTracks) + " tracks");
  }
  track_names_.emplace_back(name);
  track_count_.store(static_cast<uint32_t>(track_names_.size()), std::memory_order_release);
  return TrackId{static_cast<uint16_t>(track_names_.size() - 1)};
}

std::string TraceRecorder::track_name(TrackId track) const {
  std::lock_guard lock(tracks_mutex_);
  return track.index < track_names_.size() ? track_names_[track.index] : std::string();
}

TraceEvent* TraceRecorder::claim_slot() noexcept {
  // Hashing the thread id keeps one thread on one shard (its slots stay in its cache) without
  // any per-thread registration or thread_local state tied to this recorder.
  const size_t home = std::hash<std::thread::id>{}(std::this_thread::get_id()) % shard_count_;
  for (uint32_t k = 0; k < shard_count_; ++k) {
    Shard& shard = shards_[(home + k) % shard_count_];
    // The plain load first keeps a full recorder from bumping `next` forever.
    if (shard.next.load(std::memory_order_relaxed) >= shard.capacity) {
      continue;
    }
    const uint64_t index = shard.next.fetch_add(1, std::memory_order_relaxed);
    if (index < shard.capacity) {
      return &shard.slots[index];
    }
  }
  shards_[home].dropped.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

void TraceRecorder::record(uint8_t kind, uint16_t track, std::string_view name, uint64_t begin_us,
                           uint64_t end_us, int64_t value, SpanTensor tensor) noexcept {
  if (kind == TraceEvent::kSpan && track >= track_count_.load(std::memory_order_acquire)) {
    // A bad track id is a caller bug, but a trace is diagnostics: count it, do not crash.
    shards_[0].dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  TraceEvent* e = claim_slot();
  if (e == nullptr) {
    return;
  }
  STRATA_ASSERT(e->committed.load(std::memory_order_relaxed) == 0);
  e->kind = kind;
  e->track = track;
  e->begin_us = begin_us;
  e->end_us = std::max(begin_us, end_us);
  e->value = value;
  e->tensor_kind = tensor.kind;
  e->tensor_layer = static_cast<int16_t>(std::clamp<int32_t>(tensor.layer, -1, INT16_MAX));
  e->name_len = copy_name(e->name, name);
  e->committed.store(1, std::memory_order_release);
}

TraceStats TraceRecorder::stats() const noexcept {
  TraceStats s;
  s.capacity = capacity_;
  for (uint32_t i = 0; i < shard_count_; ++i) {
    s.recorded += std::min(shards_[i].next.load(std::memory_order_relaxed), shards_[i].capacity);
    s.dropped += shards_[i].dropped.load(std::memory_order_relaxed);
  }
  return s;
}

Status TraceRecorder::export_chrome_trace(const std::string& path) const {
  if (path.empty()) {
    return invalid_argument("trace path is empty");
  }

  // Snapshot: committed events only; a slot being written right now is left out.
  std::vector<const TraceEvent*> spans;
  std::vector<const TraceEvent*> counters;
  uint64_t dropped = 0;
  for (uint32_t i = 0; i < shard_count_; ++i) {
    const Shard& shard = shards_[i];
    const uint64_t n = std::min(shard.next.load(std::memory_order_acquire), shard.capacity);
    for (uint64_t k = 0; k < n; ++k) {
      const TraceEvent& e = shard.slots[k];
      if (e.committed.load(std::memory_order_acquire) == 0) {
        continue;
      }
      (e.kind == TraceEvent::kSpan ? spans : counters).push_back(&e);
    }
    dropped += shard.dropped.load(std::memory_order_relaxed);
  }
  std::vector<std::string> tracks;
  {
    std::lock_guard lock(tracks_mutex_);
    tracks = track_names_;
  }

  const auto by_time = [](const TraceEvent* a, const TraceEvent* b) {
    if (a->track != b->track) {
      return a->track < b->track;
    }
    if (a->begin_us != b->begin_us) {
      return a->begin_us < b->begin_us;
    }
    return a->end_us > b->end_us;  // outer span first, so inner ones can nest in its lane
  };
  std::sort(spans.begin(), spans.end(), by_time);
  std::sort(counters.begin(), counters.end(),
            [](const TraceEvent* a, const TraceEvent* b) { return a->begin_us < b->begin_us; });

  // Lanes per track, then one tid per (track, lane): tids are numbered in track order so that
  // viewers that sort rows by tid keep the tracks in the standard order too.
  std::vector<uint32_t> lane_of(spans.size());
  std::vector<uint32_t> lanes_per_track(tracks.size(), 0);
  for (size_t begin = 0; begin < spans.size();) {
    const uint16_t track = spans[begin]->track;
    LaneAssigner lanes;
    size_t end = begin;
    for (; end < spans.size() && spans[end]->track == track; ++end) {
      lane_of[end] = lanes.place(spans[end]->begin_us, spans[end]->end_us);
    }
    STRATA_ASSERT(track < tracks.size());
    lanes_per_track[track] = static_cast<uint32_t>(lanes.open_ends.size());
    begin = end;
  }
  std::vector<uint32_t> first_tid(tracks.size(), 0);
  uint32_t next_tid = 1;  // tid 0 is left to the process-wide counter events
  for (size_t t = 0; t < tracks.size(); ++t) {
    first_tid[t] = next_tid;
    next_tid += lanes_per_track[t];
  }

  const std::string dir = directory_of(path);
  std::string tmp = path + ".XXXXXX";
  UniqueFd fd(::mkstemp(tmp.data()));
  if (!fd.valid()) {
    return errno_status(STRATA_E_IO, "creating a temporary file for " + path, errno);
  }
  // mkstemp makes the file 0600; a trace is meant to be opened by other tools and users.
  (void)::fchmod(fd.get(), 0644);
  const auto fail = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    return errno_status(STRATA_E_IO, what + " " + tmp, err);
  };

  FileWriter w(fd.get());
  std::string& out = w.buffer();
  const int pid = static_cast<int>(::getpid());
  append(out, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"strata\"",
         ",\"capacity_events\":", capacity_,
         ",\"exported_events\":", spans.size() + counters.size(), ",\"dropped_events\":", dropped,
         "},\"traceEvents\":[\n");
  append(out, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", pid,
         ",\"tid\":0,\"args\":{\"name\":\"strata\"}}");
  for (size_t t = 0; t < tracks.size(); ++t) {
    for (uint32_t lane = 0; lane < lanes_per_track[t]; ++lane) {
      const uint32_t tid = first_tid[t] + lane;
      std::string row = tracks[t];
      if (lane > 0) {
        append(row, " (", lane + 1, ")");
      }
      append(out, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", pid, ",\"tid\":", tid,
             ",\"args\":{\"name\":");
      append_json_string(out, row);
      append(out, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":", pid,
             ",\"tid\":", tid, ",\"args\":{\"sort_index\":", tid, "}}");
    }
  }
  for (size_t i = 0; i < spans.size(); ++i) {
    const TraceEvent& e = *spans[i];
    out += ",\n{\"name\":";
    append_json_string(out, std::string_view(e.name, e.name_len));
    out += ",\"cat\":";
    append_json_string(out, tracks[e.track]);
    append(out, ",\"ph\":\"X\",\"ts\":", e.begin_us, ",\"dur\":", e.end_us - e.begin_us,
           ",\"pid\":", pid, ",\"tid\":", first_tid[e.track] + lane_of[i]);
    const bool tensor = e.tensor_kind != kNoTensorKind;
    if (e.value != kNoBytes || tensor) {
      out += ",\"args\":{";
      if (e.value != kNoBytes) append(out, "\"bytes\":", e.value, tensor ? "," : "");
      if (tensor) {
        out += "\"kind\":";
        append_json_string(out, tensor_kind_name(e.tensor_kind));
        append(out, ",\"layer\":", static_cast<int64_t>(e.tensor_layer));
      }
      out += '}';
    }
    out += '}';
    w.maybe_flush();
  }
  for (const TraceEvent* e : counters) {
    out += ",\n{\"name\":";
    append_json_string(out, std::string_view(e->name, e->name_len));
    append(out, ",\"ph\":\"C\",\"ts\":", e->begin_us, ",\"pid\":", pid,
           ",\"tid\":0,\"args\":{\"value\":", e->value, "}}");
    w.maybe_flush();
  }
  out += "\n]}\n";
  w.flush();
  if (w.error() != 0) {
    return fail("writing", w.error());
  }
  if (::fsync(fd.get()) != 0) {
    return fail("syncing", errno);
  }
  if (::close(fd.release()) != 0) {
    return fail("closing", errno);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail("renaming to " + path + " from", errno);
  }
  // Make the rename itself durable. File systems that cannot sync a directory say EINVAL.
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.valid() && ::fsync(dir_fd.get()) != 0 && errno != EINVAL) {
    return errno_status(STRATA_E_IO, "syncing directory " + dir, errno);
  }
  return Status::ok();
}

ScopedSpan::ScopedSpan(TraceRecorder* recorder, TrackId track, std::string_view name,
                       int64_t bytes) noexcept
    : track_(track), bytes_(bytes) {
  if (recorder == nullptr || !recorder->enabled()) {
    return;
  }
  recorder_ = recorder;
  name_len_ = copy_name(name_, name);
  begin_us_ = recorder->now_us();
}

ScopedSpan::~ScopedSpan() {
  if (recorder_ == nullptr) {
    return;
  }
  recorder_->record_span(track_, std::string_view(name_, name_len_), begin_us_, recorder_->now_us(),
                         bytes_);
}

}  // namespace strata::telemetry
