// The simulator's model of a machine: link rates, latencies, compute times. One flat struct so a
// planner can fill it from datasheets and a validation run can fill it from measurements
// (calibrate(), from a real backend's LinkCounters and the framework's timings).
#pragma once

#include <array>
#include <cstdint>

#include "common/status.h"
#include "sched/tier_backend.h"

namespace strata::sched {

struct DeviceModel {
  // NVMe, bytes per second (1 GB/s = 1e9). One drive (or RAID set) serves both directions:
  // unless full duplex, a read and a write never overlap (they share the drive's time).
  double nvme_read_bytes_per_s = 6.0e9;
  double nvme_write_bytes_per_s = 4.0e9;
  bool nvme_full_duplex = false;
  double nvme_latency_s = 100e-6;  // per transfer, overlapped with the next transfer's service

  // PCIe, each direction on its own.
  double host_to_device_bytes_per_s = 25e9;
  double device_to_host_bytes_per_s = 25e9;
  double pcie_latency_s = 10e-6;
  // A streamed transfer (NVMe <-> device through staging buffers) moves this many bytes per
  // chunk: its NVMe and PCIe legs overlap but for one chunk at the start.
  double stream_chunk_bytes = 4.0 * 1024 * 1024;

  // Compute. A transformer layer's forward and backward (with recomputation if the framework
  // does it) on the GPU; layers outside (embedding, head) scale by their parameter count.
  double forward_seconds_per_layer = 0.05;
  double backward_seconds_per_layer = 0.10;
  // The CPU optimizer (AdamW over fp32 master, m, v), parameters per second.
  double cpu_optimizer_params_per_s = 2.0e9;
  // A host-side overflow check (ZeRO-Infinity's isinf / isnan passes), elements per second.
  double host_overflow_check_elements_per_s = 7.0e9;
  // The TieredOptimizer's measurement of a gradient as backward finishes it (one read-only pass:
  // a non-finite check and the sum of squares), gradient elements per second.
  double host_gradient_scan_elements_per_s = 10.0e9;
  // The framework's own time per phase outside compute and waits: releasing, bookkeeping,
  // launching (a Python training loop's hooks). Not a resource: nothing else waits for it.
  double phase_overhead_seconds = 0;

  // All rates > 0, latencies and times >= 0, all finite.
  Status validate() const;
};

// What a real run measured, to calibrate a DeviceModel with.
struct Measurements {
  // Per link (indexed by Link): the backend's counters over the measured steps. A link with no
  // bytes or no busy time keeps the base model's rate.
  std::array<LinkCounters, kLinkCount> links{};
  // Mean seconds of one transformer layer's forward / backward compute as the framework timed
  // it (CUDA events around the layer, excluding waits in acquire). 0: keep the base value.
  double forward_seconds_per_layer = 0;
  double backward_seconds_per_layer = 0;
  // Parameters the CPU optimizer updated, and the seconds it computed for (excluding waits).
  double optimizer_params = 0;
  double optimizer_seconds = 0;
  // Mean seconds per phase the framework spent outside compute and acquire. < 0: keep the base.
  double phase_overhead_seconds = -1;
};

// The base model with every measured quantity replaced by its measurement: a link's rate is
// bytes / busy_seconds. With a shared (half-duplex) drive, the read and write rates are taken
// from their own counters all the same, since busy time is counted per direction.
Result<DeviceModel> calibrate(const Measurements& measured, const DeviceModel& base = {});

// A drive measured reading alone, writing alone and both at once (`strata bench io --mixed`),
// as the half-duplex drive the model above has: both solo rates scaled by one factor k, so that
// reading and writing at once move what the drive moved with both directions at once. A
// half-duplex drive of rates R and W moves r bytes read and w written in r / R + w / W seconds;
// the mixed measurement moved mixed_read and mixed_write bytes in one second, so
// k = mixed_read / read + mixed_write / write. Why the solo ratio is kept: a step that only
// reads (or writes) for a while still sees the drive's solo proportions. k is capped at 1: a drive
// that serves both directions better than by taking turns (an NVMe drive with spare internal
// bandwidth) keeps its solo rates, since the model never lets a direction run faster than it
// does alone; it then errs slow on that drive's mixed phases.
// The four rates in one unit (bytes or GB per second), each > 0 and finite; the result in it.
struct HalfDuplexRates {
  double read = 0;
  double write = 0;
  double factor = 0;  // k, in (0, 1]
};
Result<HalfDuplexRates> half_duplex_rates(double read, double write, double mixed_read,
                                          double mixed_write);

}  // namespace strata::sched
