// A device made of host memory, for machines without a GPU: tests and CI run every layer above
// the Device interface unchanged.
//
// Its memory is a memfd (shared memory) mapping, not anonymous memory, so the kernel reports it
// apart (RssShmem, and the memfd's own block count) and host accounting can leave it out exactly.
// Freed ranges keep their pages, as a GPU's slab keeps its memory: the memfd holds the most the
// device has touched (at most its budget), and reusing a range faults nothing in again.
//
// Each copy stream has one worker thread and a fixed-size queue (no allocation per copy): copies
// run in queue order, asynchronously to the caller, and events complete only when the work before
// them has finished: the completion semantics of CUDA streams, which is what the scheduler above
// relies on.
#pragma once

#include <memory>

#include "memory/device.h"

namespace strata::memory {

Result<std::unique_ptr<Device>> open_emulated_device(const DeviceOptions& options);

// Test hooks on an emulated device (dynamic_cast a Device* to reach them): hold a stream's worker
// before its next operation so that a test can observe work that is queued but not done.
class EmulatedDeviceControl {
 public:
  virtual ~EmulatedDeviceControl() = default;
  virtual void pause(CopyStream stream) = 0;
  virtual void resume(CopyStream stream) = 0;
  // Operations queued on the stream and not finished yet.
  virtual uint64_t pending(CopyStream stream) const = 0;
};

}  // namespace strata::memory
