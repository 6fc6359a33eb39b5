#include "sched/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/assert.h"
#include "common/units.h"
#include "sched/transfer_label.h"

namespace strata::sched {

namespace {

// Adds or removes `bytes` of `kind` in a tier's usage, raising its peaks. footprint: the bytes
// also count in what the tier holds (not for reserved pools, whose footprint is fixed).
void count_usage(TierUsage& usage, TensorKind kind, uint64_t bytes, bool add, bool footprint) {
  const auto k = static_cast<size_t>(kind);
  if (add) {
    usage.in_use_bytes += bytes;
    usage.kind_in_use_bytes[k] += bytes;
    if (footprint) usage.footprint_bytes += bytes;
  } else {
    STRATA_ASSERT(usage.in_use_bytes >= bytes && usage.kind_in_use_bytes[k] >= bytes);
    usage.in_use_bytes -= bytes;
    usage.kind_in_use_bytes[k] -= bytes;
    if (footprint) usage.footprint_bytes -= bytes;
  }
  usage.peak_in_use_bytes = std::max(usage.peak_in_use_bytes, usage.in_use_bytes);
  usage.peak_footprint_bytes = std::max(usage.peak_footprint_bytes, usage.footprint_bytes);
  usage.kind_peak_in_use_bytes[k] =
      std::max(usage.kind_peak_in_use_bytes[k], usage.kind_in_use_bytes[k]);
}

using Clock = std::chrono::steady_clock;

constexpr Tier kMemoryTiers[] = {Tier::kDevice, Tier::kPinned};

int budget_code(Tier tier) {
  return tier == Tier::kDevice ? STRATA_E_DEVICE_BUDGET : STRATA_E_PINNED_BUDGET;
}

// What to change, for budget errors that reach the caller of the C API.
const char* budget_advice(Tier tier) {
  return tier == Tier::kDevice ? "; raise device_budget_bytes (strata_config)"
                               : "; raise pinned_budget_bytes (strata_config)";
}

std::string label(const TensorRecord& r) {
  return "tensor '" + r.spec.name + "' (" + format_bytes(r.bytes) + ")";
}

// What a transfer of `kind` is doing, for messages.
const char* doing(Scheduler::OpKind kind) {
  switch (kind) {
    case Scheduler::OpKind::kRead:
      return "reading";
    case Scheduler::OpKind::kWriteBack:
      return "writing back";
    case Scheduler::OpKind::kCopyToDevice:
      return "copying to device";
    case Scheduler::OpKind::kCopyToHost:
      return "copying to host";
    case Scheduler::OpKind::kStreamToDevice:
      return "streaming to device";
    case Scheduler::OpKind::kStreamToNvme:
      return "streaming to nvme";
    case Scheduler::OpKind::kRangeToDevice:
      return "copying a range to device";
    case Scheduler::OpKind::kRangeToHost:
      return "copying a range to host";
  }
  return "moving";
}

Clock::time_point deadline_after(std::chrono::nanoseconds timeout) {
  // Saturates: a "wait forever" timeout of nanoseconds::max() must not overflow.
  const Clock::time_point now = Clock::now();
  if (timeout >= Clock::time_point::max() - now) return Clock::time_point::max();
  return now + std::chrono::duration_cast<Clock::duration>(timeout);
}

// Marks a tensor as the one being worked on for the guard's lifetime (restoring the previous
// mark, since advance() nests for staging).
class AdvancingGuard {
 public:
  AdvancingGuard(uint32_t& slot, uint32_t index) : slot_(slot), saved_(slot) { slot_ = index; }
  ~AdvancingGuard() { slot_ = saved_; }
  AdvancingGuard(const AdvancingGuard&) = delete;
  AdvancingGuard& operator=(const AdvancingGuard&) = delete;

 private:
  uint32_t& slot_;
  uint32_t saved_;
};

std::string millis(std::chrono::nanoseconds timeout) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
         " ms";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Creation and teardown

Result<std::unique_ptr<Scheduler>> Scheduler::create(const SchedulerConfig& config,
                                                     TierBackend& backend,
                                                     boost::asio::any_io_executor executor) {
  STRATA_TRY(validate(config.memory));
  for (int i = 0; i < kLinkCount; ++i) {
    if (config.max_inflight[i] == 0 || config.max_inflight[i] > kMaxInflightPerLink) {
      return invalid_argument(std::string("scheduler: in-flight limit of link ") +
                              to_string(static_cast<Link>(i)) + " must be 1.." +
                              std::to_string(kMaxInflightPerLink));
    }
  }
  if (config.window.max_phases == 0 || config.window.max_accesses == 0) {
    return invalid_argument("scheduler: the prefetch window must be at least one phase/access");
  }
  if (!(config.clean_headroom >= 0 && config.clean_headroom < 1)) {
    return invalid_argument("scheduler: clean_headroom must be in [0, 1)");
  }
  if (config.max_tensors == 0 || config.max_prefetch_hints == 0 || config.max_waiting == 0) {
    return invalid_argument("scheduler: max_tensors, max_prefetch_hints, max_waiting must be > 0");
  }
  if (config.max_tensors > kMaxHandleIndex + 1) {
    return invalid_argument("scheduler: max_tensors is limited to " +
                            std::to_string(kMaxHandleIndex + 1) + " (a handle's index field)");
  }
  if (!executor) return invalid_argument("scheduler: no completion executor");
  return std::unique_ptr<Scheduler>(new Scheduler(config, backend, std::move(executor)));
}

Scheduler::Scheduler(const SchedulerConfig& config, TierBackend& backend,
                     boost::asio::any_io_executor executor)
    : config_(config),
      backend_(backend),
      executor_(std::move(executor)),
      registry_(config.max_tensors, config.handle_owner) {
  for (const PoolSpec& spec : config_.memory.pools) {
    PoolState pool(&victim_nodes_);
    pool.spec = spec;
    pools_.push_back(std::move(pool));
  }
  uint32_t total_ops = 0;
  for (uint32_t limit : config_.max_inflight) total_ops += limit;
  ops_.resize(total_ops);
  free_ops_.reserve(total_ops);
  for (uint32_t i = total_ops; i > 0; --i) free_ops_.push_back(i - 1);
  demands_.reserve(config_.max_waiting);
  hints_.resize(config_.max_prefetch_hints);
  hint_memos_.resize(config_.max_prefetch_hints);
  memo_groups_.reserve(config_.max_prefetch_hints);
  for (Tier tier : kMemoryTiers) {
    TierUsage& usage = stats_.tiers[memory_index(tier)];
    usage.reserved_bytes = reserved_bytes(config_.memory, tier);
    usage.footprint_bytes = usage.reserved_bytes;
    usage.peak_footprint_bytes = usage.reserved_bytes;
  }
  // The backend's staging buffers for streamed transfers: pinned memory in use from start to end.
  const uint64_t staging = config_.memory.stream_staging_bytes;
  if (staging > 0) {
    TierUsage& pinned = stats_.tiers[memory_index(Tier::kPinned)];
    pinned.reserved_bytes += staging;
    count_usage(pinned, TensorKind::kOther, staging, /*add=*/true, /*footprint=*/true);
  }
}

Scheduler::~Scheduler() {
  std::unique_lock lock(mu_);
  // Transfers in flight write into buffers freed below and complete into this object: wait.
  stopping_ = true;
  while (inflight_total_ > 0) {
    if (!cv_.wait_for(lock, std::chrono::seconds(10), [this] { return inflight_total_ == 0; })) {
      std::fprintf(stderr, "strata: scheduler shutdown waits for %u transfers in flight\n",
                   inflight_total_);
    }
  }
  for (uint32_t i = 0; i < registry_.slot_count(); ++i) {
    if (!registry_.live(i)) continue;
    TensorRecord& r = registry_.at(i);
    for (Tier tier : kMemoryTiers) {
      if (r.buffer[memory_index(tier)].valid()) backend_.free(tier, r.buffer[memory_index(tier)]);
    }
    if (r.extent.valid()) backend_.free_extent(r.extent);
  }
}

std::string Scheduler::budget_text(const PoolSpec& pool) const {
  const uint64_t staging = config_.memory.stream_staging_bytes;
  std::string text = format_bytes(pool.budget_bytes);
  if (pool.tier == Tier::kPinned && staging > 0) {
    // What the user set is the pinned budget; say where the rest of it went.
    text += " (the pinned budget, " + format_bytes(pool.budget_bytes + staging) + ", less " +
            format_bytes(staging) + " of streaming staging buffers)";
  }
  return text;
}

// ---------------------------------------------------------------------------------------------
// Registry

Result<TensorHandle> Scheduler::register_tensor(const TensorSpec& spec,
                                                const RegisterOptions& options) {
  if (options.home != Tier::kNvme && options.home != Tier::kPinned &&
      options.home != Tier::kDevice) {
    return invalid_argument("tensor '" + spec.name + "': unknown home tier");
  }
  std::lock_guard lock(mu_);
  Result<TensorHandle> handle = registry_.add(spec, options);
  if (!handle) return handle;
  TensorRecord& r = registry_.at(handle->index);
  auto fail = [&](Status status) {
    registry_.remove(*handle);
    return status;
  };
  for (Tier tier : kMemoryTiers) {
    const int mi = memory_index(tier);
    r.pool[mi] = find_pool(config_.memory, tier, spec.kind);
    if (r.pool[mi] == kNoPool) continue;
    const PoolState& pool = pools_[r.pool[mi]];
    Result<uint64_t> charged = charged_bytes(pool.spec.size, r.bytes);
    if (!charged) {
      return fail(std::move(charged).take_status().with_context(
          "registering " + label(r) + " in pool '" + pool.spec.name + "'"));
    }
    r.charged[mi] = *charged;
  }
  if (options.home != Tier::kNvme) {
    const int mi = memory_index(options.home);
    if (r.pool[mi] == kNoPool) {
      return fail(invalid_argument("registering " + label(r) + ": no " + to_string(options.home) +
                                   " pool serves kind " + to_string(spec.kind)));
    }
    const PoolState& pool = pools_[r.pool[mi]];
    if (r.charged[mi] > pool.spec.budget_bytes) {
      return fail(Status::error(budget_code(options.home),
                                "registering " + label(r) + " at home in pool '" + pool.spec.name +
                                    "' of " + budget_text(pool.spec) +
                                    budget_advice(options.home)));
    }
  }
  // A tensor that rests on NVMe gets its NVMe space now: over-commit is an error at set-up, with
  // the numbers, never a write-back failing hours into a run. Write-backs reuse this extent.
  if (options.home == Tier::kNvme || options.contents_on_nvme) {
    Status extent = allocate_extent(r);
    if (!extent) return fail(std::move(extent).with_context("registering " + label(r)));
  }
  if (record_versions_.size() <= handle->index) record_versions_.resize(handle->index + 1, 0);
  note_state(r);
  return handle;
}

Status Scheduler::unregister_tensor(TensorHandle tensor, std::chrono::nanoseconds timeout) {
  const Clock::time_point deadline = deadline_after(timeout);
  std::unique_lock lock(mu_);
  for (;;) {
    STRATA_ASSIGN_OR_RETURN(uint32_t index, registry_.resolve(tensor));
    TensorRecord& r = registry_.at(index);
    if (r.uses > 0) {
      return Status::error(STRATA_E_STATE, "cannot unregister " + label(r) + ": it is acquired");
    }
    if (r.demanded()) {
      return Status::error(STRATA_E_STATE,
                           "cannot unregister " + label(r) + ": an acquire is waiting for it");
    }
    if (!r.residency.in_flight()) break;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return Status::error(STRATA_E_TIMEOUT, "unregistering " + label(r) + ": its transfer did " +
                                                 "not finish in " + millis(timeout));
    }
  }
  TensorRecord& r = registry_.at(tensor.index);
  for (Tier tier : kMemoryTiers) {
    if (r.buffer[memory_index(tier)].valid()) free_buffer(r, tier);
  }
  if (r.extent.valid()) free_extent(r);
  clear_failure(r);  // its failures were its own: nobody else hears of them now
  forget_state(r);
  registry_.remove(tensor);
  pump();
  cv_.notify_all();
  return Status::ok();
}

Result<bool> Scheduler::read_only(TensorHandle tensor) const {
  std::lock_guard lock(mu_);
  STRATA_ASSIGN_OR_RETURN(uint32_t index, registry_.resolve(tensor));
  return registry_.at(index).read_only;
}

Result<TensorInfo> Scheduler::describe(TensorHandle tensor) const {
  std::lock_guard lock(mu_);
  STRATA_ASSIGN_OR_RETURN(uint32_t index, registry_.resolve(tensor));
  const TensorRecord& r = registry_.at(index);
  TensorInfo info;
  info.name = r.spec.name;
  info.bytes = r.bytes;
  info.kind = r.spec.kind;
  info.dtype = r.spec.dtype;
  info.layer = r.spec.layer;
  info.home = r.home;
  info.residency = r.residency.state();
  info.valid = r.residency.valid();
  info.uses = r.uses;
  info.use_tier = r.use_tier;
  info.has_error = r.failed();
  info.allocation = r.allocation;
  info.read_only = r.read_only;
  return info;
}

// ---------------------------------------------------------------------------------------------
// Schedule and position

Status Scheduler::declare_schedule(AccessSchedule schedule) {
  if (schedule.phase_count() == 0) return invalid_argument("declared schedule has no phases");
  std::lock_guard lock(mu_);
  schedule_ = std::move(schedule);
  index_schedule();
  recording_ = false;
  recorder_ = AccessSchedule::Builder();
  move_cursor(0);
  phase_matched_ = false;
  pump();
  return Status::ok();
}

Status Scheduler::begin_step() {
  std::lock_guard lock(mu_);
  if (in_step_) return Status::error(STRATA_E_STATE, "begin_step: a step is already running");
  in_step_ = true;
  if (!schedule_ && config_.record_first_step) {
    recording_ = true;
    recorder_ = AccessSchedule::Builder();
  }
  pump();
  return Status::ok();
}

Status Scheduler::end_step() {
  std::lock_guard lock(mu_);
  if (!in_step_) return Status::error(STRATA_E_STATE, "end_step without begin_step");
  if (in_phase_) {
    return Status::error(STRATA_E_STATE, std::string("end_step inside phase ") +
                                             to_string(phase_key_.kind) + " " +
                                             std::to_string(phase_key_.layer));
  }
  in_step_ = false;
  Status status;
  if (recording_) {
    recording_ = false;
    if (!recorder_.empty()) {
      Result<AccessSchedule> built = std::move(recorder_).build();
      if (built) {
        schedule_ = std::move(*built);
        index_schedule();
        move_cursor(0);
      } else {
        status = std::move(built).take_status().with_context("recording the step's schedule");
      }
    }
    recorder_ = AccessSchedule::Builder();
  }
  pump();
  Status async = take_async_error();
  return status.is_ok() ? async : status;
}

Status Scheduler::begin_phase(PhaseKey key) {
  std::lock_guard lock(mu_);
  if (!in_step_) {
    return Status::error(STRATA_E_STATE, std::string("begin_phase(") + to_string(key.kind) + " " +
                                             std::to_string(key.layer) +
                                             ") outside a step: call begin_step first");
  }
  if (in_phase_) {
    return Status::error(STRATA_E_STATE, std::string("begin_phase while phase ") +
                                             to_string(phase_key_.kind) + " " +
                                             std::to_string(phase_key_.layer) + " is open");
  }
  in_phase_ = true;
  phase_key_ = key;
  phase_matched_ = false;
  if (recording_) recorder_.begin_phase(key);
  if (schedule_) {
    std::optional<uint32_t> phase = schedule_->find_phase(key, cursor_);
    if (phase) {
      move_cursor(*phase);
      phase_matched_ = true;
    } else {
      ++stats_.unscheduled_phases;
    }
  }
  pump();
  return Status::ok();
}

Status Scheduler::end_phase(PhaseKey key) {
  std::lock_guard lock(mu_);
  if (!in_step_) {
    return Status::error(STRATA_E_STATE, std::string("end_phase(") + to_string(key.kind) + " " +
                                             std::to_string(key.layer) + ") outside a step");
  }
  if (!in_phase_ || !(key == phase_key_)) {
    return Status::error(STRATA_E_STATE, std::string("end_phase(") + to_string(key.kind) + " " +
                                             std::to_string(key.layer) +
                                             ") does not match the open phase");
  }
  in_phase_ = false;
  if (phase_matched_ && schedule_) move_cursor((cursor_ + 1) % schedule_->phase_count());
  phase_matched_ = false;
  pump();
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Access

Result<Acquired> Scheduler::acquire(TensorHandle tensor, Tier tier, AccessMode mode,
                                    std::chrono::nanoseconds timeout) {
  if (tier == Tier::kNvme) return invalid_argument("acquire: the tier must be device or pinned");
  const Clock::time_point deadline = deadline_after(timeout);
  const int mi = memory_index(tier);
  std::unique_lock lock(mu_);
  bool waiting = false;
  for (;;) {
    // Resolved afresh after every wait; unregister refuses while we wait, so it stays valid.
    STRATA_ASSIGN_OR_RETURN(uint32_t index, registry_.resolve(tensor));
    TensorRecord& r = registry_.at(index);
    Result<AcquireAttempt> attempt = attempt_locked(index, tier, mode);
    if (!attempt || attempt->state == AcquireState::kReady) {
      if (waiting) {
        --r.waiters[mi];
        note_state(r);
      }
      if (!attempt) return std::move(attempt).take_status();
      ++(waiting ? stats_.acquire_waits : stats_.acquire_hits);
      return attempt->acquired;
    }
    if (!waiting) {
      STRATA_TRY(add_demand(r, tier, mode));
      ++r.waiters[mi];
      note_state(r);
      waiting = true;
      pump();
      // Look again before sleeping: serving the demand may have shown the wait can never end
      // (no room that could ever be made, a failed holder), and no completion would wake us.
      continue;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      // The deadline passed; one last look (a completion may have just arrived).
      attempt = attempt_locked(index, tier, mode);
      TensorRecord& waited = registry_.at(index);
      --waited.waiters[mi];
      note_state(waited);
      if (attempt && attempt->state == AcquireState::kReady) {
        ++stats_.acquire_waits;
        return attempt->acquired;
      }
      if (!attempt) return std::move(attempt).take_status();
      ++stats_.acquire_timeouts;
      return Status::error(STRATA_E_TIMEOUT, "acquire of " + describe_wait(waited, tier) +
                                                 " did not finish in " + millis(timeout));
    }
  }
}

Result<AcquireAttempt> Scheduler::try_acquire(TensorHandle tensor, Tier tier, AccessMode mode) {
  if (tier == Tier::kNvme) return invalid_argument("acquire: the tier must be device or pinned");
  std::lock_guard lock(mu_);
  STRATA_ASSIGN_OR_RETURN(uint32_t index, registry_.resolve(tensor));
  TensorRecord& r = registry_.at(index);
  const bool was_polled = r.polled[memory_index(tier)];
  Result<AcquireAttempt> attempt = attempt_locked(index, tier, mode);
  if (!attempt) {
    r.polled[memory_index(tier)] = false;
    note_state(r);
    return attempt;
  }
  if (attempt->state == AcquireState::kReady) {
    ++(was_polled ? stats_.acquire_waits : stats_.acquire_hits);
    return attempt;
  }
  if (!was_polled) {
    STRATA_TRY(add_demand(r, tier, mode));
    r.polled[memory_index(tier)] = true;
    note_state(r);
  }
  pump();
  return attempt;
}

Status Scheduler::cancel_acquire(TensorHandle tensor, Tier tier) {
  if (tier == Tier::kNvme) return invalid_argument("cancel_acquire: tier must be device or pinned");
  std::lock_guard lock(mu_);
  STRATA_ASSIGN_OR_RETURN(uint32_t index, registry_.resolve(tensor));
  registry_.at(index).polled[memory_index(tier)] = false;
  note_state(registry_.at(index));
  pump();
  return Status::ok();
}

Result<AcquireAttempt> Scheduler::attempt_locked(uint32_t index, Tier tier, AccessMode mode) {
  TensorRecord& r = registry_.at(index);
  const int mi = memory_index(tier);
  const AcquireAttempt pending{AcquireState::kPending, {}};
  const AdvancingGuard guard(advancing_, index);
  // A failed read has no data to give; a failed write-back left the newest data in memory, and
  // reading it is fine (sync / end_step report the failure).
  if (r.failed() && !r.durability_failed()) return take_tensor_error(r);
  if (r.uses > 0 && r.use_tier != tier) {
    return Status::error(STRATA_E_STATE, "cannot acquire " + label(r) + " on " + to_string(tier) +
                                             ": it is acquired on " + to_string(r.use_tier));
  }
  if (mode == AccessMode::kOverwrite && r.uses > 0) {
    return Status::error(STRATA_E_STATE,
                         "cannot acquire " + label(r) + " with DISCARD: it is acquired already");
  }
  if (r.pool[mi] == kNoPool) {
    return invalid_argument("cannot acquire " + label(r) + " on " + to_string(tier) +
                            ": the memory plan has no pool for kind " + to_string(r.spec.kind));
  }
  // Device data goes back to NVMe through pinned memory. A tensor larger than the pinned pool
  // could be placed on the device (with DISCARD nothing is staged) but never written back, and a
  // flush or an eviction would wait for it forever (found by tests/fuzz/c_api_fuzz).
  if (tier == Tier::kDevice && r.home == Tier::kNvme && !streams()) {
    const int pinned = r.pool[memory_index(Tier::kPinned)];
    if (pinned != kNoPool &&
        r.charged[memory_index(Tier::kPinned)] > pools_[pinned].spec.budget_bytes) {
      return Status::error(STRATA_E_PINNED_BUDGET,
                           "cannot acquire " + label(r) +
                               " on the device: it is staged through pool '" +
                               pools_[pinned].spec.name + "', whose budget is " +
                               budget_text(pools_[pinned].spec) + budget_advice(Tier::kPinned));
    }
  }
  if (r.discard_pending || r.residency.in_flight()) return pending;
  if (mode == AccessMode::kRead && r.residency.state() == Residency::kUnwritten) {
    // Handing out an uninitialized buffer as "the contents" would be silently wrong data.
    return Status::error(STRATA_E_STATE, "cannot read " + label(r) +
                                             ": it has no contents yet (acquire it with DISCARD "
                                             "to write it first)");
  }

  if (mode == AccessMode::kOverwrite) {
    if (!r.buffer[mi].valid()) {
      Status why;
      Space space = ensure_space(r.pool[mi], r.charged[mi], 0, &why);
      if (space == Space::kReady) space = allocate_in_room(r, tier, 0, &why);
      if (space == Space::kImpossible) return why;
      if (space == Space::kWaiting) return pending;
    }
    Status changed = r.residency.overwrite(tier, r.spec.name);
    if (!changed) return changed;
    free_stale_buffers(r);
  } else if (!r.residency.valid_on(tier)) {
    StepResult step = advance(r, tier, 0, /*prefetch=*/false);
    if (step.step == Step::kError) return step.status;
    if (step.step != Step::kResident) return pending;
  }

  STRATA_ASSERT(r.buffer[mi].valid() && r.residency.valid_on(tier));
  ++r.uses;
  (void)set_done_for_now(r, false);  // re-listed by note_state below
  (void)set_awaited(r, false);
  r.use_tier = tier;
  r.last_use_tick = ++tick_;
  r.polled[mi] = false;
  note_state(r);
  ++stats_.acquires;
  if (recording_ && !recorder_.add({r.handle, tier, mode}).is_ok()) {
    // Past the schedule's limits: give up recording rather than fail the training step.
    recording_ = false;
    recorder_ = AccessSchedule::Builder();
  }
  return AcquireAttempt{AcquireState::kReady, {r.buffer[mi].data, r.bytes, r.buffer[mi].token}};
}

Status Scheduler::release(TensorHandle tensor, bool dirty, void* device_stream) {
  std::lock_guard lock(mu_);
  STRATA_ASSIGN_OR_RETURN(uint32_t index, registry_.resolve(tensor));
  TensorRecord& r = registry_.at(index);
  if (r.uses == 0)
    return Status::error(STRATA_E_STATE, "release of " + label(r) + ": not acquired");
  if (r.range_copies > 0 && r.uses == 1) {
    return Status::error(STRATA_E_STATE,
                         "release of " + label(r) + ": a range copy from or into it is in flight");
  }
  const Tier tier = r.use_tier;
  backend_.on_release(tier, r.buffer[memory_index(tier)], device_stream);
  if (dirty) {
    // No transfer runs on a tensor in use, so the state is stable and this copy is valid.
    Status changed = r.residency.modified(tier, r.spec.name);
    STRATA_ASSERT(changed.is_ok());
    free_stale_buffers(r);
  }
  --r.uses;
  r.last_use_tick = ++tick_;
  note_state(r);
  pump();
  cv_.notify_all();
  return Status::ok();
}

Status Scheduler::write_behind(TensorHandle tensor, WriteBack when) {
  std::lock_guard lock(mu_);
  STRATA_ASSIGN_OR_RETURN(uint32_t index, registry_.resolve(tensor));
  TensorRecord& r = registry_.at(index);
  if (r.uses > 0) {
    return Status::error(STRATA_E_STATE, "write_behind of " + label(r) + ": acquired");
  }
  if (set_done_for_now(r, true)) note_state(r);
  if (when == WriteBack::kNow && r.residency.dirty() && !r.write_back_queued) {
    write_back_queue_.push_back(r.handle);
    r.write_back_queued = true;
  }
  pump();
  return Status::ok();
}

bool Scheduler::set_done_for_now(TensorRecord& r, bool done) {
  if (r.done_for_now == done) return false;
  r.done_for_now = done;
  for (uint64_t& epoch : r.next_use_epoch) epoch = 0;  // the remembered next uses are stale
  return true;
}

bool Scheduler::set_awaited(TensorRecord& r, bool awaited) {
  if (r.awaited == awaited) return false;
  r.awaited = awaited;
  for (uint64_t& epoch : r.next_use_epoch) epoch = 0;  // the remembered next uses are stale
  return true;
}

Status Scheduler::discard(TensorHandle tensor) {
  std::lock_guard lock(mu_);
  STRATA_ASSIGN_OR_RETURN(uint32_t index, registry_.resolve(tensor));
  TensorRecord& r = registry_.at(index);
  if (r.uses > 0) return Status::error(STRATA_E_STATE, "discard of " + label(r) + ": acquired");
  if (r.residency.in_flight()) {
    r.discard_pending = true;
    note_state(r);
  } else {
    apply_discard(r);
  }
  pump();
  cv_.notify_all();
  return Status::ok();
}

Result<uint64_t> Scheduler::start_copy_range(TensorHandle from, Tier from_tier,
                                             uint64_t from_offset, TensorHandle to, Tier to_tier,
                                             uint64_t to_offset, uint64_t bytes,
                                             std::chrono::nanoseconds timeout) {
  const bool to_device = to_tier == Tier::kDevice && from_tier == Tier::kPinned;
  if (!to_device && !(to_tier == Tier::kPinned && from_tier == Tier::kDevice)) {
    return invalid_argument("a range copy goes between the device and pinned memory");
  }
  const Clock::time_point deadline = deadline_after(timeout);
  const OpKind kind = to_device ? OpKind::kRangeToDevice : OpKind::kRangeToHost;
  const Link link = link_of(kind);
  std::unique_lock lock(mu_);
  for (;;) {
    STRATA_ASSIGN_OR_RETURN(uint32_t source, registry_.resolve(from));
    STRATA_ASSIGN_OR_RETURN(uint32_t target, registry_.resolve(to));
    const TensorRecord& f = registry_.at(source);
    const TensorRecord& t = registry_.at(target);
    for (const auto& [r, tier] : {std::pair{&f, from_tier}, std::pair{&t, to_tier}}) {
      if (r->uses == 0 || r->use_tier != tier) {
        return Status::error(STRATA_E_STATE, "a range copy needs " + label(*r) + " held on " +
                                                 to_string(tier) + " (acquired there)");
      }
    }
    if (bytes == 0 || from_offset > f.bytes || bytes > f.bytes - from_offset ||
        to_offset > t.bytes || bytes > t.bytes - to_offset) {
      return invalid_argument("range copy of " + std::to_string(bytes) + " bytes from offset " +
                              std::to_string(from_offset) + " of " + label(f) + " to offset " +
                              std::to_string(to_offset) + " of " + label(t) + ": outside a tensor");
    }
    uint32_t slot = kNoRange;
    for (uint32_t i = 0; i < kMaxRangeCopies; ++i) {
      if (range_copies_[i].ticket == 0) {
        slot = i;
        break;
      }
    }
    if (slot == kNoRange) {
      return Status::error(STRATA_E_LIMIT, "more than " + std::to_string(kMaxRangeCopies) +
                                               " range copies started and not waited for");
    }
    if (link_free(link) && !free_ops_.empty()) {
      const uint32_t id = free_ops_.back();
      free_ops_.pop_back();
      ops_[id] = {kind, link, target, /*cleaning=*/false, /*active=*/true, slot, source};
      ++registry_.at(source).range_copies;
      ++registry_.at(target).range_copies;
      range_copies_[slot] = RangeCopy{next_range_ticket_++, false, false, bytes, Status::ok()};
      ++inflight_[static_cast<int>(link)];
      ++inflight_total_;
      const int fi = memory_index(from_tier), ti = memory_index(to_tier);
      const ScopedTransferLabel labelled(t.spec);
      Status submitted = backend_.copy_range(link, f.buffer[fi], from_offset, t.buffer[ti],
                                             to_offset, bytes, Completion{this, id});
      if (!submitted) {
        // Refused at once: no completion will come.
        --registry_.at(source).range_copies;
        --registry_.at(target).range_copies;
        range_copies_[slot] = RangeCopy{};
        --inflight_[static_cast<int>(link)];
        --inflight_total_;
        ops_[id] = Op{};
        free_ops_.push_back(id);
        return std::move(submitted).with_context(std::string(doing(kind)) + " of " + label(t));
      }
      return range_copies_[slot].ticket;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return Status::error(STRATA_E_TIMEOUT, std::string(doing(kind)) + " of " + label(t) +
                                                 ": no room on the link in " + millis(timeout));
    }
  }
}

Result<Scheduler::RangeCopy*> Scheduler::range_copy_locked(uint64_t ticket) {
  for (RangeCopy& c : range_copies_) {
    if (ticket != 0 && c.ticket == ticket && !c.abandoned) return &c;
  }
  return Status::error(STRATA_E_STATE, "range copy " + std::to_string(ticket) +
                                           " is unknown or was waited for already");
}

Status Scheduler::redeem_locked(RangeCopy& copy) {
  STRATA_ASSERT(copy.done);
  Status status = std::move(copy.status);
  copy = RangeCopy{};
  return status;
}

Status Scheduler::wait_copy_range(uint64_t ticket, std::chrono::nanoseconds timeout) {
  const Clock::time_point deadline = deadline_after(timeout);
  std::unique_lock lock(mu_);
  STRATA_ASSIGN_OR_RETURN(RangeCopy * copy, range_copy_locked(ticket));
  if (!cv_.wait_until(lock, deadline, [&] { return copy->done; })) {
    copy->abandoned = true;
    return Status::error(STRATA_E_TIMEOUT, "range copy " + std::to_string(ticket) +
                                               " did not end in " + millis(timeout));
  }
  return redeem_locked(*copy);
}

Result<bool> Scheduler::poll_copy_range(uint64_t ticket) {
  std::lock_guard lock(mu_);
  STRATA_ASSIGN_OR_RETURN(RangeCopy * copy, range_copy_locked(ticket));
  if (!copy->done) return false;
  STRATA_TRY(redeem_locked(*copy));
  return true;
}

Status Scheduler::reserve(TensorHandle tensor, Tier tier, std::chrono::nanoseconds timeout) {
  if (tier == Tier::kNvme) return invalid_argument("reserve: the tier must be device or pinned");
  {
    // An allocator fails rather than waits for somebody to free: room held by tensors in use
    // (acquired), at home in the pool, or whose failed write-back is unreported cannot be made
    // without another call, which a single-threaded caller would never get to make. Evictions
    // and write-backs, which end by themselves, are waited for below.
    std::lock_guard lock(mu_);
    STRATA_ASSIGN_OR_RETURN(uint32_t index, registry_.resolve(tensor));
    const TensorRecord& r = registry_.at(index);
    const int mi = memory_index(tier);
    if (r.pool[mi] != kNoPool) {
      const PoolState& pool = pools_[r.pool[mi]];
      uint64_t held = 0;
      for (uint32_t other : pool.resident) {
        const TensorRecord& c = registry_.at(other);
        if (other == index) continue;
        const bool in_use = c.uses > 0 && c.use_tier == tier;
        if (in_use || held_until_a_call(c, tier)) {
          held += c.charged[mi];
        }
      }
      if (held + r.charged[mi] > pool.spec.budget_bytes) {
        return Status::error(budget_code(tier),
                             "needs " + format_bytes(r.charged[mi]) + " in pool '" +
                                 pool.spec.name + "' (budget " + budget_text(pool.spec) +
                                 "), but " + format_bytes(held) +
                                 " is held by tensors in use, allocations and tensors that never "
                                 "leave it; an allocation takes its memory now and does not wait "
                                 "for releases" +
                                 budget_advice(tier));
      }
    }
  }
  STRATA_TRY(acquire(tensor, tier, AccessMode::kOverwrite, timeout).status());
  return release(tensor, /*dirty=*/false);
}

Status Scheduler::prefetch(TensorHandle tensor, Tier tier) {
  if (tier == Tier::kNvme) return invalid_argument("prefetch: the tier must be device or pinned");
  std::lock_guard lock(mu_);
  STRATA_ASSIGN_OR_RETURN(uint32_t index, registry_.resolve(tensor));
  // A hint says it is needed soon: no longer done with for now, so prefetch keeps it; and,
  // while no schedule ranks the tensors, as recently used as a touch, so that the LRU order
  // does not push out what was just read ahead (it was last used a whole pass ago) to make room
  // for the next read ahead.
  TensorRecord& r = registry_.at(index);
  bool changed = set_done_for_now(r, false);
  changed = set_awaited(r, true) || changed;
  if (!schedule_) {
    r.last_use_tick = ++tick_;
    changed = true;
  }
  if (changed) note_state(r);
  const size_t capacity = hints_.size();
  const Demand hint{tensor, tier, AccessMode::kRead};
  ++r.hints_in_ring;
  memo_groups_valid_ = false;  // the new hint has no memo yet
  if (hint_count_ == capacity) {
    unhint(hints_[hint_head_].tensor);
    hints_[hint_head_] = hint;  // the oldest hint gives way
    hint_memos_[hint_head_] = HintMemo{};
    hint_head_ = (hint_head_ + 1) % capacity;
  } else {
    hints_[(hint_head_ + hint_count_) % capacity] = hint;
    hint_memos_[(hint_head_ + hint_count_) % capacity] = HintMemo{};
    ++hint_count_;
  }
  pump();
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Durability

Status Scheduler::sync(std::chrono::nanoseconds timeout) {
  const Clock::time_point deadline = deadline_after(timeout);
  std::unique_lock lock(mu_);
  if (!cv_.wait_until(lock, deadline, [this] { return cleaning_inflight_ == 0; })) {
    return Status::error(STRATA_E_TIMEOUT, std::to_string(cleaning_inflight_) +
                                               " write-backs still in flight after " +
                                               millis(timeout));
  }
  return take_async_error();
}

Status Scheduler::flush(std::chrono::nanoseconds timeout) {
  const Clock::time_point deadline = deadline_after(timeout);
  std::unique_lock lock(mu_);
  flushing_ = true;
  pump();
  const bool done = cv_.wait_until(lock, deadline, [this] {
    return (flush_done() && cleaning_inflight_ == 0) || durability_failures_ > 0;
  });
  flushing_ = false;
  if (!done) {
    return Status::error(STRATA_E_TIMEOUT, "flush did not finish in " + millis(timeout));
  }
  // A failure ends the flush early; wait for the write-backs already started, then report.
  cv_.wait_until(lock, deadline, [this] { return cleaning_inflight_ == 0; });
  return take_async_error();
}

bool Scheduler::flush_done() const {
  for (uint32_t i = 0; i < registry_.slot_count(); ++i) {
    if (!registry_.live(i)) continue;
    const TensorRecord& r = registry_.at(i);
    if (r.residency.dirty() && r.uses == 0 && !r.failed() && r.home == Tier::kNvme) return false;
  }
  return true;
}

void Scheduler::set_prefetch_enabled(bool enabled) {
  std::lock_guard lock(mu_);
  prefetch_enabled_ = enabled;
  pump();
}

uint32_t Scheduler::inflight_transfers() const {
  std::lock_guard lock(mu_);
  return inflight_total_;
}

// ---------------------------------------------------------------------------------------------
// Stats

bool Scheduler::has_schedule() const {
  std::lock_guard lock(mu_);
  return schedule_.has_value();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mu_);
  SchedulerStats out = stats_;
  for (int i = 0; i < kLinkCount; ++i) out.inflight[i] = inflight_[i];
  out.live_tensors = registry_.live_count();
  out.schedule_phases = schedule_ ? schedule_->phase_count() : 0;
  out.recording = recording_;
  out.dirty_bytes = 0;
  for (uint32_t i = 0; i < registry_.slot_count(); ++i) {
    if (registry_.live(i) && registry_.at(i).residency.dirty())
      out.dirty_bytes += registry_.at(i).bytes;
  }
  out.pools.clear();
  for (const PoolState& pool : pools_) {
    out.pools.push_back({pool.spec.name, pool.spec.tier, pool.spec.budget_bytes,
                         pool.spec.reserved_bytes, pool.used, pool.peak,
                         static_cast<uint32_t>(pool.resident.size())});
  }
  return out;
}

TierUsage Scheduler::tier_usage(Tier tier) const {
  std::lock_guard lock(mu_);
  return tier == Tier::kNvme ? stats_.nvme : stats_.tiers[memory_index(tier)];
}

Scheduler::Usage Scheduler::usage() const {
  std::lock_guard lock(mu_);
  return {stats_.tiers[memory_index(Tier::kDevice)], stats_.tiers[memory_index(Tier::kPinned)],
          stats_.nvme};
}

void Scheduler::reset_peaks() {
  std::lock_guard lock(mu_);
  for (PoolState& pool : pools_) pool.peak = pool.used;
  const auto restart = [](TierUsage& usage) {
    usage.peak_in_use_bytes = usage.in_use_bytes;
    usage.peak_footprint_bytes = usage.footprint_bytes;
    usage.kind_peak_in_use_bytes = usage.kind_in_use_bytes;
  };
  for (TierUsage& usage : stats_.tiers) restart(usage);
  restart(stats_.nvme);
}

// ---------------------------------------------------------------------------------------------
// Completions

void Scheduler::on_transfer_complete(uint32_t op, Status status) {
  std::lock_guard lock(mu_);
  complete_locked(op, std::move(status));
  pump();
  cv_.notify_all();
}

void Scheduler::complete_locked(uint32_t id, Status status) {
  STRATA_ASSERT(id < ops_.size() && ops_[id].active);
  Op& op = ops_[id];
  if (op.range != kNoRange) {
    // A range copy moves no residency: it ends in its slot, for wait_copy_range.
    RangeCopy& copy = range_copies_[op.range];
    STRATA_ASSERT(copy.ticket != 0 && !copy.done);
    if (status.is_ok()) {
      stats_.link_bytes[static_cast<int>(op.link)] += copy.bytes;
      ++stats_.link_transfers[static_cast<int>(op.link)];
    } else {
      ++stats_.transfer_failures;
    }
    if (copy.abandoned) {
      copy = RangeCopy{};
    } else {
      copy.done = true;
      copy.status = std::move(status);
    }
    for (uint32_t held : {op.source, op.tensor}) {
      STRATA_ASSERT(registry_.at(held).range_copies > 0);
      --registry_.at(held).range_copies;
    }
    --inflight_[static_cast<int>(op.link)];
    --inflight_total_;
    op = Op{};
    free_ops_.push_back(id);
    return;
  }
  STRATA_ASSERT(registry_.live(op.tensor));
  TensorRecord& r = registry_.at(op.tensor);
  STRATA_ASSERT(r.op == id);
  const bool ok = status.is_ok();
  const int link = static_cast<int>(op.link);
  if (op.cleaning) {
    // The tier being cleaned: pinned for a write-back, device for a copy to host or a stream out.
    const Tier source = op.kind == OpKind::kWriteBack ? Tier::kPinned : Tier::kDevice;
    PoolState& pool = pools_[r.pool[memory_index(source)]];
    STRATA_ASSERT(pool.cleaning >= r.charged[memory_index(source)]);
    pool.cleaning -= r.charged[memory_index(source)];
    --cleaning_inflight_;
  }
  Status finished = r.residency.finish(ok, r.spec.name);
  STRATA_ASSERT(finished.is_ok());
  r.op = kNoOp;
  if (ok) {
    stats_.link_bytes[link] += r.bytes;
    ++stats_.link_transfers[link];
    const auto kind = static_cast<size_t>(r.spec.kind);
    if (op.link == Link::kNvmeRead) stats_.nvme_read_by_kind[kind] += r.bytes;
    if (op.link == Link::kNvmeWrite) stats_.nvme_written_by_kind[kind] += r.bytes;
  } else {
    ++stats_.transfer_failures;
    free_stale_buffers(r);  // the buffer the transfer was filling holds nothing trustworthy
    // A lost write-back or cleaning copy leaves dirty data pinned in memory: everybody waiting on
    // durability (sync, end_step) must hear of it. A failed read or copy-in only concerns the
    // tensor's next acquirer.
    const bool durability =
        op.kind == OpKind::kWriteBack || op.kind == OpKind::kStreamToNvme || op.cleaning;
    note_async_failure(r,
                       std::move(status).with_context(std::string(doing(op.kind)) + " " + label(r)),
                       durability);
  }
  --inflight_[link];
  --inflight_total_;
  op.active = false;
  free_ops_.push_back(id);
  if (r.discard_pending) {
    r.discard_pending = false;
    apply_discard(r);
  }
  note_state(r);
}

void Scheduler::note_async_failure(TensorRecord& r, const Status& status, bool durability) {
  clear_failure(r);
  r.failure = AsyncFailure{status, durability, ++failure_sequence_};
  if (durability) ++durability_failures_;
  note_state(r);
}

void Scheduler::clear_failure(TensorRecord& r) {
  if (!r.failed()) return;
  if (r.durability_failed()) {
    STRATA_ASSERT(durability_failures_ > 0);
    --durability_failures_;
  }
  r.failure.reset();
  note_state(r);
}

Status Scheduler::take_tensor_error(TensorRecord& r) {
  STRATA_ASSERT(r.failed());
  Status error = std::move(r.failure->status);
  clear_failure(r);
  if (error.is_ok()) error = Status::error(STRATA_E_INTERNAL, label(r) + " failed without a cause");
  return error;
}

Status Scheduler::take_async_error() {
  if (durability_failures_ == 0) return Status::ok();
  const AsyncFailure* earliest = nullptr;
  for (uint32_t i = 0; i < registry_.slot_count(); ++i) {
    if (!registry_.live(i) || !registry_.at(i).durability_failed()) continue;
    const AsyncFailure& f = *registry_.at(i).failure;
    if (earliest == nullptr || f.sequence < earliest->sequence) earliest = &f;
  }
  STRATA_ASSERT(earliest != nullptr);
  Status error = earliest->status;
  if (durability_failures_ > 1) {
    error = Status::error(error.code(), error.message() + " (and " +
                                            std::to_string(durability_failures_ - 1) +
                                            " more tensors whose write-back failed)");
  }
  // Reported: the failed write-backs may be tried again.
  for (uint32_t i = 0; i < registry_.slot_count(); ++i) {
    if (registry_.live(i) && registry_.at(i).durability_failed()) clear_failure(registry_.at(i));
  }
  STRATA_ASSERT(durability_failures_ == 0);
  pump();
  return error;
}

// ---------------------------------------------------------------------------------------------
// Decisions

uint64_t Scheduler::next_use(const TensorRecord& r, Tier tier) const {
  // LRU until a schedule exists (lru_distance). Never 0: without a schedule nothing is known to
  // be needed in "the current phase", so a hint (which spares distance 0) may evict anything not
  // in use.
  if (!schedule_) return lru_distance(r);
  const int mi = memory_index(tier);
  const auto filter = static_cast<uint8_t>(use_filter(r, tier));
  if (r.next_use_epoch[mi] != cursor_epoch_ || r.next_use_filter[mi] != filter) {
    r.next_use_memo[mi] = schedule_next_use(r, tier);
    r.next_use_epoch[mi] = cursor_epoch_;
    r.next_use_filter[mi] = filter;
  }
  return r.next_use_memo[mi];
}

UseFilter Scheduler::use_filter(const TensorRecord& r, Tier tier) const {
  // A pinned copy beside a valid device copy is needed only for reads on pinned; without a
  // device copy it is also the staging source for the next device read.
  return tier == Tier::kDevice                 ? UseFilter::kDevice
         : r.residency.valid_on(Tier::kDevice) ? UseFilter::kPinned
                                               : UseFilter::kAnyTier;
}

bool Scheduler::needs_cleaning(const TensorRecord& r, Tier tier) const {
  // Dirty data leaves memory through pinned buffers: a dirty pinned copy is written back before
  // its buffer goes, even beside a device copy (dropping it would undo the device->pinned copy
  // that cleaning the device copy needs, and the two evictions would chase each other).
  if (tier == Tier::kPinned) return r.residency.dirty();
  return (r.residency.valid() & static_cast<TierMask>(~tier_bit(tier))) == 0;
}

bool Scheduler::held_until_a_call(const TensorRecord& r, Tier tier) const {
  return r.home == tier || (r.failed() && needs_cleaning(r, tier));
}

bool Scheduler::evictable(const TensorRecord& r, Tier tier) const {
  return r.handle.index != advancing_ && evictable_unless_advancing(r, tier);
}

bool Scheduler::evictable_unless_advancing(const TensorRecord& r, Tier tier) const {
  if (r.home == tier) return false;
  if (!r.residency.valid_on(tier) || r.residency.in_flight() || r.discard_pending) return false;
  if (r.uses > 0 && r.use_tier == tier) return false;
  if (r.demanded()) return false;
  // Cleaning is a transfer: never on a tensor in use, nor one whose failure is unreported.
  if (needs_cleaning(r, tier) && (r.uses > 0 || r.failed())) return false;
  return true;
}

bool Scheduler::droppable(const TensorRecord& r, Tier tier) const {
  return r.pool[memory_index(tier)] != kNoPool && evictable_unless_advancing(r, tier) &&
         !needs_cleaning(r, tier);
}

void Scheduler::note_state(TensorRecord& r) {
  ++record_versions_[r.handle.index];
  if (r.hints_in_ring > 0) ++hinted_changes_;
  for (Tier tier : kMemoryTiers) {
    const int mi = memory_index(tier);
    const bool now = droppable(r, tier);
    if (now == r.counted_droppable[mi]) continue;
    uint64_t& pool_droppable = pools_[r.pool[mi]].droppable;
    if (now) {
      pool_droppable += r.charged[mi];
    } else {
      STRATA_ASSERT(pool_droppable >= r.charged[mi]);
      pool_droppable -= r.charged[mi];
    }
    r.counted_droppable[mi] = now;
  }
  for (Tier tier : kMemoryTiers) list_victim(r, tier);
  if (!schedule_) return;
  for (uint32_t position : lanes_.reads_of(r.handle.index)) {
    const Access& a = schedule_->access(position);
    lanes_.set(position, a.tensor == r.handle ? lane_of(r, a) : AccessLanes::kNoLane);
  }
}

uint32_t Scheduler::lane_of(const TensorRecord& r, const Access& a) const {
  // The order of advance()'s own checks: each of these makes it return without doing anything
  // (walk_schedule skips the first ones itself; the missing pools are advance's error, which the
  // walk ignores).
  constexpr uint32_t kNone = AccessLanes::kNoLane;
  if (a.mode == AccessMode::kOverwrite) return kNone;
  const ResidencyState& res = r.residency;
  if (res.valid_on(a.tier) || res.in_flight()) return kNone;
  if ((r.failed() && !r.durability_failed()) || r.discard_pending || r.uses > 0) return kNone;
  if (res.state() == Residency::kUnwritten) return kNone;
  if (r.pool[memory_index(a.tier)] == kNoPool) return kNone;
  // A tensor its user is done with for now (the optimizer's updated sub-groups) is not read back
  // by the walk. The walk starts at the current phase's first access, so it passes the accesses
  // the phase has made already, and read in during the next forward, far ahead of the next
  // optimizer, they were pushed out again before it came back to them (0.4-0.8 GiB read twice
  // per step on the main job). Its user hints or acquires it when it wants it. Without a lane
  // the walk does not even look at it: in the optimizer's one phase of a 70B step these are
  // tens of thousands of accesses, and each pump passed them.
  if (r.done_for_now) return kNone;
  const int pinned = r.pool[memory_index(Tier::kPinned)];
  if (a.tier == Tier::kDevice) {
    const auto device = static_cast<uint32_t>(r.pool[memory_index(a.tier)]);
    if (res.valid_on(Tier::kPinned)) return 2 * device;
    if (streams()) return 2 * device + 1;  // streamed from NVMe straight into the device pool
    // Staged through pinned memory: read from NVMe there first (the device copy is not valid).
    return pinned == kNoPool ? kNone : 2 * static_cast<uint32_t>(pinned);
  }
  return 2 * static_cast<uint32_t>(pinned) + (res.valid_on(Tier::kDevice) ? 1 : 0);
}

void Scheduler::index_schedule() {
  STRATA_ASSERT(schedule_.has_value());
  lanes_.reset(*schedule_, 2 * static_cast<uint32_t>(pools_.size()));
  for (uint32_t i = 0; i < registry_.slot_count(); ++i) {
    if (registry_.live(i)) note_state(registry_.at(i));
  }
}

void Scheduler::forget_state(TensorRecord& r) {
  ++record_versions_[r.handle.index];
  if (r.hints_in_ring > 0) ++hinted_changes_;
  for (Tier tier : kMemoryTiers) {
    const int mi = memory_index(tier);
    if (!r.counted_droppable[mi]) continue;
    STRATA_ASSERT(pools_[r.pool[mi]].droppable >= r.charged[mi]);
    pools_[r.pool[mi]].droppable -= r.charged[mi];
    r.counted_droppable[mi] = false;
  }
  for (Tier tier : kMemoryTiers) unlist_victim(r, memory_index(tier));
  if (!schedule_) return;
  for (uint32_t position : lanes_.reads_of(r.handle.index)) {
    lanes_.set(position, AccessLanes::kNoLane);
  }
}

void Scheduler::move_cursor(uint32_t phase) {
  // Forward, cyclically: every next use whose read the cursor does not pass shrinks by the same
  // distance, so the victim sets' order holds for them and only the tensors whose read was
  // passed (rank below the new clock: the sets' tails) take a new key.
  if (schedule_ && schedule_->phase_count() > 0) {
    const uint64_t phases = schedule_->phase_count();
    cursor_clock_ += (phase % phases + phases - cursor_ % phases) % phases;
  }
  cursor_ = phase;
  ++cursor_epoch_;
  for (PoolState& pool : pools_) {
    for (auto& set : pool.victims) {
      while (!set.empty() && std::prev(set.end())->rank < cursor_clock_) {
        // Its stored rank is below the clock and the new one is not: list_victim moves it.
        list_victim(registry_.at(std::prev(set.end())->tensor), pool.spec.tier);
      }
      // A tensor done with for now whose next read is the phase the cursor has reached ranks
      // from the read after it: its stored rank, the clock itself, is stale. It moves up.
      // (Re-listing moves it out of the tail and invalidates the iterator: look again from the
      // end.)
      for (auto it = set.rbegin(); it != set.rend() && it->rank == cursor_clock_;) {
        TensorRecord& c = registry_.at(it->tensor);
        if (!c.done_for_now) {
          ++it;
          continue;
        }
        list_victim(c, pool.spec.tier);
        it = set.rbegin();
      }
    }
  }
}

uint64_t Scheduler::victim_rank(const TensorRecord& r, Tier tier) const {
  if (!schedule_) {
    // lru_distance's order: done with for now first, then the rest; older first within each.
    constexpr uint64_t kBand = uint64_t{1} << 62;  // past any tick
    return (r.done_for_now ? 2 * kBand : kBand) - r.last_use_tick;
  }
  const uint64_t next = schedule_next_use(r, tier);
  return next == kNeverUsed ? kNeverUsed : cursor_clock_ + next;
}

void Scheduler::unlist_victim(TensorRecord& r, int memory_index) {
  const int mi = memory_index;
  if (!r.victim_listed[mi]) return;
  STRATA_ASSERT(*r.victim_at[mi] == r.victim_key[mi]);
  pools_[r.pool[mi]].victims[r.victim_dirty[mi] ? 1 : 0].erase(r.victim_at[mi]);
  r.victim_listed[mi] = false;
}

void Scheduler::list_victim(TensorRecord& r, Tier tier) {
  const int mi = memory_index(tier);
  if (r.pool[mi] == kNoPool || !evictable_unless_advancing(r, tier)) {
    unlist_victim(r, mi);
    return;
  }
  const VictimKey key{victim_rank(r, tier), r.charged[mi], r.handle.index};
  const bool dirty = needs_cleaning(r, tier);
  if (r.victim_listed[mi] && r.victim_dirty[mi] == dirty && r.victim_key[mi] == key) return;
  unlist_victim(r, mi);
  const auto [at, inserted] = pools_[r.pool[mi]].victims[dirty ? 1 : 0].insert(key);
  STRATA_ASSERT(inserted);
  r.victim_at[mi] = at;
  r.victim_listed[mi] = true;
  r.victim_dirty[mi] = dirty;
  r.victim_key[mi] = key;
}

Scheduler::Space Scheduler::ensure_space(int pool_index, uint64_t need, uint64_t min_next_use,
                                         Status* why) {
  PoolState& pool = pools_[pool_index];
  const Tier tier = pool.spec.tier;
  const uint64_t budget = pool.spec.budget_bytes;
  if (need > budget) {
    *why = Status::error(budget_code(tier), "needs " + format_bytes(need) + " in pool '" +
                                                pool.spec.name + "', whose budget is " +
                                                budget_text(pool.spec) + budget_advice(tier));
    return Space::kImpossible;
  }
  const Link cleaning_link = cleaning_link_of(tier);
  // The best clean and the best dirty candidate are the first entries of the pool's victim sets
  // (past the tensor being advanced, which evictable() refuses); choose_victim's order picks
  // between them. Each drop or cleaning takes its victim out of the sets through note_state.
  const auto first_of = [&](int dirty) -> std::optional<EvictionCandidate> {
    const VictimKey* key = first_victim(pool, dirty);
    if (key == nullptr) return std::nullopt;
    const TensorRecord& c = registry_.at(key->tensor);
    return EvictionCandidate{key->tensor, next_use(c, tier), key->charged_bytes, dirty == 1};
  };
  for (;;) {
    STRATA_ASSERT(pool.used <= budget);
    if (pool.used + need <= budget) return Space::kReady;
    const uint64_t free = budget - pool.used;
    std::array<EvictionCandidate, 2> best;
    size_t candidates = 0;
    if (auto clean = first_of(0)) best[candidates++] = *clean;
    if (auto dirty = first_of(1)) best[candidates++] = *dirty;
    if (free + pool.cleaning >= need) {
      // The writes in flight will make the room: wait for them rather than drop what may be
      // read again. A demand still drops at once a clean copy the schedule never reads again
      // (dropping it costs no read later), instead of waiting for a write to free another: a
      // pack of offloaded activations waited for each chunk's write while the chunks written
      // before it sat clean in the pool, and the drive idled while the compute stream copied
      // (docs/scheduling.md). Copies the schedule reads again wait, as before: dropping them
      // made a 70B step read 3% more.
      const bool clean_never_read =
          candidates > 0 && !best[0].needs_cleaning && best[0].next_use == kNeverUsed;
      if (min_next_use > 0 || !clean_never_read) return Space::kWaiting;
    }
    const size_t v =
        choose_victim(std::span(best.data(), candidates), min_next_use, link_free(cleaning_link));
    if (v == kNoVictim) {
      // A prefetch (min_next_use > 0) waits either way; only a demand needs "wait" told from
      // "never", which scans every resident (once the optimizer's step was one phase, hints met
      // no victim on most pumps, and this scan was a third of a 70B plan's time).
      if (min_next_use > 0) return Space::kWaiting;
      // What could ever be freed, to tell "wait" from "never": everything but home tensors and
      // dirty ones whose write-back failed (they stay until the failure has been reported).
      const TensorRecord* failed_holder = nullptr;
      const uint64_t potential = freeable_bytes(pool, tier, &failed_holder);
      if (potential < need && failed_holder != nullptr) {
        *why = Status::error(
            failed_holder->failure->status.code(),
            "needs " + format_bytes(need) + " in pool '" + pool.spec.name + "', held by " +
                label(*failed_holder) +
                " until its failure is reported: " + failed_holder->failure->status.message());
        return Space::kImpossible;
      }
      if (potential < need) {
        *why = Status::error(
            budget_code(tier),
            "needs " + format_bytes(need) + " in pool '" + pool.spec.name + "' (budget " +
                budget_text(pool.spec) + "), but tensors that never leave it hold " +
                format_bytes(budget - potential) + budget_advice(tier) + " or free some of them");
        return Space::kImpossible;
      }
      return Space::kWaiting;
    }
    TensorRecord& victim = registry_.at(best[v].tensor);
    STRATA_ASSERT(evictable(victim, tier));
    if (!best[v].needs_cleaning) {
      STRATA_ASSERT(!held_until_a_call(victim, tier));
      drop_copy(victim, tier);
      ++stats_.evictions;
      continue;
    }
    Status closed;
    if (!start_cleaning(victim, tier, min_next_use, &closed)) {
      // A cleaning that failed outright (no NVMe space for the write-back) marked the victim
      // failed, which took it out of the sets: look again without it, so that a hard error is
      // never turned into a wait.
      if (victim.durability_failed()) continue;
      // The victim's way out through pinned memory is closed for good (reliability finding 42):
      // a demand that nothing else in this pool can make room for would wait its whole timeout.
      if (!closed.is_ok() && min_next_use == 0) {
        return device_room_with_pinned_closed(pool, need, victim, closed, why);
      }
      return Space::kWaiting;
    }
  }
}

uint64_t Scheduler::freeable_bytes(const PoolState& pool, Tier tier,
                                   const TensorRecord** failed_holder) const {
  const int mi = memory_index(tier);
  uint64_t freeable = pool.spec.budget_bytes - pool.used;
  for (const uint32_t index : pool.resident) {
    const TensorRecord& c = registry_.at(index);
    if (failed_holder != nullptr && c.failed() && needs_cleaning(c, tier)) *failed_holder = &c;
    if (!held_until_a_call(c, tier)) freeable += c.charged[mi];
  }
  return freeable;
}

Scheduler::Space Scheduler::device_room_with_pinned_closed(const PoolState& pool, uint64_t need,
                                                           const TensorRecord& victim,
                                                           const Status& closed, Status* why) {
  STRATA_ASSERT(pool.spec.tier == Tier::kDevice);
  const int device = memory_index(Tier::kDevice);
  const int pinned = memory_index(Tier::kPinned);
  // A dirty resident that leaves through pinned memory (start_cleaning's last branch) can leave
  // only if its pinned charge fits what that pinned pool could ever free. Cold path: it runs
  // once, on a demand about to fail.
  std::vector<std::pair<int, uint64_t>> pinned_freeable;  // pinned pool index -> freeable bytes
  const auto pinned_room = [&](int pinned_pool) {
    for (const auto& [index, bytes] : pinned_freeable)
      if (index == pinned_pool) return bytes;
    const uint64_t bytes = freeable_bytes(pools_[pinned_pool], Tier::kPinned);
    pinned_freeable.emplace_back(pinned_pool, bytes);
    return bytes;
  };
  uint64_t potential = pool.spec.budget_bytes - pool.used;
  for (const uint32_t index : pool.resident) {
    const TensorRecord& c = registry_.at(index);
    if (held_until_a_call(c, Tier::kDevice)) continue;
    if (needs_cleaning(c, Tier::kDevice) && !streams_out_of_device(c)) {
      const int pinned_pool = c.pool[pinned];
      if (pinned_pool == kNoPool || c.charged[pinned] > pinned_room(pinned_pool)) continue;
    }
    potential += c.charged[device];
  }
  if (potential >= need) return Space::kWaiting;
  *why = Status::error(
      closed.code(), "needs " + format_bytes(need) + " in pool '" + pool.spec.name + "', held by " +
                         label(victim) +
                         ", which can leave it only through pinned memory: " + closed.message());
  return Space::kImpossible;
}

bool Scheduler::streams_out_of_device(const TensorRecord& r) const {
  return streams() && r.home != Tier::kPinned;
}

bool Scheduler::start_cleaning(TensorRecord& r, Tier tier, uint64_t min_next_use,
                               Status* impossible) {
  if (tier == Tier::kPinned) {
    if (!link_free(Link::kNvmeWrite)) return false;
    if (!r.extent.valid()) {
      Status extent = allocate_extent(r);
      if (!extent) {
        note_async_failure(r, std::move(extent).with_context("writing back " + label(r)),
                           /*durability=*/true);
        return false;
      }
    }
    if (!issue(r, OpKind::kWriteBack, /*cleaning=*/true, false).is_ok()) return false;
  } else if (streams_out_of_device(r)) {
    // Device data with no other copy streams to NVMe through the staging buffers: no pinned room.
    // Not a tensor at home in pinned memory: its data goes home below, never to NVMe (LoRA's
    // adapters resting there were written to NVMe and read back every step under a tight device
    // budget on the GPU path; docs/reliability.md, finding 39).
    if (!link_free(Link::kNvmeWrite)) return false;
    if (!r.extent.valid()) {
      Status extent = allocate_extent(r);
      if (!extent) {
        note_async_failure(r, std::move(extent).with_context("writing back " + label(r)),
                           /*durability=*/true);
        return false;
      }
    }
    if (!issue(r, OpKind::kStreamToNvme, /*cleaning=*/true, false).is_ok()) return false;
  } else {
    // Device data with no other copy goes to pinned memory first (and from there to NVMe, unless
    // pinned memory is its home).
    if (!link_free(Link::kDeviceToHost)) return false;
    const int pinned_pool = r.pool[memory_index(Tier::kPinned)];
    if (pinned_pool == kNoPool) return false;
    // Only a demand (min_next_use 0) may take pinned room that a waiting demand needs.
    if (min_next_use > 0 && (demand_pools_ & (1u << pinned_pool)) != 0) return false;
    const uint64_t charge = r.charged[memory_index(Tier::kPinned)];
    Status why;
    Space space = ensure_space(pinned_pool, charge, min_next_use, &why);
    if (space == Space::kWaiting && min_next_use == 0 && yield_staging_of_advancing(pinned_pool)) {
      space = ensure_space(pinned_pool, charge, min_next_use, &why);
    }
    if (space == Space::kImpossible && impossible != nullptr) *impossible = std::move(why);
    if (space != Space::kReady) return false;
    Status allocated = allocate_buffer(r, Tier::kPinned);
    if (!allocated.is_ok()) {
      // The pool had room but the memory could not be had (the host or its lock limit refused
      // it): a hard error, noted as the lost write-back it is, never left to a wait that can
      // only time out. The data stays on the device; sync and end_step report it.
      note_async_failure(r, std::move(allocated).with_context("writing back " + label(r)),
                         /*durability=*/true);
      return false;
    }
    // A refused submission unwinds as a failed transfer, which notes a durability failure.
    if (!issue(r, OpKind::kCopyToHost, /*cleaning=*/true, false).is_ok()) return false;
  }
  ++stats_.cleanings;
  return true;
}

// A demand for device room may have to write a device victim back through pinned memory, and
// the pinned room it needs may be held by the demanded tensor's own staged copy: the demand then
// waited for itself until its timeout (found by tests/fuzz/c_api_fuzz). When nothing else in the
// pool can ever leave - no cleaning in flight, every other tensor at home there - that copy
// gives way and is read again once the victim is out. A clean copy (its data is on NVMe or the
// device too) gives way at once; a dirty one is written back first, and gives way on the pass
// after that write completes (reliability finding 33: it held its room, and the demand waited
// its 300 s). Anything short of that still resolves by waiting, and yielding there would only
// reorder transfers.
bool Scheduler::yield_staging_of_advancing(int pinned_pool) {
  if (advancing_ == UINT32_MAX) return false;
  const PoolState& pool = pools_[pinned_pool];
  if (pool.cleaning > 0) return false;
  for (uint32_t index : pool.resident) {
    if (index != advancing_ && registry_.at(index).home != Tier::kPinned) return false;
  }
  TensorRecord& r = registry_.at(advancing_);
  const Tier pinned = Tier::kPinned;
  if (r.home == pinned || r.pool[memory_index(pinned)] != pinned_pool) return false;
  if (!r.residency.valid_on(pinned) || r.residency.in_flight() || r.discard_pending) return false;
  if (r.uses > 0) return false;
  if (needs_cleaning(r, pinned)) {
    // Its data reaches NVMe first (not a copy whose failure is unreported: cleaning is a transfer
    // and waits for that report); the write's completion pumps again, and that pass yields.
    if (!r.failed()) (void)start_cleaning(r, pinned, 0, nullptr);
    return false;
  }
  if ((r.residency.valid() & static_cast<TierMask>(~tier_bit(pinned))) == 0) return false;
  drop_copy(r, pinned);
  ++stats_.evictions;
  return true;
}

Scheduler::StepResult Scheduler::advance(TensorRecord& r, Tier target, uint64_t min_next_use,
                                         bool prefetch) {
  if (r.residency.in_flight()) return {Step::kInFlight, {}};
  if (r.residency.valid_on(target)) return {Step::kResident, {}};
  // A failed read waits for its report; a failed write-back does not stop copies between the
  // memory tiers (the data there is the newest).
  if ((r.failed() && !r.durability_failed()) || r.discard_pending || r.uses > 0) {
    return {Step::kSkip, {}};
  }
  if (r.residency.state() == Residency::kUnwritten) return {Step::kSkip, {}};  // nothing to load
  const AdvancingGuard guard(advancing_, r.handle.index);
  const int mi = memory_index(target);
  if (r.pool[mi] == kNoPool) {
    return {Step::kError, invalid_argument(label(r) + ": no " + std::string(to_string(target)) +
                                           " pool serves kind " + to_string(r.spec.kind))};
  }
  // From NVMe alone to the device: streamed, or staged through a pinned copy of its own.
  const bool stream = target == Tier::kDevice && !r.residency.valid_on(Tier::kPinned) && streams();
  if (target == Tier::kDevice && !r.residency.valid_on(Tier::kPinned) && !stream) {
    return advance(r, Tier::kPinned, min_next_use, prefetch);
  }
  const Link link = stream                                ? Link::kNvmeRead
                    : target == Tier::kDevice             ? Link::kHostToDevice
                    : r.residency.valid_on(Tier::kDevice) ? Link::kDeviceToHost
                                                          : Link::kNvmeRead;
  if (!link_free(link)) return {Step::kLinkBusy, {}, link};  // refused before any room is made
  Status why;
  const Space space = ensure_space(r.pool[mi], r.charged[mi], min_next_use, &why);
  if (space == Space::kImpossible) return {Step::kError, std::move(why).with_context(label(r))};
  if (space == Space::kWaiting) return {Step::kBlocked, {}, link};
  // Making room may have taken the staged copy this transfer starts from.
  const auto source_gone = [&] {
    return target == Tier::kDevice && !stream && !r.residency.valid_on(Tier::kPinned);
  };
  if (source_gone()) return {Step::kBlocked, {}};
  // ensure_space may have started a cleaning copy on the same link.
  if (!link_free(link)) return {Step::kLinkBusy, {}};
  const Space allocated = allocate_in_room(r, target, min_next_use, &why);
  if (allocated == Space::kImpossible) return {Step::kError, std::move(why)};
  if (allocated == Space::kWaiting) return {Step::kBlocked, {}};
  // More room for the arena may have been made the same ways as above: check both again.
  if (source_gone() || !link_free(link)) {
    const bool blocked = source_gone();
    free_buffer(r, target);
    return {blocked ? Step::kBlocked : Step::kLinkBusy, {}};
  }
  const OpKind kind = stream                        ? OpKind::kStreamToDevice
                      : link == Link::kHostToDevice ? OpKind::kCopyToDevice
                      : link == Link::kDeviceToHost ? OpKind::kCopyToHost
                                                    : OpKind::kRead;
  Status issued = issue(r, kind, /*cleaning=*/false, prefetch);
  if (!issued) return {Step::kError, std::move(issued)};
  return {Step::kIssued, {}};
}

Status Scheduler::issue(TensorRecord& r, OpKind kind, bool cleaning, bool prefetch) {
  const Link link = link_of(kind);
  STRATA_ASSERT(link_free(link) && !free_ops_.empty());
  // Range copies move bytes between two tensors in use and change no residency:
  // start_copy_range issues them, never this.
  STRATA_ASSERT(kind != OpKind::kRangeToDevice && kind != OpKind::kRangeToHost);
  Status began;
  switch (kind) {
    case OpKind::kRead:
      began = r.residency.begin_read(r.spec.name);
      break;
    case OpKind::kWriteBack:
      began = r.residency.begin_write_back(r.spec.name);
      break;
    case OpKind::kCopyToDevice:
      began = r.residency.begin_copy_to_device(r.spec.name);
      break;
    case OpKind::kCopyToHost:
      began = r.residency.begin_copy_to_host(r.spec.name);
      break;
    case OpKind::kStreamToDevice:
      began = r.residency.begin_stream_to_device(r.spec.name);
      break;
    case OpKind::kStreamToNvme:
      began = r.residency.begin_stream_to_nvme(r.spec.name);
      break;
    case OpKind::kRangeToDevice:
    case OpKind::kRangeToHost:
      break;  // refused above
  }
  if (!began) {
    free_stale_buffers(r);
    return began;
  }
  const uint32_t id = free_ops_.back();
  free_ops_.pop_back();
  ops_[id] = {kind, link, r.handle.index, cleaning, true};
  ++inflight_[static_cast<int>(link)];
  ++inflight_total_;
  r.op = id;
  // Data brought into memory is brought in to be used: whatever write_behind said of it is over.
  if (!cleaning) (void)set_done_for_now(r, false);  // re-listed by note_state below
  if (cleaning) {
    const Tier source = kind == OpKind::kWriteBack ? Tier::kPinned : Tier::kDevice;
    STRATA_ASSERT(kind == OpKind::kWriteBack || kind == OpKind::kCopyToHost ||
                  kind == OpKind::kStreamToNvme);
    pools_[r.pool[memory_index(source)]].cleaning += r.charged[memory_index(source)];
    ++cleaning_inflight_;
  }
  note_state(r);
  const Buffer& pinned = r.buffer[memory_index(Tier::kPinned)];
  const Buffer& device = r.buffer[memory_index(Tier::kDevice)];
  const Completion done{this, id};
  const ScopedTransferLabel labelled(r.spec);  // names the backend's trace span
  Status submitted;
  switch (kind) {
    case OpKind::kRead:
      submitted = backend_.read(r.extent, pinned, r.bytes, done);
      break;
    case OpKind::kWriteBack:
      submitted = backend_.write(pinned, r.extent, r.bytes, done);
      break;
    case OpKind::kCopyToDevice:
      submitted = backend_.copy_to_device(pinned, device, r.bytes, done);
      break;
    case OpKind::kCopyToHost:
      submitted = backend_.copy_to_host(device, pinned, r.bytes, done);
      break;
    case OpKind::kStreamToDevice:
      submitted = backend_.stream_to_device(r.extent, device, r.bytes, done);
      break;
    case OpKind::kStreamToNvme:
      submitted = backend_.stream_to_nvme(device, r.extent, r.bytes, done);
      break;
    case OpKind::kRangeToDevice:
    case OpKind::kRangeToHost:
      break;  // refused above
  }
  if (!submitted) {
    // Refused at once: no completion will come. Unwind exactly as a failed transfer would; the
    // caller gets the error directly, so only a lost write-back stays noted for sync/end_step.
    Status copy = submitted;
    complete_locked(id, std::move(copy));
    if (r.failed() && !r.durability_failed()) clear_failure(r);
    return submitted;
  }
  if (!cleaning) ++(prefetch ? stats_.prefetch_transfers : stats_.demand_transfers);
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Buffers and accounting

Status Scheduler::allocate_buffer(TensorRecord& r, Tier tier) {
  const int mi = memory_index(tier);
  STRATA_ASSERT(!r.buffer[mi].valid() && r.pool[mi] != kNoPool);
  STRATA_ASSERT(pools_[r.pool[mi]].used + r.charged[mi] <= pools_[r.pool[mi]].spec.budget_bytes);
  Result<Buffer> buffer = backend_.allocate(tier, r.bytes, r.spec.kind);
  if (!buffer) {
    return std::move(buffer).take_status().with_context(
        "allocating " + std::string(to_string(tier)) + " memory for " + label(r));
  }
  r.buffer[mi] = *buffer;
  charge(r, tier, true);
  return Status::ok();
}

// The pool's count and the backend's arena are two facts about the same memory, and the count
// is not enough: the device slab is one range allocator, whose free bytes may lie in ranges each
// smaller than the tensor while the count says it fits (reliability finding 8: a training step
// failed with STRATA_E_DEVICE_BUDGET at 1.10 MiB in use of a 1.60 MiB slab). Then one more victim
// leaves, chosen by the same order as any room (ensure_space asked for one byte more than is
// free), and the allocation is tried again: a freed range merges with its free neighbours, so
// each round can only widen the ranges, and the rounds end when nothing more can leave. A victim
// that must be cleaned first makes it a wait, like any room.
Scheduler::Space Scheduler::allocate_in_room(TensorRecord& r, Tier tier, uint64_t min_next_use,
                                             Status* why) {
  const int pool_index = r.pool[memory_index(tier)];
  const PoolState& pool = pools_[pool_index];
  for (;;) {
    Status allocated = allocate_buffer(r, tier);
    if (allocated) return Space::kReady;
    if (allocated.code() != budget_code(tier) || pool.used == 0) {
      *why = std::move(allocated);
      return Space::kImpossible;
    }
    const uint64_t one_more_victim = pool.spec.budget_bytes - pool.used + 1;
    Status no_victim;
    const Space space = ensure_space(pool_index, one_more_victim, min_next_use, &no_victim);
    if (space == Space::kWaiting) {
      // A demand whose pool has no victim left, nothing being cleaned and no transfer in flight
      // anywhere can only be served by a release, and the tensors in use are commonly the
      // caller's own (a framework holds a layer's weights while it acquires the next one): the
      // wait would end at the timeout, 300 s later (reliability finding 31: the LoRA bench with
      // a 2 MiB device budget, 725 KiB free in ranges each under the 344 KiB weight it asked
      // for, every other tensor held by the caller). The arena's refusal now, as when nothing
      // can ever leave.
      const bool only_a_release_helps = min_next_use == 0 && pool.cleaning == 0 &&
                                        inflight_total_ == 0 && first_victim(pool, 0) == nullptr &&
                                        first_victim(pool, 1) == nullptr;
      if (!only_a_release_helps) return Space::kWaiting;
      *why = std::move(allocated).with_context(
          "every other tensor in pool '" + pool.spec.name +
          "' is in use or at home: release some, or raise the pool's budget");
      return Space::kImpossible;
    }
    if (space == Space::kImpossible) {
      *why = std::move(allocated).with_context("after every tensor that can leave pool '" +
                                               pool.spec.name + "' has left");
      return Space::kImpossible;
    }
    ++stats_.arena_retries;
  }
}

bool Scheduler::hint_room_waits(int pool_index, uint64_t need) const {
  // ensure_space's first steps for a prefetch (min_next_use 1), in its order.
  const PoolState& pool = pools_[pool_index];
  const uint64_t budget = pool.spec.budget_bytes;
  if (need > budget || pool.used + need <= budget) return false;
  if (budget - pool.used + pool.cleaning >= need) return true;
  if (prefetch_may_evict(first_victim(pool, 0))) return false;
  return !(link_free(cleaning_link_of(pool.spec.tier)) &&
           prefetch_may_evict(first_victim(pool, 1)));
}

bool Scheduler::prefetch_may_evict(const VictimKey* key) const {
  // A rank is the cursor clock plus the next use (victim_rank); without a schedule every next
  // use is at least 1 (lru_distance).
  return key != nullptr && (!schedule_ || key->rank != cursor_clock_);
}

void Scheduler::unhint(TensorHandle tensor) {
  Result<uint32_t> index = registry_.resolve(tensor);
  if (!index) return;  // unregistered since (its record's count went with it)
  TensorRecord& r = registry_.at(*index);
  STRATA_ASSERT(r.hints_in_ring > 0);
  --r.hints_in_ring;
}

const VictimKey* Scheduler::first_victim(const PoolState& pool, int dirty) const {
  for (const VictimKey& key : pool.victims[dirty]) {
    if (key.tensor != advancing_) return &key;
  }
  return nullptr;
}

void Scheduler::free_buffer(TensorRecord& r, Tier tier) {
  const int mi = memory_index(tier);
  STRATA_ASSERT(r.buffer[mi].valid());
  backend_.free(tier, r.buffer[mi]);
  r.buffer[mi] = Buffer{};
  charge(r, tier, false);
}

Status Scheduler::allocate_extent(TensorRecord& r) {
  STRATA_ASSERT(!r.extent.valid());
  Result<Extent> extent = backend_.allocate_extent(r.bytes);
  if (!extent) return std::move(extent).take_status();
  STRATA_ASSERT(extent->valid() && extent->bytes >= r.bytes);
  r.extent = *extent;
  count_usage(stats_.nvme, r.spec.kind, r.extent.bytes, /*add=*/true, /*footprint=*/true);
  return Status::ok();
}

void Scheduler::free_extent(TensorRecord& r) {
  STRATA_ASSERT(r.extent.valid());
  backend_.free_extent(r.extent);
  count_usage(stats_.nvme, r.spec.kind, r.extent.bytes, /*add=*/false, /*footprint=*/true);
  r.extent = Extent{};
}

void Scheduler::charge(TensorRecord& r, Tier tier, bool add) {
  const int mi = memory_index(tier);
  PoolState& pool = pools_[r.pool[mi]];
  const uint64_t bytes = r.charged[mi];
  // A reserved pool's memory is in the footprint whatever its use; an on-demand pool's only while
  // buffers exist.
  const bool on_demand = pool.spec.reserved_bytes == 0;
  if (add) {
    pool.used += bytes;
    pool.peak = std::max(pool.peak, pool.used);
    r.resident_pos[mi] = static_cast<uint32_t>(pool.resident.size());
    pool.resident.push_back(r.handle.index);
  } else {
    STRATA_ASSERT(pool.used >= bytes && r.resident_pos[mi] < pool.resident.size());
    pool.used -= bytes;
    const uint32_t pos = r.resident_pos[mi];
    const uint32_t moved = pool.resident.back();
    pool.resident[pos] = moved;
    registry_.at(moved).resident_pos[mi] = pos;
    pool.resident.pop_back();
    r.resident_pos[mi] = kNotResident;
  }
  count_usage(stats_.tiers[mi], r.spec.kind, bytes, add, on_demand);
}

void Scheduler::free_stale_buffers(TensorRecord& r) {
  for (Tier tier : kMemoryTiers) {
    const int mi = memory_index(tier);
    if (!r.buffer[mi].valid() || r.residency.valid_on(tier)) continue;
    if (r.residency.in_flight() && r.residency.transfer_target() == tier) continue;
    free_buffer(r, tier);
  }
}

void Scheduler::drop_copy(TensorRecord& r, Tier tier) {
  Status dropped = r.residency.drop(tier, r.spec.name);
  STRATA_ASSERT(dropped.is_ok());  // callers check evictable() first
  free_stale_buffers(r);
  note_state(r);
}

void Scheduler::apply_discard(TensorRecord& r) {
  // No contents: a read ahead of them has nothing to bring.
  if (set_awaited(r, false)) note_state(r);
  if (r.residency.state() == Residency::kUnwritten) return;  // nothing to forget
  Status discarded = r.residency.discard(r.spec.name);
  STRATA_ASSERT(discarded.is_ok());
  free_stale_buffers(r);
  clear_failure(r);
  note_state(r);
}

// ---------------------------------------------------------------------------------------------
// The pump: after every event, issue what the decisions call for.

Status Scheduler::add_demand(const TensorRecord& r, Tier tier, AccessMode mode) {
  for (const Demand& d : demands_) {
    if (d.tensor == r.handle && d.tier == tier) return Status::ok();
  }
  if (demands_.size() >= config_.max_waiting) {
    return Status::error(STRATA_E_LIMIT, "more than " + std::to_string(config_.max_waiting) +
                                             " acquires are waiting at once");
  }
  demands_.push_back({r.handle, tier, mode});
  return Status::ok();
}

void Scheduler::pump() {
  if (pumping_ || stopping_) return;
  pumping_ = true;
  for (PoolState& pool : pools_) pool.waiting = 0;
  demand_pools_ = serve_demands();
  if (flushing_) flush_step();
  if (prefetch_enabled_) {
    serve_hints(demand_pools_);
    walk_schedule(demand_pools_);
  }
  clean_ahead();
  demand_pools_ = 0;
  pumping_ = false;
  if (config_.check_invariants) {
    const Status checked = check_invariants_locked();
    if (!checked.is_ok()) {
      std::fprintf(stderr, "strata: scheduler invariant violated after a pump: %s\n",
                   checked.message().c_str());
      std::abort();
    }
  }
}

uint32_t Scheduler::serve_demands() {
  uint32_t blocked = 0;
  size_t kept = 0;
  for (size_t i = 0; i < demands_.size(); ++i) {
    const Demand d = demands_[i];
    Result<uint32_t> index = registry_.resolve(d.tensor);
    if (!index || !registry_.at(*index).demanded(d.tier)) continue;  // served or given up
    demands_[kept++] = d;
    TensorRecord& r = registry_.at(*index);
    const int mi = memory_index(d.tier);
    if (r.residency.in_flight() || r.residency.valid_on(d.tier) || r.pool[mi] == kNoPool) continue;
    if (d.mode == AccessMode::kOverwrite || r.residency.state() == Residency::kUnwritten) {
      // The acquirer allocates when it retries; here only make the room (start cleanings).
      if (r.buffer[mi].valid()) continue;
      Status why;
      if (ensure_space(r.pool[mi], r.charged[mi], 0, &why) == Space::kWaiting) {
        note_waiting(r, d.tier);
      }
      // Whatever room there is now belongs to this demand: prefetch must not take it before the
      // acquirer comes back for it (it would evict, prefetch, evict... and never get there).
      blocked |= 1u << r.pool[mi];
      continue;
    }
    const StepResult step = advance(r, d.tier, 0, /*prefetch=*/false);
    if (step.step == Step::kBlocked) {
      blocked |= 1u << r.pool[memory_index(staged_on(r, d.tier))];
      note_waiting(r, staged_on(r, d.tier));
    }
  }
  demands_.resize(kept);
  return blocked;
}

uint64_t Scheduler::group_waiting(const MemoGroup& group, uint32_t blocked_pools) const {
  // As a pass would find each memo with its record unchanged, in serve_hints_pass's and
  // advance()'s order: a pool a demand holds keeps the hint, with the waiting bytes its record
  // adds; a full link refuses it first, with none; then the room decides. One answer for the
  // whole group: held pool and full link are the same for all of its memos, and
  // hint_room_waits is true on an interval of bytes (each of its conditions is either "at most"
  // or "more than" a bound), so its least and most bytes answer for the rest. (A plain value,
  // not an optional: this runs for every hint on most passes, and returning an optional cost a
  // stalled store-to-load forward each time.)
  if (group.kind == HintMemo::Kind::kNone) return kGroupDoesNotHold;
  const bool held = (blocked_pools & (1u << group.pool)) != 0;
  switch (group.kind) {
    case HintMemo::Kind::kNone:
      break;
    case HintMemo::Kind::kPoolHeld:
      return held ? group.bytes : kGroupDoesNotHold;
    case HintMemo::Kind::kLinkFull:
    case HintMemo::Kind::kRoomWait:
      if (held) return group.bytes;  // the record wants room there (it got as far as the link)
      if (!link_free(group.link)) return 0;
      if (group.kind == HintMemo::Kind::kRoomWait && hint_room_waits(group.pool, group.least) &&
          (group.most == group.least || hint_room_waits(group.pool, group.most))) {
        return group.bytes;
      }
      break;
  }
  return kGroupDoesNotHold;
}

bool Scheduler::group_memos_into(std::vector<MemoGroup>& groups) const {
  groups.clear();
  // Memos describe their records only if the pass changed none the ring names.
  if (hinted_changes_after_pass_ != hinted_changes_) return false;
  const size_t capacity = hints_.size();
  size_t last = 0;  // the group of the hint before
  for (size_t i = 0, at = hint_head_; i < hint_count_; ++i, at = at + 1 == capacity ? 0 : at + 1) {
    const HintMemo& memo = hint_memos_[at];
    if (memo.kind == HintMemo::Kind::kNone) return false;  // a hint the next pass must look at
    const auto same = [&](const MemoGroup& g) {
      return g.kind == memo.kind && g.link == memo.link && g.pool == memo.pool;
    };
    // Neighbours in the ring mostly share a group (a window of read-ahead hints).
    if (last == groups.size() || !same(groups[last])) {
      last = static_cast<size_t>(std::find_if(groups.begin(), groups.end(), same) - groups.begin());
      if (last == groups.size()) {
        // At most one group per hint: within the capacity reserved, no allocation.
        groups.push_back(MemoGroup::of(memo));
        continue;
      }
    }
    MemoGroup& group = groups[last];
    group.bytes += memo.bytes;
    group.least = std::min(group.least, memo.bytes);
    group.most = std::max(group.most, memo.bytes);
  }
  return true;
}

void Scheduler::group_memos() {
  memo_groups_valid_ = group_memos_into(memo_groups_);
}

void Scheduler::serve_hints(uint32_t blocked_pools) {
  // While every memo describes its record (no ring change, no change of a record it names since
  // the last pass), a pass in which every memo holds keeps every hint and does nothing else: the
  // groups answer that in a few checks, and give the waiting bytes the pass would add.
  // One look per group: group_waiting reads no pool's waiting bytes, so adding a group's before
  // asking the next changes no answer, and a group that does not hold takes back exactly what
  // the groups before it added (the pass adds it again).
  if (memo_groups_valid_ && hinted_changes_after_pass_ == hinted_changes_) {
    size_t holding = 0;
    for (; holding < memo_groups_.size(); ++holding) {
      const MemoGroup& group = memo_groups_[holding];
      const uint64_t waiting = group_waiting(group, blocked_pools);
      if (waiting == kGroupDoesNotHold) break;
      pools_[group.pool].waiting += waiting;
    }
    if (holding == memo_groups_.size()) return;
    for (size_t g = 0; g < holding; ++g) {
      const MemoGroup& group = memo_groups_[g];
      pools_[group.pool].waiting -= group_waiting(group, blocked_pools);
    }
  }
  serve_hints_pass(blocked_pools);
  group_memos();
}

void Scheduler::serve_hints_pass(uint32_t blocked_pools) {
  const size_t capacity = hints_.size();
  const auto slot = [&](size_t i) {  // the ring position of the i-th hint (no division)
    const size_t at = hint_head_ + i;
    return at < capacity ? at : at - capacity;
  };
  size_t kept = 0;
  const uint64_t changes_before = hinted_changes_;
  // No record the ring names has changed since the last pass ended (nor during it): every memo
  // still describes its record.
  const bool records_as_memos_say = hinted_changes_after_pass_ == hinted_changes_;
  for (size_t i = 0; i < hint_count_; ++i) {
    const size_t at = slot(i);
    const Demand hint = hints_[at];
    HintMemo memo = hint_memos_[at];
    const auto keep_as = [&](const HintMemo& kept_memo) {
      const size_t to = slot(kept++);
      if (to != at) hints_[to] = hint;
      if (to != at || !(hint_memos_[to] == kept_memo)) hint_memos_[to] = kept_memo;
    };
    // What the last look found holds while the record is as it was then: the same outcome, with
    // nothing read from the record. (This pass may have changed it already: a hint before this
    // one for the same tensor, or whose room was made by evicting it.)
    const bool unchanged = records_as_memos_say && hinted_changes_ == changes_before;
    if (memo.kind != HintMemo::Kind::kNone &&
        (unchanged || (hint.tensor.index < record_versions_.size() &&
                       record_versions_[hint.tensor.index] == memo.version))) {
      const uint64_t waiting = group_waiting(MemoGroup::of(memo), blocked_pools);
      if (waiting != kGroupDoesNotHold) {
        if (waiting > 0) pools_[memo.pool].waiting += waiting;
        keep_as(memo);
        continue;
      }
    }
    Result<uint32_t> index = registry_.resolve(hint.tensor);
    if (!index) continue;  // unregistered: its count went with its record
    TensorRecord& r = registry_.at(*index);
    const Tier staged = staged_on(r, hint.tier);
    const int pool = r.pool[memory_index(staged)];
    memo = HintMemo{};
    bool keep = false;
    if (pool != kNoPool && (blocked_pools & (1u << pool)) != 0) {
      keep = true;
      // It will want room once the demand has its own, unless it has it or needs none.
      const uint64_t waiting_before = pools_[pool].waiting;
      if (!r.residency.in_flight() && !r.residency.valid_on(staged) && r.uses == 0 &&
          r.residency.state() != Residency::kUnwritten) {
        note_waiting(r, staged);
      }
      memo = HintMemo{HintMemo::Kind::kPoolHeld, Link::kNvmeRead, pool,
                      pools_[pool].waiting - waiting_before, record_versions_[*index]};
    } else {
      const StepResult result = advance(r, hint.tier, 1, /*prefetch=*/true);
      const Step step = result.step;
      // Staging reads (without streaming) leave the hint for its second leg; a full link or
      // pool, for later.
      keep = step == Step::kBlocked || step == Step::kLinkBusy ||
             (step == Step::kIssued && staged != hint.tier);
      if (step == Step::kBlocked) note_waiting(r, staged);
      if (result.refused_link && pool != kNoPool &&
          (step == Step::kLinkBusy || step == Step::kBlocked)) {
        memo = HintMemo{
            step == Step::kLinkBusy ? HintMemo::Kind::kLinkFull : HintMemo::Kind::kRoomWait,
            *result.refused_link, pool, r.charged[memory_index(staged)], record_versions_[*index]};
      }
    }
    if (keep) {
      keep_as(memo);
    } else {
      --r.hints_in_ring;
    }
  }
  hint_count_ = kept;
  if (hinted_changes_ == changes_before) {
    hinted_changes_after_pass_ = hinted_changes_;
  } else {
    hinted_changes_after_pass_.reset();
  }
}

void Scheduler::walk_schedule(uint32_t blocked_pools) {
  if (!schedule_) return;
  // The window: `reach` phases from the cursor's, at most max_accesses accesses in all. The
  // positions run on through the schedule and wrap into the next step: one range, or two.
  const uint32_t phases = schedule_->phase_count();
  const uint32_t reach = std::min(config_.window.max_phases, phases);
  const uint32_t total = schedule_->access_count();
  const uint32_t first = schedule_->access_begin(cursor_);
  const uint32_t past = cursor_ + reach;  // the phase after the window, not wrapped
  const uint32_t spanned = past <= phases ? schedule_->access_begin(past) - first
                                          : total - first + schedule_->access_begin(past - phases);
  const uint32_t length = std::min(spanned, config_.window.max_accesses);
  const uint32_t ranges[2][2] = {{first, std::min(total, first + length)},
                                 {0, first + length > total ? first + length - total : 0}};
  // Only accesses in a lane whose pool is not blocked and whose link has room: any other would
  // be skipped, or make advance() return at once (its link is busy, or nothing is to be done for
  // it), so the walk passes them without looking. Lanes change as the walk goes (an eviction
  // gives its victim's accesses one); next() reads them as they are, as a look at every record
  // would.
  for (const auto& range : ranges) {
    for (uint32_t position = range[0];; ++position) {
      uint64_t lanes = 0;
      for (size_t p = 0; p < pools_.size(); ++p) {
        if ((blocked_pools & (1u << p)) != 0) continue;
        const uint32_t lane = 2 * static_cast<uint32_t>(p);
        if (pools_[p].spec.tier == Tier::kDevice) {
          if (link_free(Link::kHostToDevice)) lanes |= uint64_t{1} << lane;
          if (link_free(Link::kNvmeRead)) lanes |= uint64_t{1} << (lane + 1);  // streamed in
        } else {
          if (link_free(Link::kNvmeRead)) lanes |= uint64_t{1} << lane;
          if (link_free(Link::kDeviceToHost)) lanes |= uint64_t{1} << (lane + 1);
        }
      }
      if (lanes == 0) return;  // nothing more can start before a completion
      position = lanes_.next(position, range[1], lanes);
      if (position == range[1]) break;
      const Access& a = schedule_->access(position);
      // Only a live tensor's access has a lane.
      STRATA_ASSERT(registry_.live(a.tensor.index) &&
                    registry_.at(a.tensor.index).handle == a.tensor);
      TensorRecord& r = registry_.at(a.tensor.index);
      STRATA_ASSERT(!r.done_for_now);  // no lane (lane_of)
      const uint32_t pool = lanes_.lane(position) / 2;
      // Anything needed no later than phase d stays: only tensors needed after it may go.
      const uint32_t d = (lanes_.phase_of(position) + phases - cursor_) % phases;
      const Step step = advance(r, a.tier, uint64_t{d} + 1, /*prefetch=*/true).step;
      if (step == Step::kBlocked) blocked_pools |= 1u << pool;
    }
  }
}

void Scheduler::write_back_requested() {
  while (write_back_head_ < write_back_queue_.size() && link_free(Link::kNvmeWrite)) {
    Result<uint32_t> index = registry_.resolve(write_back_queue_[write_back_head_++]);
    if (!index) continue;  // unregistered since
    TensorRecord& r = registry_.at(*index);
    r.write_back_queued = false;
    // Still as write_behind left it: done with, dirty in pinned memory, nothing in flight. (An
    // acquire since makes it the caller's again; a failed write-back waits to be reported.)
    if (!r.done_for_now || r.uses > 0 || !r.residency.dirty() || r.residency.in_flight() ||
        r.failed() || !r.residency.valid_on(Tier::kPinned) || r.home != Tier::kNvme) {
      continue;
    }
    // With the link free, a refusal is a failure start_cleaning has noted on the tensor.
    (void)start_cleaning(r, Tier::kPinned, kNeverUsed);
  }
  if (write_back_head_ == write_back_queue_.size()) {
    write_back_queue_.clear();
    write_back_head_ = 0;
  }
}

void Scheduler::clean_ahead() {
  write_back_requested();
  if (config_.clean_headroom <= 0) return;
  // A pool's droppable bytes leave out no tensor for being advanced: a pump runs outside any.
  STRATA_ASSERT(advancing_ == UINT32_MAX);
  for (PoolState& pool : pools_) {
    const Tier tier = pool.spec.tier;
    const Link link = cleaning_link_of(tier);
    // Bounded by the link's in-flight limit: each round starts one cleaning or stops.
    while (link_free(link)) {
      // Free room, droppable bytes (kept by note_state) and cleanings in flight leave the
      // headroom on almost every pump: then there is nothing to scan for. (Checked every round:
      // a cleaning started grows pool.cleaning.)
      if (!wants_cleaning(pool.spec.budget_bytes, pool.used, pool.droppable, pool.cleaning,
                          config_.clean_headroom, pool.waiting)) {
        break;
      }
      // The dirty candidates are the pool's dirty victim set, best first (no tensor is being
      // advanced during a pump, so every entry is evictable): the first is the one to clean,
      // unless the current phase still reads it (one it was told is done with for now counts
      // from the next phase), and then so does every other: the set is in rank order, a rank
      // is the cursor clock plus the next use, and none is below the clock (move_cursor). Data
      // the current phase still reads stays put; it is likely about to be modified. (Looking
      // past the first for one the phase does not read walked the whole set on every pump
      // once the optimizer's step was one phase: a 70B plan took 4 s instead of 0.6.)
      if (pool.victims[1].empty()) break;
      const VictimKey& first = *pool.victims[1].begin();
      if (schedule_ && first.rank == cursor_clock_) break;
      TensorRecord& victim = registry_.at(first.tensor);
      STRATA_ASSERT(!schedule_ || next_use(victim, tier) > 0);
      // Cleaning device data needs pinned room: only free room or never-used buffers.
      if (!start_cleaning(victim, tier, kNeverUsed)) break;
    }
  }
}

void Scheduler::note_waiting(const TensorRecord& r, Tier tier) {
  const int mi = memory_index(tier);
  if (r.pool[mi] == kNoPool) return;
  pools_[r.pool[mi]].waiting += r.charged[mi];
}

void Scheduler::flush_step() {
  for (uint32_t i = 0; i < registry_.slot_count(); ++i) {
    if (!registry_.live(i)) continue;
    TensorRecord& r = registry_.at(i);
    // A tensor at home on the device or in pinned memory (strata_malloc without OFFLOADABLE)
    // lives there and has no NVMe copy to bring up to date; writing it back anyway could need
    // more pinned memory than the budget has, and the flush waited for it forever (found by
    // tests/fuzz/c_api_fuzz).
    if (r.home != Tier::kNvme) continue;
    if (!r.residency.dirty() || r.uses > 0 || r.failed() || r.residency.in_flight()) continue;
    if (r.residency.valid_on(Tier::kPinned)) {
      if (!link_free(Link::kNvmeWrite)) continue;
      start_cleaning(r, Tier::kPinned, 0);
    } else if (streams()) {
      if (!link_free(Link::kNvmeWrite)) continue;
      start_cleaning(r, Tier::kDevice, 0);
    } else {
      if (!link_free(Link::kDeviceToHost)) continue;
      // Device data goes back through pinned memory. When what never leaves the pinned pool
      // (pinned allocations, tensors at home there) leaves too little room for this tensor, the
      // flush would wait for it forever (found by tests/fuzz/c_api_fuzz): it fails instead, and
      // the data stays on the device.
      // (A pool held by a tensor whose own failure is unreported is not this tensor's failure:
      // that report ends the flush first.)
      Status impossible;
      if (!start_cleaning(r, Tier::kDevice, 0, &impossible) &&
          impossible.code() == STRATA_E_PINNED_BUDGET) {
        note_async_failure(r, std::move(impossible).with_context("writing back " + label(r)),
                           /*durability=*/true);
      }
    }
  }
}

std::string Scheduler::describe_wait(const TensorRecord& r, Tier tier) const {
  std::string out = label(r) + " on " + to_string(tier) + ": state " +
                    to_string(r.residency.state()) + describe_copies(r.residency.valid());
  const int pool = r.pool[memory_index(tier)];
  if (pool != kNoPool) {
    const PoolState& p = pools_[pool];
    out += ", pool '" + p.spec.name + "' holds " + format_bytes(p.used) + " of " +
           format_bytes(p.spec.budget_bytes) + " (" + format_bytes(p.cleaning) +
           " being written out)";
  }
  out += ", transfers in flight:";
  for (int i = 0; i < kLinkCount; ++i) {
    out += std::string(" ") + to_string(static_cast<Link>(i)) + "=" + std::to_string(inflight_[i]);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Self-check

Status Scheduler::check_invariants() const {
  std::lock_guard lock(mu_);
  return check_invariants_locked();
}

Status Scheduler::check_invariants_locked() const {
  const auto broken = [](const std::string& what) {
    return Status::error(STRATA_E_INTERNAL, "scheduler bookkeeping: " + what);
  };
  // Recounted from the records, compared with the running totals below.
  std::vector<uint64_t> pool_used(pools_.size(), 0);
  std::vector<size_t> pool_resident(pools_.size(), 0);
  std::vector<uint64_t> pool_droppable(pools_.size(), 0);
  std::vector<size_t> pool_victims(pools_.size(), 0);
  std::array<std::array<uint64_t, kTensorKindCount>, kMemoryTierCount> kind_bytes{};
  std::array<uint64_t, kTensorKindCount> nvme_kind_bytes{};
  // Each record write_behind(kNow) has queued has one entry in the queue's unserved part (a
  // record is queued again only once its entry has been served).
  size_t queued_entries = 0, queued_records = 0;
  for (size_t q = write_back_head_; q < write_back_queue_.size(); ++q) {
    Result<uint32_t> index = registry_.resolve(write_back_queue_[q]);
    if (index && registry_.at(*index).write_back_queued) ++queued_entries;
  }
  for (uint32_t i = 0; i < registry_.slot_count(); ++i) {
    if (!registry_.live(i)) continue;
    const TensorRecord& r = registry_.at(i);
    const ResidencyState& res = r.residency;
    if (r.write_back_queued) ++queued_records;
    if (r.extent.valid()) nvme_kind_bytes[static_cast<size_t>(r.spec.kind)] += r.extent.bytes;
    if (res.valid_on(Tier::kNvme) && !r.extent.valid()) {
      return broken(label(r) + " has a valid NVMe copy but no extent");
    }
    if (!is_consistent(res.state(), res.valid())) {
      return broken(label(r) + " is " + to_string(res.state()) + " with copies " +
                    describe_copies(res.valid()));
    }
    // A transfer in flight is exactly the op the record names.
    if (res.in_flight() != (r.op != kNoOp)) {
      return broken(label(r) + " is " + to_string(res.state()) +
                    (r.op == kNoOp ? " without a transfer" : " with a transfer it is not in"));
    }
    if (r.op != kNoOp && (r.op >= ops_.size() || !ops_[r.op].active || ops_[r.op].tensor != i)) {
      return broken(label(r) + " names transfer " + std::to_string(r.op) + ", which is not its");
    }
    if (r.uses > 0 && !res.valid_on(r.use_tier)) {
      return broken(label(r) + " is in use on " + to_string(r.use_tier) + " without a copy there");
    }
    for (Tier tier : kMemoryTiers) {
      const int mi = memory_index(tier);
      const bool has_buffer = r.buffer[mi].valid();
      if (schedule_ && r.next_use_epoch[mi] == cursor_epoch_ &&
          r.next_use_filter[mi] == static_cast<uint8_t>(use_filter(r, tier)) &&
          r.next_use_memo[mi] != schedule_next_use(r, tier)) {
        return broken(label(r) + " remembers its next use on " + to_string(tier) + " as " +
                      std::to_string(r.next_use_memo[mi]) + " phases; the schedule says " +
                      std::to_string(schedule_next_use(r, tier)));
      }
      if (r.counted_droppable[mi] != droppable(r, tier)) {
        return broken(label(r) +
                      (r.counted_droppable[mi] ? " is counted as droppable from "
                                               : " is droppable but not counted on ") +
                      to_string(tier));
      }
      const bool candidate = r.pool[mi] != kNoPool && evictable_unless_advancing(r, tier);
      if (r.victim_listed[mi] != candidate) {
        return broken(label(r) +
                      (candidate ? " is an eviction candidate not listed on "
                                 : " is listed as an eviction candidate on ") +
                      to_string(tier));
      }
      if (candidate) {
        const VictimKey key{victim_rank(r, tier), r.charged[mi], i};
        if (!(r.victim_key[mi] == key) || r.victim_dirty[mi] != needs_cleaning(r, tier)) {
          return broken(label(r) + " is listed on " + to_string(tier) + " with rank " +
                        std::to_string(r.victim_key[mi].rank) + "; its rank is " +
                        std::to_string(key.rank));
        }
        const VictimSet& set = pools_[r.pool[mi]].victims[r.victim_dirty[mi] ? 1 : 0];
        if (set.find(key) != r.victim_at[mi]) {
          return broken(label(r) + " is listed on " + to_string(tier) +
                        " with a node that is not its key's");
        }
        ++pool_victims[r.pool[mi]];
      }
      if (r.counted_droppable[mi] && !has_buffer) {
        return broken(label(r) + " is counted as droppable without a " + to_string(tier) +
                      " buffer");
      }
      if (res.valid_on(tier) && !has_buffer) {
        return broken(label(r) + " has a valid " + to_string(tier) + " copy but no buffer");
      }
      if (!has_buffer) {
        if (r.resident_pos[mi] != kNotResident) {
          return broken(label(r) + " sits in a " + to_string(tier) + " pool without a buffer");
        }
        continue;
      }
      const int pool = r.pool[mi];
      if (pool == kNoPool)
        return broken(label(r) + " has a " + to_string(tier) + " buffer and no pool");
      const PoolState& p = pools_[pool];
      if (r.resident_pos[mi] >= p.resident.size() || p.resident[r.resident_pos[mi]] != i) {
        return broken(label(r) + " is not where its position says in pool '" + p.spec.name + "'");
      }
      pool_used[pool] += r.charged[mi];
      if (r.counted_droppable[mi]) pool_droppable[pool] += r.charged[mi];
      ++pool_resident[pool];
      kind_bytes[mi][static_cast<int>(r.spec.kind)] += r.charged[mi];
    }
  }

  // Each record's count of hints naming it, recounted from the ring.
  {
    std::vector<uint32_t> named(registry_.slot_count(), 0);
    for (size_t i = 0; i < hint_count_; ++i) {
      Result<uint32_t> index = registry_.resolve(hints_[(hint_head_ + i) % hints_.size()].tensor);
      if (index) ++named[*index];
    }
    for (uint32_t i = 0; i < registry_.slot_count(); ++i) {
      if (registry_.live(i) && registry_.at(i).hints_in_ring != named[i]) {
        return broken(label(registry_.at(i)) + " counts " +
                      std::to_string(registry_.at(i).hints_in_ring) + " hints; the ring has " +
                      std::to_string(named[i]));
      }
    }
  }
  // The memo groups, while valid, are what grouping the ring's memos gives.
  if (memo_groups_valid_ && hinted_changes_after_pass_ == hinted_changes_) {
    std::vector<MemoGroup> groups;
    if (!group_memos_into(groups) || groups != memo_groups_) {
      return broken("the prefetch hints' memo groups are not those of the ring's memos");
    }
  }

  // Every access's lane, recomputed from its tensor's record.
  if (schedule_) {
    if (lanes_.size() != schedule_->access_count()) {
      return broken("the lanes index " + std::to_string(lanes_.size()) +
                    " accesses; the schedule has " + std::to_string(schedule_->access_count()));
    }
    const auto name = [](uint32_t lane) {
      return lane == AccessLanes::kNoLane ? std::string("none") : std::to_string(lane);
    };
    for (uint32_t p = 0; p < lanes_.size(); ++p) {
      const Access& a = schedule_->access(p);
      const bool live =
          registry_.live(a.tensor.index) && registry_.at(a.tensor.index).handle == a.tensor;
      const uint32_t expected =
          live ? lane_of(registry_.at(a.tensor.index), a) : AccessLanes::kNoLane;
      if (lanes_.lane(p) != expected) {
        return broken("scheduled access " + std::to_string(p) +
                      (live ? " of " + label(registry_.at(a.tensor.index))
                            : std::string(" of a stale handle")) +
                      " is in lane " + name(lanes_.lane(p)) + "; its tensor's state says " +
                      name(expected));
      }
    }
    if (!lanes_.bitsets_match_lanes()) {
      return broken("the lanes index's bitsets (or their summary) disagree with its lanes");
    }
  }

  std::array<uint64_t, kMemoryTierCount> tier_bytes{};
  std::vector<uint64_t> pool_cleaning(pools_.size(), 0);
  for (size_t p = 0; p < pools_.size(); ++p) {
    const PoolState& pool = pools_[p];
    if (pool.used != pool_used[p] || pool.resident.size() != pool_resident[p]) {
      return broken("pool '" + pool.spec.name + "' counts " + std::to_string(pool.used) +
                    " bytes in " + std::to_string(pool.resident.size()) +
                    " buffers; its tensors hold " + std::to_string(pool_used[p]) + " in " +
                    std::to_string(pool_resident[p]));
    }
    if (pool.victims[0].size() + pool.victims[1].size() != pool_victims[p]) {
      return broken("pool '" + pool.spec.name + "' lists " +
                    std::to_string(pool.victims[0].size() + pool.victims[1].size()) +
                    " eviction candidates; its tensors make " + std::to_string(pool_victims[p]));
    }
    if (pool.droppable != pool_droppable[p]) {
      return broken("pool '" + pool.spec.name + "' counts " + std::to_string(pool.droppable) +
                    " droppable bytes; its tensors hold " + std::to_string(pool_droppable[p]));
    }
    if (pool.used > pool.spec.budget_bytes) {
      return broken("pool '" + pool.spec.name + "' uses " + std::to_string(pool.used) +
                    " bytes, above its budget of " + std::to_string(pool.spec.budget_bytes));
    }
    tier_bytes[memory_index(pool.spec.tier)] += pool.used;
  }
  // The staging buffers of streamed transfers, in use from start to end (kind other).
  tier_bytes[memory_index(Tier::kPinned)] += config_.memory.stream_staging_bytes;
  kind_bytes[memory_index(Tier::kPinned)][static_cast<int>(TensorKind::kOther)] +=
      config_.memory.stream_staging_bytes;
  for (Tier tier : kMemoryTiers) {
    const int mi = memory_index(tier);
    const TierUsage& usage = stats_.tiers[mi];
    if (usage.in_use_bytes != tier_bytes[mi]) {
      return broken(std::string(to_string(tier)) + " counts " + std::to_string(usage.in_use_bytes) +
                    " bytes in use; its pools hold " + std::to_string(tier_bytes[mi]));
    }
    for (int k = 0; k < kTensorKindCount; ++k) {
      if (usage.kind_in_use_bytes[k] != kind_bytes[mi][k]) {
        return broken(std::string(to_string(tier)) + " counts " +
                      std::to_string(usage.kind_in_use_bytes[k]) + " bytes of kind " +
                      to_string(static_cast<TensorKind>(k)) + "; its tensors hold " +
                      std::to_string(kind_bytes[mi][k]));
      }
    }
  }

  uint64_t nvme_bytes = 0;
  for (int k = 0; k < kTensorKindCount; ++k) {
    nvme_bytes += nvme_kind_bytes[k];
    if (stats_.nvme.kind_in_use_bytes[k] != nvme_kind_bytes[k]) {
      return broken("nvme counts " + std::to_string(stats_.nvme.kind_in_use_bytes[k]) +
                    " bytes of kind " + to_string(static_cast<TensorKind>(k)) +
                    "; its tensors' extents hold " + std::to_string(nvme_kind_bytes[k]));
    }
  }
  if (stats_.nvme.in_use_bytes != nvme_bytes || stats_.nvme.footprint_bytes != nvme_bytes) {
    return broken("nvme counts " + std::to_string(stats_.nvme.in_use_bytes) + " bytes in use (" +
                  std::to_string(stats_.nvme.footprint_bytes) + " held); its extents hold " +
                  std::to_string(nvme_bytes));
  }

  std::array<uint32_t, kLinkCount> inflight{};
  uint32_t active = 0, cleaning = 0;
  std::vector<uint32_t> range_refs(registry_.slot_count(), 0);
  for (const Op& op : ops_) {
    if (!op.active) continue;
    ++active;
    ++inflight[static_cast<int>(op.link)];
    if (!registry_.live(op.tensor)) return broken("a transfer in flight for a removed tensor");
    if (op.link != link_of(op.kind)) return broken("a transfer in flight on the wrong link");
    const bool range = op.kind == OpKind::kRangeToDevice || op.kind == OpKind::kRangeToHost;
    if (range != (op.range != kNoRange)) return broken("a range copy without its slot, or back");
    if (range) {
      ++range_refs[op.source];
      ++range_refs[op.tensor];
      const RangeCopy& copy = range_copies_[op.range];
      if (copy.ticket == 0 || copy.done) return broken("a range copy in flight in a free slot");
      if (registry_.at(op.tensor).uses == 0) return broken("a range copy into a tensor not held");
    }
    if ((op.kind == OpKind::kStreamToDevice || op.kind == OpKind::kStreamToNvme) && !streams()) {
      return broken("a streamed transfer under a plan without streaming");
    }
    if (op.cleaning) {
      ++cleaning;
      const TensorRecord& r = registry_.at(op.tensor);
      const Tier source = op.kind == OpKind::kWriteBack ? Tier::kPinned : Tier::kDevice;
      pool_cleaning[r.pool[memory_index(source)]] += r.charged[memory_index(source)];
    }
  }
  if (active != inflight_total_ || active + free_ops_.size() != ops_.size()) {
    return broken(std::to_string(active) + " transfers in flight, counted " +
                  std::to_string(inflight_total_) + ", with " + std::to_string(free_ops_.size()) +
                  " free of " + std::to_string(ops_.size()));
  }
  for (int link = 0; link < kLinkCount; ++link) {
    if (inflight[link] != inflight_[link]) {
      return broken(std::string(to_string(static_cast<Link>(link))) + " has " +
                    std::to_string(inflight[link]) + " transfers in flight, counted " +
                    std::to_string(inflight_[link]));
    }
  }
  for (uint32_t i = 0; i < registry_.slot_count(); ++i) {
    if (registry_.live(i) && registry_.at(i).range_copies != range_refs[i]) {
      return broken(label(registry_.at(i)) + " counts " +
                    std::to_string(registry_.at(i).range_copies) + " range copies; " +
                    std::to_string(range_refs[i]) + " are in flight");
    }
  }
  if (cleaning != cleaning_inflight_) {
    return broken(std::to_string(cleaning) + " cleanings in flight, counted " +
                  std::to_string(cleaning_inflight_));
  }
  for (size_t p = 0; p < pools_.size(); ++p) {
    if (pools_[p].cleaning != pool_cleaning[p]) {
      return broken("pool '" + pools_[p].spec.name + "' counts " +
                    std::to_string(pools_[p].cleaning) + " bytes being cleaned; its transfers " +
                    "clean " + std::to_string(pool_cleaning[p]));
    }
  }
  if (queued_records != queued_entries) {
    return broken(std::to_string(queued_records) + " tensors are queued for write-back, the " +
                  "queue names " + std::to_string(queued_entries));
  }
  return Status::ok();
}

}  // namespace strata::sched
