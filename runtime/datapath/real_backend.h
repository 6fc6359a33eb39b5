// The scheduler's backend over the real tiers: the extent store (NVMe), the pinned arena and the
// device arena. The scheduler decides; this only allocates and moves bytes, and turns every
// completion - an io_uring CQE, a CUDA event, the emulated device's worker - into a completion
// posted to the scheduler's executor. A host-to-device copy completes only once its event has
// fired, so a device buffer the scheduler hands out is ready: acquire needs no event to wait on.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "memory/device.h"
#include "memory/pinned_arena.h"
#include "memory/pinned_recycler.h"
#include "sched/tier_backend.h"
#include "sched/transfer_label.h"
#include "storage/swap_store.h"
#include "telemetry/trace_recorder.h"

namespace strata::datapath {

struct RealBackendOptions {
  // Transfers in flight at once per NVMe direction; the scheduler's per-link limits stay below.
  uint32_t max_nvme_ops = 256;
  // Device copies waiting for their event at once, per direction.
  uint32_t max_copy_ops = 256;
  telemetry::TraceRecorder* trace = nullptr;  // may be nullptr
};

class RealBackend final : public sched::TierBackend {
 public:
  RealBackend(storage::SwapStore& store, memory::PinnedArena& arena, memory::Device& device,
              const RealBackendOptions& options);
  // Waits for every transfer it started; the scheduler has already done so when it is destroyed
  // first, which is the intended order.
  ~RealBackend() override;
  RealBackend(const RealBackend&) = delete;
  RealBackend& operator=(const RealBackend&) = delete;

  const char* name() const override { return "real"; }
  Result<sched::Buffer> allocate(Tier tier, uint64_t bytes, TensorKind kind) override;
  void free(Tier tier, const sched::Buffer& buffer) override;
  Result<sched::Extent> allocate_extent(uint64_t bytes) override;
  void free_extent(const sched::Extent& extent) override;
  Status read(const sched::Extent& from, const sched::Buffer& to_pinned, uint64_t bytes,
              sched::Completion done) override;
  Status write(const sched::Buffer& from_pinned, const sched::Extent& to, uint64_t bytes,
               sched::Completion done) override;
  Status copy_to_device(const sched::Buffer& from_pinned, const sched::Buffer& to_device,
                        uint64_t bytes, sched::Completion done) override;
  Status copy_to_host(const sched::Buffer& from_device, const sched::Buffer& to_pinned,
                      uint64_t bytes, sched::Completion done) override;
  Status stream_to_device(const sched::Extent& from, const sched::Buffer& to_device, uint64_t bytes,
                          sched::Completion done) override;
  Status stream_to_nvme(const sched::Buffer& from_device, const sched::Extent& to, uint64_t bytes,
                        sched::Completion done) override;
  void on_release(Tier tier, const sched::Buffer& buffer, void* device_stream) override;
  sched::LinkCounters link_counters(sched::Link link) const override;

 private:
  // One NVMe transfer in flight: caller-owned storage for the extent store's request.
  struct NvmeOp {
    storage::ExtentIo io;
    sched::Completion done;
    sched::TransferLabel label;  // the tensor, for the trace span
    sched::Link link = sched::Link::kNvmeRead;
    RealBackend* backend = nullptr;
    uint64_t bytes = 0;
    uint64_t begin_us = 0;
    uint32_t slot = 0;
  };
  // One device copy waiting for its event.
  struct CopyOp {
    memory::Event event;
    sched::Completion done;
    sched::TransferLabel label;
    uint64_t bytes = 0;
    uint64_t begin_us = 0;
  };
  // Completes device copies in stream order: a thread per direction waits on each event in turn.
  struct CopyLane {
    sched::Link link = sched::Link::kHostToDevice;
    memory::CopyStream stream = memory::CopyStream::kHostToDevice;
    std::mutex mutex;
    std::condition_variable changed;
    std::deque<CopyOp> queue;
    uint32_t waiting = 0;  // ops queued or being waited on
    std::thread thread;
  };
  struct LinkState {
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> transfers{0};
    // Busy time: the clock runs while at least one transfer is in flight on the link.
    mutable std::mutex mutex;
    uint32_t inflight = 0;
    uint64_t busy_since_us = 0;
    uint64_t busy_us = 0;
  };

  Result<NvmeOp*> take_nvme_op();
  void return_nvme_op(NvmeOp* op);
  // An op for one NVMe transfer on `link`, filled in and counted as started.
  Result<NvmeOp*> start_nvme_op(sched::Link link, uint64_t bytes, sched::Completion done);
  // The store's answer to the submission: a refusal returns the op and ends the link's count.
  Status finish_submission(NvmeOp* o, Status submitted);
  static void on_nvme_done(storage::ExtentIo* io, void* context);
  Status start_copy(CopyLane& lane, void* dst, const void* src, uint64_t bytes,
                    sched::Completion done);
  void run_lane(CopyLane& lane);
  void link_started(sched::Link link);
  // what: the span's fallback name (null: no span); label, when it names a tensor, replaces it.
  void link_finished(sched::Link link, uint64_t bytes, uint64_t begin_us, const char* what,
                     const sched::TransferLabel* label = nullptr);
  uint64_t now_us() const;
  int32_t io_index(const sched::Buffer& pinned, uint64_t bytes) const;

  storage::SwapStore& store_;
  memory::PinnedArena& arena_;
  memory::Device& device_;
  const RealBackendOptions options_;
  const std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();

  // Buffers the scheduler holds, by token. Guarded by buffers_mutex_ (calls arrive under the
  // scheduler's lock, but completions come from other threads).
  mutable std::mutex buffers_mutex_;
  // Pinned buffers come from and go back to the recycler: steady-state steps map nothing.
  memory::PinnedRecycler pinned_recycler_{arena_};
  // The kind is what the recycler's trace records on give-back (STRATA_PINNED_TRACE).
  struct PinnedEntry {
    memory::PinnedBuffer buffer;
    TensorKind kind = TensorKind::kOther;
  };
  std::unordered_map<uint64_t, PinnedEntry> pinned_;
  std::unordered_map<uint64_t, void*> device_buffers_;
  // No table of extents: a sched::Extent carries the store's whole handle (id, offset, capacity),
  // and the store keeps what is known of each extent's content. One record per fact.
  uint64_t next_token_ = 1;

  std::mutex nvme_mutex_;
  std::condition_variable nvme_idle_;
  std::vector<std::unique_ptr<NvmeOp>> nvme_ops_;
  std::vector<uint32_t> free_nvme_ops_;

  std::array<LinkState, sched::kLinkCount> links_;
  std::array<telemetry::TrackId, sched::kLinkCount> tracks_{};
  CopyLane h2d_;
  CopyLane d2h_;
  std::atomic<bool> stopping_{false};
};

}  // namespace strata::datapath
