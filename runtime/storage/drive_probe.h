// How fast the drive behind the NVMe tier is, and how many requests it needs in flight to get
// there: the "measured" drive of the automatic pinned budget (sched/pinned_sizing.h). Writes a
// region at the start of the backing device (before the extent store hands out any of it), then
// reads it back at rising queue depths, one request size throughout, and finds the knee: the
// least queue depth that reaches 90% of the best read rate. Pinned memory beyond that buys
// nothing; below it the drive idles.
//
// Cold path: a few hundred milliseconds at creation. One buffer per request slot, of huge pages
// and registered with the engine as the runtime's pinned memory is, so that the figures are the
// ones that memory gets (a virtualised disk serves 4 KiB-page buffers several times slower); at
// most kMaxProbeQueueDepth requests of it, no more slots than the region has requests, and at
// most max_buffer_bytes in all (the buffers are written and registered, so all of it is
// resident while the probe runs), unmapped when the probe ends.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "io/io_engine.h"
#include "storage/backing_device.h"

namespace strata::storage {

// The runtime keeps at most 64 NVMe transfers in flight per direction (api/runtime.cpp).
inline constexpr uint32_t kMaxProbeQueueDepth = 64;
// The probe's buffers in all: 64 requests of the default 1 MiB block, 4 of the largest, 64 MiB
// (config_fuzz found 64 x 64 MiB, 4 GiB resident for the creation of a runtime).
inline constexpr uint64_t kMaxProbeBufferBytes = uint64_t{256} << 20;

struct DriveProbeOptions {
  uint64_t region_bytes = uint64_t{64} << 20;  // written once, read at each depth (capped at half
                                               // the capacity)
  uint64_t request_bytes = 0;                  // 0: the engine's block size
  uint32_t max_queue_depth = 0;                // 0: the engine's queue depth; at most
                                               // kMaxProbeQueueDepth
  uint64_t max_buffer_bytes = kMaxProbeBufferBytes;  // the slots' buffers in all (>= a request)
};

struct DriveProbe {
  struct Level {
    uint32_t queue_depth = 0;
    double read_bytes_per_s = 0;
    double latency_s = 0;  // mean time a request spends in flight (Little's law)
  };
  uint64_t request_bytes = 0;
  double write_bytes_per_s = 0;  // at the deepest queue
  double read_bytes_per_s = 0;   // the best level's
  uint32_t knee_queue_depth = 0;
  double knee_latency_s = 0;
  bool direct_io = true;  // false: through the page cache, which the figures then measure
  std::vector<Level> levels;
};

Result<DriveProbe> probe_drive(const BackingDevice& device, io::IoEngine& engine,
                               const DriveProbeOptions& options = {});

}  // namespace strata::storage
