// A TierBackend over modelled devices: nothing is allocated (addresses are fake, bytes are
// counted) and nothing sleeps. Each link is a FIFO server: a transfer occupies it for
// bytes / rate, and completes `latency` later. Completions wait in a queue ordered by virtual
// time (ties: issue order, so runs are deterministic) until the simulator advances the clock;
// then they are posted to the io_context the scheduler uses as its executor and run there.
//
// Thread rules: single-threaded. The simulator's thread drives both the scheduler and this.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <cmath>
#include <cstdint>
#include <queue>
#include <vector>

#include "sched/device_model.h"
#include "sched/tier_backend.h"
#include "telemetry/trace_recorder.h"

namespace strata::sched {

class SimulatedBackend final : public TierBackend {
 public:
  explicit SimulatedBackend(const DeviceModel& model);

  const char* name() const override { return "simulated"; }
  Result<Buffer> allocate(Tier tier, uint64_t bytes, TensorKind kind) override;
  void free(Tier tier, const Buffer& buffer) override;
  Result<Extent> allocate_extent(uint64_t bytes) override;
  void free_extent(const Extent& extent) override;
  Status read(const Extent& from, const Buffer& to_pinned, uint64_t bytes,
              Completion done) override;
  Status write(const Buffer& from_pinned, const Extent& to, uint64_t bytes,
               Completion done) override;
  Status copy_to_device(const Buffer& from_pinned, const Buffer& to_device, uint64_t bytes,
                        Completion done) override;
  Status copy_to_host(const Buffer& from_device, const Buffer& to_pinned, uint64_t bytes,
                      Completion done) override;
  Status copy_range(Link link, const Buffer& from, uint64_t from_offset, const Buffer& to,
                    uint64_t to_offset, uint64_t bytes, Completion done) override;
  Status stream_to_device(const Extent& from, const Buffer& to_device, uint64_t bytes,
                          Completion done) override;
  Status stream_to_nvme(const Buffer& from_device, const Extent& to, uint64_t bytes,
                        Completion done) override;
  LinkCounters link_counters(Link link) const override { return counters_[static_cast<int>(link)]; }

  // The executor the scheduler must be created with.
  boost::asio::io_context& context() { return io_; }

  // Virtual time, seconds since creation.
  double now() const { return now_; }
  // Advances the clock to the earliest pending completion and runs its handler (and anything
  // that handler posts). False when nothing is pending.
  bool deliver_next();
  // deliver_next, when that completion is due at or before `time`; false when none is.
  bool deliver_next_before(double time);
  // Delivers every completion due at or before `time`, in order, then sets the clock to `time`.
  void run_until(double time);
  size_t pending() const { return events_.size(); }

  // Records each transfer from now on as a span on `trace` (not owned; nullptr: none), from its
  // issue to its completion on the virtual clock (microseconds since creation), named by the
  // tensor the scheduler labelled it with, on the link's track: the runtime's trace of a real
  // run, for a simulated one. A streamed transfer is a span on each of its two links.
  void set_trace(telemetry::TraceRecorder* trace) { trace_ = trace; }
  // A time on the virtual clock (seconds) as a trace's microseconds.
  static uint64_t trace_us(double seconds) {
    return static_cast<uint64_t>(std::llround(seconds * 1e6));
  }

  // Bytes allocated now and at most, per memory tier (indexed by memory_index), and on NVMe.
  uint64_t allocated_bytes(Tier tier) const;
  uint64_t peak_allocated_bytes(Tier tier) const;

 private:
  struct Event {
    double time;
    uint64_t sequence;
    Completion done;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.time != b.time ? a.time > b.time : a.sequence > b.sequence;
    }
  };
  // One link's rate, latency and server (the drive's one server unless full duplex).
  struct Server {
    double rate = 0;
    double latency = 0;
    int index = 0;
  };
  Server server_of(Link link) const;
  // Occupies the link's server for bytes / rate from `ready` on; returns when the bytes are done
  // (before the latency), and counts them and the busy time up to `completion`.
  double occupy(Link link, uint64_t bytes, double ready, double* start);
  void count(Link link, uint64_t bytes, double start, double completion);
  void trace_span(Link link, uint64_t bytes, double completion) const;
  Status schedule(Link link, uint64_t bytes, Completion done);
  // A streamed transfer: `first` (the side the bytes leave) and `second` both serve it, the
  // second one chunk behind the first, so it ends one chunk after the slower of the two.
  Status schedule_stream(Link first, Link second, uint64_t bytes, Completion done);
  void deliver(const Event& event);

  DeviceModel model_;
  boost::asio::io_context io_;
  double now_ = 0;
  uint64_t sequence_ = 0;
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  // When each server is next free: the drive (shared by both NVMe directions unless full duplex),
  // and each link; and when each link's last transfer completes (for busy-time accounting).
  std::array<double, kLinkCount> server_free_at_{};
  std::array<double, kLinkCount> busy_until_{};
  std::array<LinkCounters, kLinkCount> counters_{};
  std::array<uint64_t, kTierCount> allocated_{};
  std::array<uint64_t, kTierCount> peak_{};
  uint64_t next_token_ = 1;
  telemetry::TraceRecorder* trace_ = nullptr;
};

}  // namespace strata::sched
