// What each link between the tiers carried and for how long it was busy (the scheduler's
// calibration reads it through TierBackend::link_counters), with the trace's in-flight counters
// and spans. Every transfer the real backend makes - a whole buffer, or one chunk of a stream -
// starts and finishes here, so a link's bytes / busy time is the rate it delivered.
//
// Thread rules: any thread, concurrently (transfers finish on I/O and copy threads).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "sched/tier_backend.h"
#include "sched/transfer_label.h"
#include "telemetry/trace_recorder.h"

namespace strata::datapath {

class LinkMeter {
 public:
  explicit LinkMeter(telemetry::TraceRecorder* trace) : trace_(trace) {}
  LinkMeter(const LinkMeter&) = delete;
  LinkMeter& operator=(const LinkMeter&) = delete;

  // On the trace's clock when there is one, so spans line up with the rest of the trace.
  uint64_t now_us() const;

  void started(sched::Link link);
  // bytes: what arrived (0 for a failure). what: the span's fallback name (null: no span);
  // label, when it names a tensor, replaces it.
  void finished(sched::Link link, uint64_t bytes, uint64_t begin_us, const char* what,
                const sched::TransferLabel* label = nullptr);

  sched::LinkCounters counters(sched::Link link) const;

  // Busy time in microseconds, all read at one moment: per link, and the drive's, during which
  // at least one NVMe transfer, read or write, was in flight. Where reads and writes ran at once
  // the drive's is less than the two NVMe links' sum; it is never less than the larger of them.
  // Bytes over the drive's busy time are what it delivered as one half-duplex device
  // (docs/telemetry.md).
  struct BusyTimes {
    std::array<uint64_t, sched::kLinkCount> link_us{};
    uint64_t drive_us = 0;
  };
  BusyTimes busy_times() const;

 private:
  // The clock runs while at least one transfer is in flight. Guarded by busy_mutex_.
  struct BusyClock {
    uint32_t inflight = 0;
    uint64_t busy_since_us = 0;
    uint64_t busy_us = 0;

    // Both return the transfers in flight after the event (the trace's queue track).
    uint32_t start(uint64_t now_us);
    uint32_t finish(uint64_t now_us);
    uint64_t read(uint64_t now_us) const;
  };
  struct LinkState {
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> transfers{0};
  };

  telemetry::TraceRecorder* const trace_;
  const std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  std::array<LinkState, sched::kLinkCount> links_;
  // One lock for every clock, and the time read under it, so that each event and each snapshot
  // has one moment: the drive's clock then never reads less than a link's. Transfers are whole
  // buffers or chunks (4 KiB and up, thousands a second at most), so it is rarely contended.
  mutable std::mutex busy_mutex_;
  std::array<BusyClock, sched::kLinkCount> link_clocks_;
  BusyClock drive_clock_;  // both NVMe links
};

}  // namespace strata::datapath
