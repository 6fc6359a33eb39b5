// The runtime's pinned requests, as a file: every take and give-back of the pinned recycler, in
// order, with what it cost. `strata bench pool --trace FILE` replays such a file through the
// recycler itself and through the pool policies it is compared with, so that the benchmark
// measures what the runtime really asks for rather than a model of it.
//
// Recording is off unless STRATA_PINNED_TRACE names a file when the recycler is made (one
// recorder per process: a second recycler in the same process would truncate the file). Off, it
// costs the recycler one null check per call.
//
// Format (text, one event per line, '#' starts a comment):
//   budget <bytes>                                    the arena's pinned budget
//   take <id> <bytes> <reserved> <kind> <reused> <ns> a buffer handed out
//   give <id> <reserved> <kind>                       that buffer given back
// id is the buffer's address: live at most once at a time, so a give names exactly one take.
// reused is 1 when a kept buffer served the take, 0 when it was mapped; ns is the take's wall time.
//
// Thread rules: record() from any thread, concurrently.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "vocabulary/tensor_spec.h"

namespace strata::memory {

inline constexpr const char* kPinnedTraceVariable = "STRATA_PINNED_TRACE";

struct PinnedTraceEvent {
  enum class Op : uint8_t { kTake, kGive };
  Op op = Op::kTake;
  uint64_t id = 0;
  uint64_t bytes = 0;     // asked for (take only)
  uint64_t reserved = 0;  // the buffer's reserved size
  TensorKind kind = TensorKind::kOther;
  bool reused = false;  // take only
  uint64_t ns = 0;      // take only
};

struct PinnedTrace {
  uint64_t budget_bytes = 0;
  std::vector<PinnedTraceEvent> events;
};

class PinnedTraceWriter {
 public:
  // The writer STRATA_PINNED_TRACE asks for, or nullptr when it is unset or empty. A file that
  // cannot be opened is reported on stderr once and recording stays off: a trace is a diagnostic
  // and must not stop a training run.
  static std::unique_ptr<PinnedTraceWriter> from_environment(uint64_t budget_bytes);
  static Result<std::unique_ptr<PinnedTraceWriter>> open(const std::string& path,
                                                         uint64_t budget_bytes);
  ~PinnedTraceWriter();
  PinnedTraceWriter(const PinnedTraceWriter&) = delete;
  PinnedTraceWriter& operator=(const PinnedTraceWriter&) = delete;

  void record(const PinnedTraceEvent& event);

 private:
  explicit PinnedTraceWriter(std::FILE* file) : file_(file) {}
  std::mutex mutex_;
  std::FILE* file_;  // guarded by mutex_
};

// STRATA_E_IO when the file cannot be read; STRATA_E_INVALID, with the line number, on a line
// that is not an event, or on a give whose id is not live.
Result<PinnedTrace> read_pinned_trace(const std::string& path);

}  // namespace strata::memory
