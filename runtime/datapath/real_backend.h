// The scheduler's backend over the real tiers: the extent store (NVMe), the pinned arena and the
// device arena. The scheduler decides; this only allocates and moves bytes, and turns every
// completion - an io_uring CQE, a CUDA event, the emulated device's worker - into a completion
// posted to the scheduler's executor. A host-to-device copy completes only once its event has
// fired, so a device buffer the scheduler hands out is ready: acquire needs no event to wait on.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "datapath/copy_lane.h"
#include "datapath/link_meter.h"
#include "datapath/streamer.h"
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
  // Maps the staging buffers of streamed transfers (datapath/streamer.h); until then, and without
  // it, stream_to_device / stream_to_nvme are STRATA_E_UNSUPPORTED.
  Status start_streaming(const StreamerOptions& options);
  // The pinned bytes the staging buffers hold (0 without streaming).
  uint64_t staging_bytes() const { return streamer_ ? streamer_->staging_bytes() : 0; }
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
  Status copy_range(sched::Link link, const sched::Buffer& from, uint64_t from_offset,
                    const sched::Buffer& to, uint64_t to_offset, uint64_t bytes,
                    sched::Completion done) override;
  Status stream_to_device(const sched::Extent& from, const sched::Buffer& to_device, uint64_t bytes,
                          sched::Completion done) override;
  Status stream_to_nvme(const sched::Buffer& from_device, const sched::Extent& to, uint64_t bytes,
                        sched::Completion done) override;
  void on_release(Tier tier, const sched::Buffer& buffer, void* device_stream) override;
  sched::LinkCounters link_counters(sched::Link link) const override;
  // Each link's busy time and the drive's, at one moment (LinkMeter::busy_times).
  LinkMeter::BusyTimes busy_times() const { return meter_.busy_times(); }

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
  Result<NvmeOp*> take_nvme_op();
  void return_nvme_op(NvmeOp* op);
  // An op for one NVMe transfer on `link`, filled in and counted as started.
  Result<NvmeOp*> start_nvme_op(sched::Link link, uint64_t bytes, sched::Completion done);
  // The store's answer to the submission: a refusal returns the op and ends the link's count.
  Status finish_submission(NvmeOp* o, Status submitted);
  static void on_nvme_done(storage::ExtentIo* io, void* context);
  int32_t io_index(const sched::Buffer& pinned, uint64_t bytes) const;

  storage::SwapStore& store_;
  memory::PinnedArena& arena_;
  memory::Device& device_;
  const RealBackendOptions options_;
  LinkMeter meter_;

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

  // The destructor stops these (the streamer first: it copies on the lanes) before it frees the
  // buffers they may still be completing copies into.
  std::unique_ptr<CopyLane> h2d_;
  std::unique_ptr<CopyLane> d2h_;
  std::unique_ptr<Streamer> streamer_;
};

}  // namespace strata::datapath
