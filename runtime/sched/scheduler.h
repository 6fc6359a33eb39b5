// The scheduler: decides what moves between NVMe, pinned memory and the device, and when. It
// owns the tensor registry, follows the access schedule (recorded during the first step, or
// declared), prefetches as far ahead as the pool budgets allow, evicts by Belady's rule (the
// tensor whose next use is farthest), writes dirty data back before its buffer is reused, and
// bounds the transfers in flight per link. It never moves bytes itself: it issues work to a
// TierBackend and reacts to completions posted to a Boost.Asio executor. The same code drives the
// real tiers and the simulator's modelled ones.
//
// Thread rules: every public member may be called from any thread, concurrently, except that
// the phase calls (begin_step, end_step, begin_phase, end_phase, declare_schedule) come from one
// thread at a time (the training thread), and the destructor must not race with anything.
// acquire, sync, flush and unregister_tensor block (each with a time bound); everything else only
// takes the lock. One mutex guards all residency state; completions take it too, so a backend
// must never deliver them inline (tier_backend.h).
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "sched/access_lanes.h"
#include "sched/access_schedule.h"
#include "sched/memory_plan.h"
#include "sched/policy.h"
#include "sched/residency.h"
#include "sched/tensor_registry.h"
#include "sched/tier_backend.h"
#include "vocabulary/tensor_spec.h"

namespace strata::sched {

struct SchedulerConfig {
  MemoryPlan memory;                // pools and budgets (strata_memory_plan, zero_infinity_...)
  uint32_t max_tensors = 1u << 20;  // live registrations, at most kMaxHandleIndex + 1
  // Tags every handle this scheduler issues, so a handle of another runtime is refused. The C
  // API gives each live runtime its own.
  uint16_t handle_owner = 0;
  // Transfers in flight per link (indexed by Link). They bound the backend's queues, so no queue
  // anywhere grows with the model; each is 1..kMaxInflightPerLink.
  std::array<uint32_t, kLinkCount> max_inflight = {8, 8, 4, 4};
  PrefetchWindow window;
  // Write-behind: each pool keeps this fraction of its budget free, clean or being cleaned, so
  // evictions seldom wait for a write. 0 disables (dirty data is then written only on eviction).
  double clean_headroom = 0.10;
  bool record_first_step = true;      // no declared schedule: record the first step's accesses
  uint32_t max_prefetch_hints = 256;  // prefetch() hints kept; the oldest is dropped beyond
  uint32_t max_waiting = 1024;        // acquires waiting at once (STRATA_E_LIMIT beyond)
  // Tests: check_invariants() after every pump, aborting with its message on a disagreement.
  // Costs a scan of every record per pump, so it is off for real runs and large simulations.
  bool check_invariants = false;
};

inline constexpr uint32_t kMaxInflightPerLink = 4096;

// What an acquire hands out; valid until the matching release.
struct Acquired {
  void* data = nullptr;
  uint64_t bytes = 0;
  uint64_t buffer_token = 0;  // the backend's Buffer::token (e.g. to find a CUDA event)
};

enum class AcquireState : uint8_t { kReady, kPending };
struct AcquireAttempt {
  AcquireState state = AcquireState::kPending;
  Acquired acquired;  // when kReady
};

// A snapshot of one tensor, for the C API, tools and tests.
struct TensorInfo {
  std::string name;
  uint64_t bytes = 0;
  TensorKind kind = TensorKind::kOther;
  DType dtype = DType::kUInt8;
  int32_t layer = -1;
  Tier home = Tier::kNvme;
  Residency residency = Residency::kUnwritten;
  TierMask valid = 0;
  uint32_t uses = 0;
  Tier use_tier = Tier::kDevice;  // the latest acquire's tier, also after its release
  bool has_error = false;         // an asynchronous failure waits to be reported
  bool allocation = false;        // made by strata_malloc
  bool read_only = false;         // registered with STRATA_TENSOR_READ_ONLY
};

struct TierUsage {
  uint64_t reserved_bytes = 0;  // held whatever the use (reserved pools)
  uint64_t in_use_bytes = 0;    // charged to buffers now
  uint64_t peak_in_use_bytes = 0;
  uint64_t footprint_bytes = 0;  // what the tier holds: sum over pools of max(reserved, in use)
  uint64_t peak_footprint_bytes = 0;
  std::array<uint64_t, kTensorKindCount> kind_in_use_bytes{};
  std::array<uint64_t, kTensorKindCount> kind_peak_in_use_bytes{};
};

struct PoolUsage {
  std::string name;
  Tier tier = Tier::kPinned;
  uint64_t budget_bytes = 0;
  uint64_t reserved_bytes = 0;
  uint64_t in_use_bytes = 0;
  uint64_t peak_in_use_bytes = 0;
  uint32_t buffers = 0;
};

struct SchedulerStats {
  std::array<uint64_t, kLinkCount> link_bytes{};  // completed transfers
  std::array<uint64_t, kLinkCount> link_transfers{};
  std::array<uint32_t, kLinkCount> inflight{};
  uint64_t acquires = 0;
  uint64_t acquire_hits = 0;   // resident on the first try
  uint64_t acquire_waits = 0;  // had to wait for a transfer
  uint64_t acquire_timeouts = 0;
  uint64_t prefetch_transfers = 0;  // issued ahead of any demand (schedule walk, hints)
  uint64_t demand_transfers = 0;    // issued for an acquire that was waiting
  uint64_t evictions = 0;           // buffers freed to make room
  uint64_t cleanings = 0;           // write-backs / device->host copies started to make room
  uint64_t arena_retries = 0;       // victims that left because the arena, not the count, refused
  uint64_t transfer_failures = 0;
  uint64_t unscheduled_phases = 0;  // begin_phase keys the schedule does not have
  uint64_t dirty_bytes = 0;         // tensors whose newest copy is not on NVMe
  // Completed NVMe transfers by the tensor's kind (a tensor's bytes each), for strata_stats.
  std::array<uint64_t, kTensorKindCount> nvme_read_by_kind{};
  std::array<uint64_t, kTensorKindCount> nvme_written_by_kind{};
  uint32_t live_tensors = 0;
  uint32_t schedule_phases = 0;  // 0: no schedule yet
  bool recording = false;
  std::array<TierUsage, kMemoryTierCount> tiers{};  // indexed by memory_index(Tier)
  TierUsage nvme;  // the NVMe extents tensors hold (in use = footprint; nothing is reserved)
  std::vector<PoolUsage> pools;
};

class Scheduler final : public CompletionSink {
 public:
  // The backend must outlive the scheduler; completions run on `executor`.
  static Result<std::unique_ptr<Scheduler>> create(const SchedulerConfig& config,
                                                   TierBackend& backend,
                                                   boost::asio::any_io_executor executor);
  // Waits for every transfer in flight (they hold buffers), then frees all buffers and extents.
  ~Scheduler() override;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // ---- Registry ----
  // STRATA_E_INVALID (0 bytes, bad home, no pool for the home tier, a tensor that does not fit
  // a uniform slot), STRATA_E_LIMIT, or the backend's error for contents_on_nvme.
  Result<TensorHandle> register_tensor(const TensorSpec& spec, const RegisterOptions& options = {});
  // Frees every copy. STRATA_E_STATE while acquired or awaited; waits (bounded by `timeout`) for a
  // transfer in flight.
  Status unregister_tensor(TensorHandle tensor,
                           std::chrono::nanoseconds timeout = std::chrono::seconds(60));
  Result<TensorInfo> describe(TensorHandle tensor) const;
  // RegisterOptions::read_only of a live tensor (describe() without copying its name: the C API
  // asks on every dirty release).
  Result<bool> read_only(TensorHandle tensor) const;

  // ---- Schedule and position (training thread) ----
  // Replaces any recorded or declared schedule; prefetch follows it from its first phase.
  Status declare_schedule(AccessSchedule schedule);
  // Whether a schedule (declared or recorded) drives prefetch: without one, only hints do.
  bool has_schedule() const;
  // Starts recording when there is no schedule and config.record_first_step.
  Status begin_step();
  // Ends recording (the recording becomes the schedule). Returns the first asynchronous failure
  // (write-back, device->host copy) since the last report, else OK.
  Status end_step();
  // Moves the cursor to the next phase with this key (wrapping): prefetch looks ahead from it.
  Status begin_phase(PhaseKey key);
  Status end_phase(PhaseKey key);

  // ---- Access ----
  // Makes the tensor resident on `tier` (kDevice or kPinned) and keeps it there until release.
  // kOverwrite: the old contents are not loaded (DISCARD); the tensor is then dirty whatever the
  // release says. Reading a tensor that has no contents yet (never written, or discarded) is
  // STRATA_E_STATE. Acquires nest on one tier; acquiring on the other tier while acquired, or
  // kOverwrite while acquired, is STRATA_E_STATE. Errors: STRATA_E_TIMEOUT after `timeout`
  // (the message says what it waited for), STRATA_E_PINNED_BUDGET / DEVICE_BUDGET when the
  // tensor can never fit, the I/O error of a failed read or copy (reported once; the next
  // acquire retries), STRATA_E_BAD_HANDLE.
  Result<Acquired> acquire(TensorHandle tensor, Tier tier, AccessMode mode,
                           std::chrono::nanoseconds timeout);
  // The same without blocking (the simulator's framework is single-threaded on a virtual
  // clock): kReady counts as an acquire; kPending registers the demand, so the scheduler
  // prioritises it, until a later attempt succeeds or cancel_acquire.
  Result<AcquireAttempt> try_acquire(TensorHandle tensor, Tier tier, AccessMode mode);
  Status cancel_acquire(TensorHandle tensor, Tier tier);
  // Ends one acquire. dirty: the caller modified the data; it becomes the only valid copy and is
  // written back before its buffer is reused. device_stream: see TierBackend::on_release. The
  // release always happens; a non-OK return reports an earlier asynchronous failure of this
  // tensor (e.g. its last write-back), once.
  Status release(TensorHandle tensor, bool dirty, void* device_stream = nullptr);
  // A hint after release: the caller will not acquire the tensor again soon (the optimizer, a
  // sub-group it has updated), so write-behind may write its dirty copy back now, though the
  // schedule's current phase lists it (write-behind otherwise keeps such data, as likely to be
  // modified again), and a prefetch may evict it (with no schedule, before any other tensor).
  // Holds until the tensor is acquired, hinted or read in again; never blocks. STRATA_E_STATE
  // while acquired.
  // kNow: a dirty copy in pinned memory is written back as soon as the NVMe write link has a
  // free slot, in the order of these calls, whatever the pool's headroom: the optimizer's
  // write-through (policy.h, optimizer_writes_through), which makes the bytes a step writes one
  // figure rather than a product of when each room was asked for.
  enum class WriteBack : uint8_t { kWhenRoomIsNeeded, kNow };
  Status write_behind(TensorHandle tensor, WriteBack when = WriteBack::kWhenRoomIsNeeded);
  // The contents are dead (e.g. gradients after the optimizer step): buffers freed, nothing
  // written back, the tensor becomes Unwritten. Deferred until a transfer in flight ends.
  Status discard(TensorHandle tensor);
  // Takes the tensor's buffer on `tier` now (strata_malloc: memory is reserved at the call), by
  // one acquire with kOverwrite and a release: the contents are then the buffer's (undefined)
  // and count as written. Errors are acquire's, and one more: room held by tensors in use, at
  // home in the pool or with an unreported failed write-back is the budget error at once (an
  // allocator does not wait for releases); evictions and write-backs are waited for.
  Status reserve(TensorHandle tensor, Tier tier, std::chrono::nanoseconds timeout);
  // A hint: bring the tensor toward `tier` ahead of time, evicting only tensors not needed in
  // the current phase. Never blocks; hints beyond max_prefetch_hints push out the oldest.
  Status prefetch(TensorHandle tensor, Tier tier);

  // ---- Ranges of tensors in use ----
  // Starts copying `bytes` from `from`'s copy on from_tier (at from_offset) into `to`'s copy on
  // to_tier (at to_offset), one tier the device and the other pinned: for a consumer that works
  // through a device tensor in pinned pieces (the optimizer reads a gradient and writes a
  // parameter chunk by chunk) with no pinned buffer of the tensor's size. Both tensors must be
  // held by the caller (acquired on those tiers), so their copies stay where they are while the
  // copy runs; it changes no residency (release `to` dirty, as after any write, once its bytes
  // are final). Waits for room on the link (bounded by timeout) and returns a ticket, which
  // wait_copy_range redeems; every ticket must be redeemed before its tensors are released.
  // STRATA_E_STATE unless both are held there, STRATA_E_INVALID for a range outside either,
  // STRATA_E_LIMIT past kMaxRangeCopies tickets not yet redeemed.
  Result<uint64_t> start_copy_range(TensorHandle from, Tier from_tier, uint64_t from_offset,
                                    TensorHandle to, Tier to_tier, uint64_t to_offset,
                                    uint64_t bytes, std::chrono::nanoseconds timeout);
  // Waits for the copy and returns its outcome. STRATA_E_TIMEOUT leaves the copy running and its
  // ticket given up; release() refuses either tensor (STRATA_E_STATE) until it has ended.
  Status wait_copy_range(uint64_t ticket, std::chrono::nanoseconds timeout);
  // Without waiting: false while the copy runs; true once it has ended, the ticket then redeemed
  // (the copy's error if it failed). For the simulator, whose copies end only when it delivers
  // them. STRATA_E_STATE for an unknown or redeemed ticket.
  Result<bool> poll_copy_range(uint64_t ticket);
  static constexpr uint32_t kMaxRangeCopies = 64;

  // ---- Durability ----
  // Waits until no write-back is in flight; returns the first unreported asynchronous failure.
  Status sync(std::chrono::nanoseconds timeout);
  // Writes every dirty tensor not in use back to NVMe (device copies streamed, or via pinned
  // memory without streaming), then sync.
  Status flush(std::chrono::nanoseconds timeout);
  // Stops issuing prefetches (demands and write-behind continue). The simulator pauses prefetch
  // before draining its event queue at the end of a run.
  void set_prefetch_enabled(bool enabled);
  // Transfers in flight now (the simulator's progress check).
  uint32_t inflight_transfers() const;

  SchedulerStats stats() const;
  // Recounts from the tensor records every total the scheduler keeps running (each pool's used
  // bytes and resident list, per-tier and per-kind bytes, cleaning bytes, transfers in flight per
  // link) and checks each tensor's buffers, pool positions and transfer against its residency.
  // OK, or STRATA_E_INTERNAL naming the first disagreement. It scans every record: tests run it
  // after every pump (SchedulerConfig::check_invariants); it is not for the hot path.
  Status check_invariants() const;
  // One tier's usage (device, pinned or NVMe): cheap (no scan), for samplers and the simulator.
  TierUsage tier_usage(Tier tier) const;
  // What the device, pinned and NVMe tiers hold, by kind, now and at their peaks, in one snapshot:
  // the record strata_get_stats reads (there is no other count of bytes in use).
  struct Usage {
    TierUsage device, pinned, nvme;
  };
  Usage usage() const;
  // Peaks restart from the current values (to measure one step).
  void reset_peaks();

  // CompletionSink: backends post these; not for other callers.
  void on_transfer_complete(uint32_t op, Status status) override;
  boost::asio::any_io_executor completion_executor() const override { return executor_; }

  // The transfers the scheduler issues (public for messages; nothing else uses them).
  enum class OpKind : uint8_t {
    kRead,            // NVMe -> pinned
    kWriteBack,       // pinned -> NVMe
    kCopyToDevice,    // pinned -> device
    kCopyToHost,      // device -> pinned
    kStreamToDevice,  // NVMe -> device through the staging buffers
    kStreamToNvme,    // device -> NVMe through the staging buffers
    kRangeToDevice,   // a byte range, pinned -> device, between tensors in use
    kRangeToHost,     // a byte range, device -> pinned, between tensors in use
  };
  static constexpr Link link_of(OpKind kind) {
    switch (kind) {
      case OpKind::kRead:
      case OpKind::kStreamToDevice:
        return Link::kNvmeRead;
      case OpKind::kWriteBack:
      case OpKind::kStreamToNvme:
        return Link::kNvmeWrite;
      case OpKind::kCopyToDevice:
      case OpKind::kRangeToDevice:
        return Link::kHostToDevice;
      case OpKind::kCopyToHost:
      case OpKind::kRangeToHost:
        return Link::kDeviceToHost;
    }
    return Link::kNvmeRead;
  }

 private:
  struct Op {
    OpKind kind = OpKind::kRead;
    Link link = Link::kNvmeRead;
    uint32_t tensor = 0;
    bool cleaning = false;  // started to make room (counted in the pool's cleaning bytes)
    bool active = false;
    uint32_t range = kNoRange;  // a range copy's slot in range_copies_, else kNoRange
    uint32_t source = 0;        // a range copy's source tensor (`tensor` is its target)
  };
  static constexpr uint32_t kNoRange = UINT32_MAX;
  // A range copy's outcome until its ticket is redeemed. ticket 0: a free slot.
  struct RangeCopy {
    uint64_t ticket = 0;
    bool done = false;
    bool abandoned = false;  // its waiter timed out: the completion frees the slot
    uint64_t bytes = 0;
    Status status;
  };
  // The slot of a ticket not yet redeemed (STRATA_E_STATE otherwise), and its redemption: the
  // copy's outcome, the slot freed. Under mu_.
  Result<RangeCopy*> range_copy_locked(uint64_t ticket);
  Status redeem_locked(RangeCopy& copy);
  struct PoolState {
    // The victim sets' nodes come from `nodes` (the scheduler's pool resource), which keeps
    // freed nodes for reuse: once the sets have held their most, listing allocates nothing.
    explicit PoolState(std::pmr::memory_resource* nodes)
        : victims{VictimSet(nodes), VictimSet(nodes)} {}
    PoolSpec spec;
    uint64_t used = 0;
    uint64_t peak = 0;
    uint64_t cleaning = 0;  // bytes whose cleaning transfer is in flight
    // Bytes that demands and prefetch hints found no room for in this pump (tallied afresh by
    // each): write-behind cleans ahead for them too, so their reads start as writes end,
    // several at a time, instead of one read per write.
    uint64_t waiting = 0;
    // Bytes of residents that could go at once, without a write (droppable()): kept up to date
    // by note_state, so write-behind sees whether the pool has its headroom without a scan.
    uint64_t droppable = 0;
    std::vector<uint32_t> resident;  // tensors holding a buffer here
    // The eviction candidates (evictable_unless_advancing), clean [0] and dirty [1] apart, each in
    // choose_victim's order, best first: kept by note_state and move_cursor, so that choosing a
    // victim reads the first entries instead of scanning every resident.
    VictimSet victims[2];
  };
  enum class Space : uint8_t { kReady, kWaiting, kImpossible };
  // kBlocked: no room in the pool yet; kLinkBusy: the link is at its in-flight limit.
  enum class Step : uint8_t { kResident, kInFlight, kIssued, kBlocked, kLinkBusy, kSkip, kError };
  struct StepResult {
    Step step = Step::kSkip;
    Status status;  // kError
    // Set when kLinkBusy was found before any room was made, or kBlocked because ensure_space
    // waited: the link the transfer would take. The pool is that of staged_on's tier, the bytes
    // the record's charge there; an unchanged record meets the same refusal while the link is
    // full, or the pool has no room (hint_room_waits).
    std::optional<Link> refused_link;
  };
  struct Demand {
    TensorHandle tensor;
    Tier tier = Tier::kDevice;
    AccessMode mode = AccessMode::kRead;
  };

  Scheduler(const SchedulerConfig& config, TierBackend& backend,
            boost::asio::any_io_executor executor);

  // All of these run with mu_ held.
  Result<AcquireAttempt> attempt_locked(uint32_t index, Tier tier, AccessMode mode);
  StepResult advance(TensorRecord& r, Tier target, uint64_t min_next_use, bool prefetch);
  Space ensure_space(int pool, uint64_t need, uint64_t min_next_use, Status* why);
  // Starts writing r's copy on tier back (device data to pinned memory, pinned data to NVMe);
  // false when it cannot start now. *impossible, when given, receives why if it never can.
  bool start_cleaning(TensorRecord& r, Tier tier, uint64_t min_next_use,
                      Status* impossible = nullptr);
  bool yield_staging_of_advancing(int pinned_pool);
  // Whether r's device data, when cleaned, streams to NVMe through the staging buffers (no pinned
  // room) rather than going to pinned memory first: start_cleaning's choice, and the one
  // device_room_with_pinned_closed counts by.
  bool streams_out_of_device(const TensorRecord& r) const;
  // The bytes of the pool that could ever be free: its free room plus every resident's charge but
  // those held until a call (home tensors, failed write-backs). *failed_holder, when given,
  // receives one resident held by an unreported failure, if any.
  uint64_t freeable_bytes(const PoolState& pool, Tier tier,
                          const TensorRecord** failed_holder = nullptr) const;
  // A demand in a device pool whose dirty victim can never be cleaned, because the pinned pool its
  // copy must pass through can never hold it (`closed`, from start_cleaning): kImpossible when
  // what the device pool could still free, without the residents whose way out is just as
  // closed, is less than `need`, with why in *why; else kWaiting.
  Space device_room_with_pinned_closed(const PoolState& pool, uint64_t need,
                                       const TensorRecord& victim, const Status& closed,
                                       Status* why);
  Status issue(TensorRecord& r, OpKind kind, bool cleaning, bool prefetch);
  void complete_locked(uint32_t id, Status status);
  // The earliest unreported durability failure of a live tensor (with how many more), and every
  // such failure cleared so its write-back may be tried again; OK when there is none.
  Status take_async_error();
  void charge(TensorRecord& r, Tier tier, bool add);
  Status allocate_buffer(TensorRecord& r, Tier tier);
  // allocate_buffer once ensure_space has made room by the pool's count: when the backend's arena
  // still refuses (its free bytes split in ranges each smaller than r), more of the pool leaves
  // and the allocation is tried again. kImpossible carries the arena's refusal in *why.
  Space allocate_in_room(TensorRecord& r, Tier tier, uint64_t min_next_use, Status* why);
  void free_buffer(TensorRecord& r, Tier tier);
  // r's NVMe space, taken from and given back to the backend, counted in the NVMe tier's usage.
  Status allocate_extent(TensorRecord& r);
  void free_extent(TensorRecord& r);
  void free_stale_buffers(TensorRecord& r);
  void drop_copy(TensorRecord& r, Tier tier);
  void apply_discard(TensorRecord& r);
  // Phases until r is next read from tier (LRU age without a schedule), remembered in r until
  // the cursor moves; schedule_next_use is the same without the memo.
  uint64_t next_use(const TensorRecord& r, Tier tier) const;
  UseFilter use_filter(const TensorRecord& r, Tier tier) const;
  // A tensor done with for now (write_behind) is not read again in the current phase: its next
  // use is the next read from the phase after. Otherwise, within one long phase (the optimizer's
  // step), the sub-groups it has updated would rank as needed now, and only a demand, never a
  // prefetch, could take their room: the reads ahead waited, and ran one at a time. It holds
  // until the tensor is touched again, also in the next step's optimizer phase: there the ones
  // left from the step before are the ones its read-ahead may push out (move_cursor re-keys
  // them when the cursor reaches that phase, where their rank jumps by the skipped read).
  // A hinted tensor the schedule never reads (TensorRecord::awaited) is needed in the current
  // phase: a prefetch does not evict it, a demand only when nothing else can go.
  uint64_t schedule_next_use(const TensorRecord& r, Tier tier) const {
    uint64_t next = 0;
    if (!r.done_for_now) {
      next = schedule_->next_read(r.handle, use_filter(r, tier), cursor_);
    } else {
      const uint32_t after = (cursor_ + 1) % schedule_->phase_count();
      next = schedule_->next_read(r.handle, use_filter(r, tier), after);
      if (next != kNeverUsed) ++next;
    }
    return next == kNeverUsed && r.awaited ? 0 : next;
  }
  // Without a schedule, the LRU order as a distance: what write_behind said is done with for
  // now goes before everything else (the optimizer's updated sub-groups before the ones it read
  // ahead, which were last used a pass ago), older first within each. victim_rank orders alike.
  uint64_t lru_distance(const TensorRecord& r) const {
    const uint64_t age = tick_ - r.last_use_tick;
    return 1 + age + (r.done_for_now ? tick_ + 1 : 0);
  }
  // Sets r.done_for_now; its next use (and so its rank as a victim) changes with it: the caller
  // re-lists r (note_state) when this returns true (it changed).
  bool set_done_for_now(TensorRecord& r, bool done);
  // The same for r.awaited.
  bool set_awaited(TensorRecord& r, bool awaited);
  // Every cursor change goes through here: it ends the remembered next uses and re-keys the
  // eviction candidates whose next read the cursor passed.
  void move_cursor(uint32_t phase);
  // A candidate's key in its pool's victim set: the next use plus cursor_clock_ (so that moving
  // the cursor changes no key whose read it did not pass), kNeverUsed for never, and without a
  // schedule an LRU rank in lru_distance's order.
  uint64_t victim_rank(const TensorRecord& r, Tier tier) const;
  void list_victim(TensorRecord& r, Tier tier);
  void unlist_victim(TensorRecord& r, int memory_index);
  // r's buffer on tier leaves only after a call of the framework: it is at home there, or dirty
  // with a failed write-back that waits for its report. Room it holds is never made by waiting.
  bool held_until_a_call(const TensorRecord& r, Tier tier) const;
  // The best clean ([0]) or dirty ([1]) eviction candidate of the pool past the tensor being
  // advanced (evictable() refuses it), or nullptr: room that can be made without a release.
  const VictimKey* first_victim(const PoolState& pool, int dirty) const;
  bool evictable(const TensorRecord& r, Tier tier) const;
  // evictable() but for the tensor being advanced: what depends on r's own fields alone.
  bool evictable_unless_advancing(const TensorRecord& r, Tier tier) const;
  // r's buffer on tier could be freed now without a write (whether or not r is being advanced).
  bool droppable(const TensorRecord& r, Tier tier) const;
  // The lane of access a of r (lanes_): the pool a prefetch of it makes room in and the link it
  // starts a transfer on, numbered 2 x pool (an NVMe read into a pinned pool, a copy into a
  // device pool) or 2 x pool + 1 (a device -> pinned copy into a pinned pool, a stream from NVMe
  // into a device pool); AccessLanes::kNoLane when it would do nothing whatever the links and
  // pools.
  uint32_t lane_of(const TensorRecord& r, const Access& a) const;
  // Brings what the scheduler keeps incrementally about r (its pools' droppable bytes, its
  // accesses' lanes) up to date. Called after every change of r's residency, uses, demands,
  // failure or pending discard, before anything reads that state; check_invariants recounts it
  // from the records.
  void note_state(TensorRecord& r);
  // Takes r out of that state before its record goes (unregister).
  void forget_state(TensorRecord& r);
  // After schedule_ changed: the lanes of its accesses, from every live record.
  void index_schedule();
  bool needs_cleaning(const TensorRecord& r, Tier tier) const;
  // A pool's budget for messages; for the pinned pool of a streaming plan, with the pinned
  // budget it comes from (the figure the user set) and the staging buffers it lost.
  std::string budget_text(const PoolSpec& pool) const;
  // Device transfers of tensors without a pinned copy stream (MemoryPlan::stream_staging_bytes).
  bool streams() const { return config_.memory.stream_staging_bytes > 0; }
  // The link that takes data off `tier` when it is cleaned: pinned data is written to NVMe,
  // device data streams to NVMe or is copied to pinned memory.
  Link cleaning_link_of(Tier tier) const {
    return tier == Tier::kPinned || streams() ? Link::kNvmeWrite : Link::kDeviceToHost;
  }
  // The tier whose pool a transfer towards `tier` needs room in first: pinned for a device copy
  // staged through a pinned buffer (no pinned copy yet, no streaming), else `tier` itself.
  Tier staged_on(const TensorRecord& r, Tier tier) const {
    return tier == Tier::kDevice && !r.residency.valid_on(Tier::kPinned) && !streams()
               ? Tier::kPinned
               : tier;
  }
  bool link_free(Link link) const {
    return inflight_[static_cast<int>(link)] < config_.max_inflight[static_cast<int>(link)];
  }
  void note_async_failure(TensorRecord& r, const Status& status, bool durability);
  void clear_failure(TensorRecord& r);
  Status take_tensor_error(TensorRecord& r);
  Status add_demand(const TensorRecord& r, Tier tier, AccessMode mode);
  void pump();
  uint32_t serve_demands();  // returns the pools that waiting demands need (bit per pool)
  void serve_hints(uint32_t blocked_pools);
  void serve_hints_pass(uint32_t blocked_pools);
  void walk_schedule(uint32_t blocked_pools);
  void clean_ahead();
  // Starts the write-backs that write_behind(kNow) asked for, oldest first, while the NVMe write
  // link has room.
  void write_back_requested();
  // Adds r's room on `tier` (the pool it is read into) to that pool's waiting bytes.
  void note_waiting(const TensorRecord& r, Tier tier);
  void flush_step();
  bool flush_done() const;
  std::string describe_wait(const TensorRecord& r, Tier tier) const;
  Status check_invariants_locked() const;

  SchedulerConfig config_;
  TierBackend& backend_;
  boost::asio::any_io_executor executor_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  TensorRegistry registry_;
  std::optional<AccessSchedule> schedule_;
  AccessLanes lanes_;  // of schedule_'s accesses (index_schedule, note_state)
  AccessSchedule::Builder recorder_;
  bool recording_ = false;
  uint32_t cursor_ = 0;  // current phase (or the next one, between phases)
  // Counts cursor moves (and so schedule changes, which move it to 0); starts at 1, since a
  // record's next_use_epoch 0 means nothing remembered.
  uint64_t cursor_epoch_ = 1;
  bool in_phase_ = false;
  bool phase_matched_ = false;
  PhaseKey phase_key_;
  // Declared before pools_, whose victim sets it serves, so that it outlives them.
  std::pmr::unsynchronized_pool_resource victim_nodes_;
  std::vector<PoolState> pools_;
  std::vector<Op> ops_;
  std::vector<uint32_t> free_ops_;
  std::array<uint32_t, kLinkCount> inflight_{};
  uint32_t inflight_total_ = 0;
  uint32_t cleaning_inflight_ = 0;  // write-backs and cleaning copies in flight (sync waits)
  std::vector<Demand> demands_;
  // write_behind(kNow)'s requests not yet started, oldest at write_back_head_ (a record's
  // write_back_queued says it is here; an entry whose tensor changed since is skipped). Emptied
  // whenever every entry is served, so its capacity is at most one optimizer window's states.
  std::vector<TensorHandle> write_back_queue_;
  size_t write_back_head_ = 0;
  std::vector<Demand> hints_;  // ring of max_prefetch_hints
  // Beside each hint, what its last look found, while its tensor's record is unchanged
  // (record_versions_): kept because a demand holds its pool (kPoolHeld), refused by a full link
  // before any room was made (kLinkFull), or refused by ensure_space for want of room in its
  // pool (kRoomWait). A pass reuses it while the condition holds (group_waiting of the memo
  // alone), without reading the record: the hints waiting for the optimizer's read-ahead sit in
  // the ring through thousands of pumps, and reading each record on every pump (a cache miss
  // each) was most of a plan's time.
  struct HintMemo {
    enum class Kind : uint8_t { kNone, kPoolHeld, kLinkFull, kRoomWait } kind = Kind::kNone;
    Link link = Link::kNvmeRead;  // kLinkFull, kRoomWait
    int pool = kNoPool;           // the pool it is read into (staged_on's)
    // The bytes note_waiting adds for it there: kPoolHeld, what the look added (0 when the
    // record wants no room); kLinkFull and kRoomWait, its charge, the room it needs.
    uint64_t bytes = 0;
    uint32_t version = 0;  // record_versions_ of its tensor when it was made
    bool operator==(const HintMemo&) const = default;
  };
  std::vector<HintMemo> hint_memos_;  // indexed as hints_
  // Whether ensure_space(pool, need, 1) would wait without doing anything: no room, and either
  // cleanings in flight cover it or no candidate a prefetch may evict (next use >= 1; dirty ones
  // only with the cleaning link free). What a hint's kRoomWait memo is checked against.
  bool hint_room_waits(int pool, uint64_t need) const;
  // choose_victim would let a prefetch (min_next_use 1) evict this candidate (its next use is 1
  // or later); nullptr: no candidate.
  bool prefetch_may_evict(const VictimKey* key) const;
  // Per registry slot, bumped by every note_state and forget_state: a record's state changed.
  // Dense (4 bytes a slot), so that checking it costs no read of the record.
  std::vector<uint32_t> record_versions_;
  // Changes of records the ring names (note_state and forget_state of one with hints_in_ring),
  // and the count when the last pass ended, if that pass changed none of them itself: while the
  // two are equal, no memo's record has changed and a pass need not read record_versions_
  // (4 bytes a tensor, megabytes at 405B: a cache miss per hint).
  uint64_t hinted_changes_ = 0;
  std::optional<uint64_t> hinted_changes_after_pass_;
  // A hint leaves the ring (dropped by a pass, or overwritten when the ring is full).
  void unhint(TensorHandle tensor);
  // The ring's memos grouped by what decides them (kind, link, pool), with the sum, least and
  // most of their bytes. Whether every memo of a group holds is one question about the group
  // (group_waiting), so a pump in which every memo holds, and the pass would keep every hint and
  // do nothing else, costs a few checks instead of one per hint: the hints waiting for the
  // optimizer's read-ahead sit in the ring through thousands of pumps, half of whose passes were
  // such. Made after each pass (group_memos); valid while the memos describe their records: every
  // hint has one, the pass changed no record the ring names, and nothing since has
  // (hinted_changes_) nor added a hint.
  struct MemoGroup {
    HintMemo::Kind kind = HintMemo::Kind::kNone;
    Link link = Link::kNvmeRead;
    int pool = kNoPool;
    uint64_t bytes = 0;  // of all its memos
    uint64_t least = 0;
    uint64_t most = 0;
    bool operator==(const MemoGroup&) const = default;
    static MemoGroup of(const HintMemo& memo) {  // the group of one memo
      return {memo.kind, memo.link, memo.pool, memo.bytes, memo.bytes, memo.bytes};
    }
  };
  static constexpr uint64_t kGroupDoesNotHold = UINT64_MAX;
  std::vector<MemoGroup> memo_groups_;  // capacity: the ring's, reserved (no allocation)
  bool memo_groups_valid_ = false;
  void group_memos();
  // The ring's memos grouped into `groups`; false (groups partial) if they do not all describe
  // their records.
  bool group_memos_into(std::vector<MemoGroup>& groups) const;
  // The waiting bytes a pass adds for the group's hints when every one of its memos holds now
  // (its records as the memos say), else kGroupDoesNotHold.
  uint64_t group_waiting(const MemoGroup& group, uint32_t blocked_pools) const;
  size_t hint_head_ = 0;
  size_t hint_count_ = 0;
  std::array<RangeCopy, kMaxRangeCopies> range_copies_;
  uint64_t next_range_ticket_ = 1;
  uint64_t tick_ = 0;
  uint64_t cursor_clock_ = 0;         // phases the cursor has moved forward, in all
  uint64_t failure_sequence_ = 0;     // orders AsyncFailure records
  uint32_t durability_failures_ = 0;  // live tensors whose durability_failed()
  bool in_step_ = false;
  bool stopping_ = false;
  bool prefetch_enabled_ = true;
  bool flushing_ = false;
  bool pumping_ = false;
  // Pools that waiting demands need, while a pump runs: prefetch and write-behind keep out.
  uint32_t demand_pools_ = 0;
  // The tensor an acquire or advance is working on: never its own eviction victim.
  uint32_t advancing_ = UINT32_MAX;
  SchedulerStats stats_;
};

}  // namespace strata::sched
