// Which tensor a transfer belongs to, for the backend's trace spans ("nvme read" of
// "layers.3.mlp.up_proj.weight", a parameter of layer 3). The scheduler sets it on its own thread
// around each call into the backend (ScopedTransferLabel in Scheduler::issue); the backend copies
// it while that call runs (TransferLabel::current) and names the span with it when the transfer
// completes on another thread. A thread-local rather than a TierBackend parameter keeps the
// backend interface, and its simulated and test implementations, as they are. Names and numbers
// only, never tensor data.
#pragma once

#include <cstdint>

#include "sched/tier_backend.h"
#include "telemetry/trace_recorder.h"
#include "vocabulary/tensor_spec.h"

namespace strata::sched {

struct TransferLabel {
  char name[telemetry::kMaxTraceNameBytes + 1] = {};  // empty: not labelled
  telemetry::SpanTensor tensor;

  bool labelled() const { return name[0] != '\0'; }
  // The label the issuing thread has set, or an empty one.
  static TransferLabel current();
};

// The track a link's transfers are spans on, and the word that names a transfer nobody labelled
// ("read", "write", "h2d", "d2h"): one mapping for the real backend's link meter and the
// simulated backend, so that a run's trace and a plan's have the same rows.
telemetry::TrackId link_track(Link link);
const char* link_word(Link link);

class ScopedTransferLabel {
 public:
  explicit ScopedTransferLabel(const TensorSpec& spec);
  ~ScopedTransferLabel();
  ScopedTransferLabel(const ScopedTransferLabel&) = delete;
  ScopedTransferLabel& operator=(const ScopedTransferLabel&) = delete;
};

}  // namespace strata::sched
