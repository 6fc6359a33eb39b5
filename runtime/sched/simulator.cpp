#include "sched/simulator.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include "common/assert.h"
#include "common/units.h"
#include "sched/simulated_backend.h"
#include "sched/transfer_label.h"

namespace strata::sched {

namespace {

// Owns the scheduler and, before it goes, lets every transfer in flight complete (the
// scheduler's destructor waits for them, and only the simulator's loop can deliver them).
class SimulatedRun {
 public:
  explicit SimulatedRun(const DeviceModel& model) : backend_(model) {}
  ~SimulatedRun() {
    if (!scheduler_) return;
    scheduler_->set_prefetch_enabled(false);
    while (backend_.deliver_next()) {
    }
    scheduler_.reset();
  }
  SimulatedBackend& backend() { return backend_; }
  std::unique_ptr<Scheduler>& scheduler() { return scheduler_; }

 private:
  SimulatedBackend backend_;  // declared first: outlives the scheduler
  std::unique_ptr<Scheduler> scheduler_;
};

uint64_t total_transfers(const SimulatedBackend& backend) {
  uint64_t n = 0;
  for (int i = 0; i < kLinkCount; ++i) n += backend.link_counters(static_cast<Link>(i)).transfers;
  return n;
}

// The step with its forward and backward phases repeated once per micro-batch before the
// optimizer phases. Backward overwrites a gradient in the first micro-batch and accumulates into
// it (reads, then writes) in the others; a gradient is measured once it is final, in the last.
TrainingStep with_micro_batches(TrainingStep step, uint32_t micro_batches) {
  if (micro_batches <= 1) return step;
  std::vector<StepPhase> passes, optimizer;
  for (StepPhase& phase : step.phases) {
    (phase.compute == ComputeKind::kOptimizer ? optimizer : passes).push_back(std::move(phase));
  }
  step.phases.clear();
  step.phases.reserve(passes.size() * micro_batches + optimizer.size());
  for (uint32_t m = 0; m < micro_batches; ++m) {
    for (const StepPhase& phase : passes) {
      if (phase.compute == ComputeKind::kGradientScan && m + 1 < micro_batches) continue;
      step.phases.push_back(phase);
      if (m == 0 || phase.compute != ComputeKind::kBackward) continue;
      for (StepAccess& a : step.phases.back().accesses) {
        if (a.access.mode == AccessMode::kOverwrite && a.release_dirty) {
          a.access.mode = AccessMode::kRead;
        }
      }
    }
  }
  for (StepPhase& phase : optimizer) step.phases.push_back(std::move(phase));
  return step;
}

// Completions of the copies the modelled framework makes itself (offloaded activations), one
// at a time: it waits for each, as a blocking copy_ does.
class FrameworkCopy final : public CompletionSink {
 public:
  explicit FrameworkCopy(boost::asio::io_context& io) : io_(io) {}
  Completion start() {
    done_ = false;
    status_ = Status::ok();
    return Completion{this, 0};
  }
  bool done() const { return done_; }
  const Status& status() const { return status_; }
  void on_transfer_complete(uint32_t /*op*/, Status status) override {
    done_ = true;
    status_ = std::move(status);
  }
  boost::asio::any_io_executor completion_executor() const override { return io_.get_executor(); }

 private:
  boost::asio::io_context& io_;
  bool done_ = true;
  Status status_;
};

// Per phase: the chunk backward unpacks after the phase's last one, within the same backward pass
// (activations.py hints only tensors still packed); invalid when none.
std::vector<TensorHandle> next_unpacks(const TrainingStep& step) {
  std::vector<TensorHandle> next(step.phases.size());
  TensorHandle following;
  for (size_t i = step.phases.size(); i-- > 0;) {
    const StepPhase& phase = step.phases[i];
    if (!phase.packs.empty()) following = TensorHandle{};  // a forward pass: another pass's
    next[i] = following;
    if (!phase.unpacks.empty()) following = phase.unpacks.front();
  }
  return next;
}

std::string phase_label(const PhaseKey& key) {
  return std::string(to_string(key.kind)) + " " + std::to_string(key.layer);
}

}  // namespace

const char* bottleneck_name(Resource resource) {
  switch (resource) {
    case Resource::kNvmeRead:
      return "nvme_read";
    case Resource::kNvmeWrite:
      return "nvme_write";
    case Resource::kHostToDevice:
    case Resource::kDeviceToHost:
      return "pcie";
    case Resource::kCompute:
      return "compute";
    case Resource::kCpuOptimizer:
      return "cpu_optimizer";
  }
  return "?";
}

Result<SimulationResult> simulate(const std::vector<TensorSpec>& inventory,
                                  const SimulationConfig& config) {
  STRATA_TRY(config.device.validate());
  if (config.measured_steps == 0) return invalid_argument("simulate: measured_steps must be >= 1");
  if (config.micro_batches == 0) return invalid_argument("simulate: micro_batches must be >= 1");
  if (inventory.empty()) return invalid_argument("simulate: empty inventory");

  SimulatedRun run(config.device);
  SimulatedBackend& backend = run.backend();
  backend.set_trace(config.trace);
  const auto us = &SimulatedBackend::trace_us;
  SchedulerConfig sc;
  sc.memory = config.memory;
  sc.max_inflight = config.max_inflight;
  sc.window = config.window;
  sc.clean_headroom = config.clean_headroom;
  sc.record_first_step = false;
  sc.check_invariants = config.check_invariants;
  sc.max_tensors =
      static_cast<uint32_t>(std::min<size_t>(inventory.size(), size_t{kMaxHandleIndex} + 1));
  STRATA_ASSIGN_OR_RETURN(run.scheduler(),
                          Scheduler::create(sc, backend, backend.context().get_executor()),
                          "simulate");
  Scheduler& scheduler = *run.scheduler();

  // Steady state: every tensor with contents already has them on NVMe; gradients have none
  // until backward produces them.
  std::vector<TensorHandle> handles;
  handles.reserve(inventory.size());
  for (const TensorSpec& spec : inventory) {
    RegisterOptions options;
    // The sub-grouped optimizer's pieces live in pinned memory for the whole run.
    const bool piece = spec.kind == TensorKind::kOther && spec.name.rfind("optimizer#", 0) == 0;
    const bool pinned_home = piece || (config.memory.pinned_home_kinds & kind_bit(spec.kind)) != 0;
    const bool device_home = (config.memory.device_home_kinds & kind_bit(spec.kind)) != 0;
    options.home = pinned_home ? Tier::kPinned : device_home ? Tier::kDevice : Tier::kNvme;
    options.contents_on_nvme = spec.kind != TensorKind::kGradient &&
                               spec.kind != TensorKind::kActivationCheckpoint && !pinned_home &&
                               !device_home;
    STRATA_ASSIGN_OR_RETURN(TensorHandle handle, scheduler.register_tensor(spec, options),
                            "simulate");
    handles.push_back(handle);
    if (device_home) {
      // Written where it rests, as the framework writes it at registration: no transfer.
      STRATA_ASSIGN_OR_RETURN(AcquireAttempt written,
                              scheduler.try_acquire(handle, Tier::kDevice, AccessMode::kOverwrite),
                              "simulate, placing '" + spec.name + "' on the device");
      if (written.state != AcquireState::kReady) {
        return Status::error(STRATA_E_DEVICE_BUDGET,
                             "simulate: '" + spec.name + "' rests on the device, whose pool has " +
                                 "no room for it beside the tensors placed there before it");
      }
      STRATA_TRY(scheduler.release(handle, /*dirty=*/true, nullptr), "simulate");
    }
  }
  STRATA_ASSIGN_OR_RETURN(TrainingStep planned,
                          plan_training_step(inventory, handles, config.step));
  const TrainingStep step = with_micro_batches(std::move(planned), config.micro_batches);
  STRATA_ASSIGN_OR_RETURN(AccessSchedule schedule, schedule_of(step));
  STRATA_TRY(scheduler.declare_schedule(std::move(schedule)));

  const MemoryPlan& plan = config.memory;
  const DeviceModel& model = config.device;

  // The sub-grouped optimizer's loader (TieredOptimizer::run_units): while one sub-group is
  // updated, it holds the states of the next ones, up to optimizer_lookahead's window, having
  // hinted all of them first, and acquires them in order, one at a time. Without it the
  // simulated step read each sub-group only when its turn came, and kept in the pinned pool
  // what the runtime's read-ahead gives up (docs/planner.md). Played here as the runtime
  // plays it: the loader's acquires are demands like its blocking ones, advanced whenever the
  // simulated clock moves; an acquire group takes the states the loader holds for it.
  const int state_pool = find_pool(plan, Tier::kPinned, TensorKind::kAdamM);
  const uint64_t state_pool_bytes =
      state_pool >= 0 ? plan.pools[static_cast<size_t>(state_pool)].budget_bytes : 0;
  const auto is_state = [](const StepAccess& a) { return a.done_after; };
  // The optimizer's write-through, decided as TieredOptimizer::writes_through decides it: from
  // all the states' bytes, the pool they stream through, the most an update holds there and the
  // largest sub-group.
  uint64_t state_bytes = 0, largest_held = 0;
  for (const StepPhase& phase : step.phases) {
    if (std::none_of(phase.accesses.begin(), phase.accesses.end(), is_state)) continue;
    largest_held = std::max(largest_held, phase.held_pinned_bytes);
    for (const StepAccess& a : phase.accesses) {
      if (!is_state(a)) continue;
      STRATA_ASSIGN_OR_RETURN(TensorInfo info, scheduler.describe(a.access.tensor));
      state_bytes += info.bytes;
    }
  }
  const Scheduler::WriteBack state_write_back =
      optimizer_writes_through(state_bytes, state_pool_bytes, largest_held,
                               step.optimizer_unit_bytes)
          ? Scheduler::WriteBack::kNow
          : Scheduler::WriteBack::kWhenRoomIsNeeded;
  // Per acquire group of a loader run: the run's end (one past its last group), else 0.
  std::vector<size_t> run_end(step.phases.size(), 0);
  if (step.optimizer_unit_bytes > 0) {
    for (size_t x = step.phases.size(); x-- > 0;) {
      const StepPhase& phase = step.phases[x];
      if (std::none_of(phase.accesses.begin(), phase.accesses.end(), is_state)) continue;
      const bool continued =
          x + 1 < step.phases.size() && step.phases[x + 1].continues_phase && run_end[x + 1] != 0;
      run_end[x] = continued ? run_end[x + 1] : x + 1;
    }
  }
  struct Loader {
    size_t next = 0;    // the group whose states it acquires
    size_t state = 0;   // of them, the next
    size_t hinted = 0;  // groups hinted: [.., hinted)
    size_t end = 0;     // the run's end
  } loader;
  std::vector<size_t> held_ahead(step.phases.size(), 0);  // states the loader holds, per group

  // Hints and acquires what the window allows while group `current` is the one updated.
  const auto advance_loader = [&](size_t current) -> Status {
    if (loader.end == 0) return Status::ok();
    const uint32_t window = optimizer_lookahead(
        state_pool_bytes, step.phases[current].held_pinned_bytes, step.optimizer_unit_bytes);
    const size_t allowed = std::min(loader.end, current + 1 + window);
    for (loader.hinted = std::max(loader.hinted, loader.next); loader.hinted < allowed;
         ++loader.hinted) {
      for (const StepAccess& a : step.phases[loader.hinted].accesses) {
        if (is_state(a)) STRATA_TRY(scheduler.prefetch(a.access.tensor, a.access.tier));
      }
    }
    while (loader.next < allowed) {
      const StepPhase& group = step.phases[loader.next];
      size_t seen = 0;
      for (const StepAccess& a : group.accesses) {
        if (!is_state(a) || seen++ < loader.state) continue;
        Result<AcquireAttempt> attempt =
            scheduler.try_acquire(a.access.tensor, a.access.tier, a.access.mode);
        if (!attempt) {
          return std::move(attempt).take_status().with_context("simulate, optimizer read-ahead");
        }
        if (attempt->state != AcquireState::kReady) return Status::ok();
        ++loader.state;
        ++held_ahead[loader.next];
      }
      ++loader.next;
      loader.state = 0;
    }
    return Status::ok();
  };
  // A wait delivers the next completion; a configuration whose step never settles stops here.
  const auto within_transfer_limit = [&]() -> Status {
    if (total_transfers(backend) <= config.max_transfers) return Status::ok();
    return Status::error(STRATA_E_LIMIT, "simulate: more than " +
                                             std::to_string(config.max_transfers) + " transfers");
  };
  // Acquires `access` for the phase `key`, the virtual clock advancing to each completion while
  // it is pending and `between` run after each (the optimizer's loader keeps taking its states).
  const auto acquire = [&](const Access& access, const PhaseKey& key,
                           const auto& between) -> Status {
    for (;;) {
      Result<AcquireAttempt> attempt =
          scheduler.try_acquire(access.tensor, access.tier, access.mode);
      if (!attempt) {
        return std::move(attempt).take_status().with_context("simulate, phase " + phase_label(key));
      }
      if (attempt->state == AcquireState::kReady) return Status::ok();
      STRATA_TRY(within_transfer_limit());
      if (!backend.deliver_next()) {
        // Nothing in flight and still not resident: the tensors the phase holds leave no room
        // for this one. The configuration cannot run this step.
        Result<TensorInfo> info = scheduler.describe(access.tensor);
        const int code =
            access.tier == Tier::kDevice ? STRATA_E_DEVICE_BUDGET : STRATA_E_PINNED_BUDGET;
        return Status::error(code, "simulate: phase " + phase_label(key) + " cannot fit tensor '" +
                                       (info ? info->name : std::string("?")) + "' on " +
                                       to_string(access.tier) +
                                       " beside the tensors it already holds");
      }
      STRATA_TRY(between());
    }
  };
  // Offloaded activations (StepPhase::packs / unpacks): one chunk at a time, acquired on pinned,
  // copied over the link with the compute stream waiting, released. Waiting for the chunk (its
  // read back, or room for it) is a stall like any acquire's; the copy is activation time.
  FrameworkCopy framework_copy(backend.context());
  const std::vector<TensorHandle> next_unpack = next_unpacks(step);
  double stall = 0, activation_seconds = 0;
  bool measuring = false;
  const auto move_saved = [&](const StepPhase& phase, TensorHandle chunk, bool pack) -> Status {
    const std::string where = "simulate, phase " + phase_label(phase.key);
    const double asked = backend.now();
    const Access access{chunk, Tier::kPinned, pack ? AccessMode::kOverwrite : AccessMode::kRead};
    STRATA_TRY(acquire(access, phase.key, [] { return Status::ok(); }));
    STRATA_ASSIGN_OR_RETURN(TensorInfo info, scheduler.describe(chunk), where);
    const double acquired = backend.now();
    if (config.trace != nullptr && acquired > asked) {
      config.trace->record_span(telemetry::kTrackWait, info.name, us(asked), us(acquired));
    }
    const Buffer device{nullptr, info.bytes, 0};
    const Buffer pinned{nullptr, info.bytes, 0};
    const Completion done = framework_copy.start();
    {
      // A trace names the copy by its chunk (the framework's copy: a run's trace has no span).
      const TensorSpec spec{info.name, {info.bytes}, info.dtype, info.kind, info.layer};
      const ScopedTransferLabel label(spec);
      STRATA_TRY(pack ? backend.copy_to_host(device, pinned, info.bytes, done)
                      : backend.copy_to_device(pinned, device, info.bytes, done),
                 where);
    }
    while (!framework_copy.done()) {
      const bool delivered = backend.deliver_next();
      STRATA_ASSERT(delivered);  // the copy is in flight: its completion is due
    }
    STRATA_TRY(framework_copy.status(), where);
    if (measuring) {
      stall += acquired - asked;
      activation_seconds += backend.now() - acquired;
    }
    return scheduler.release(chunk, pack).with_context(where);
  };
  std::array<double, kResourceCount> busy{};
  std::array<LinkCounters, kLinkCount> links_before{};
  SchedulerStats stats_before;
  double measure_start = 0;
  uint64_t check_host_peak = 0;
  const uint32_t total_steps = config.warmup_steps + config.measured_steps;

  // The steps themselves on a track of their own, as `strata bench finetune --trace` has them.
  std::optional<telemetry::TrackId> step_track;
  if (config.trace != nullptr) {
    Result<telemetry::TrackId> track = config.trace->register_track("step");
    if (track) step_track = *track;
  }
  for (uint32_t s = 0; s < total_steps; ++s) {
    measuring = s >= config.warmup_steps;
    const double step_start = backend.now();
    if (s == config.warmup_steps) {
      for (int i = 0; i < kLinkCount; ++i)
        links_before[i] = backend.link_counters(static_cast<Link>(i));
      stats_before = scheduler.stats();
      scheduler.reset_peaks();
      measure_start = backend.now();
    }
    STRATA_TRY(scheduler.begin_step());
    bool checked_overflow = false;
    PhaseKey open_phase;  // the scheduler phase the current acquire group runs in
    for (const StepPhase& phase : step.phases) {
      if (!checked_overflow && phase.compute == ComputeKind::kOptimizer &&
          plan.overflow_check_passes > 0) {
        // The loss scaler's host-side isinf / isnan passes over all gradients, each with a
        // temporary of overflow_check_temp_bytes, before the optimizer may run.
        checked_overflow = true;
        const double seconds = plan.overflow_check_passes *
                               static_cast<double>(step.gradient_elements) /
                               model.host_overflow_check_elements_per_s;
        if (measuring) {
          busy[static_cast<int>(Resource::kCpuOptimizer)] += seconds;
          check_host_peak =
              std::max(check_host_peak, scheduler.tier_usage(Tier::kPinned).footprint_bytes +
                                            plan.overflow_check_temp_bytes);
        }
        backend.run_until(backend.now() + seconds);
      }

      const double phase_start = backend.now();
      // An acquire group that continues a phase (the sub-grouped optimizer's) runs inside the
      // one its first group began, which the last group of the run ends.
      if (!phase.continues_phase) {
        open_phase = phase.key;
        STRATA_TRY(scheduler.begin_phase(open_phase));
      }
      const size_t index = static_cast<size_t>(&phase - step.phases.data());
      const bool loaded = run_end[index] != 0;  // its states come from the loader
      // A run's first group (or a group of another run) starts the loader afresh.
      if (loaded && (!phase.continues_phase || loader.end != run_end[index])) {
        loader = Loader{index, 0, index, run_end[index]};
      }
      const auto poll = [&]() -> Status { return loaded ? advance_loader(index) : Status::ok(); };
      STRATA_TRY(poll());
      for (const StepAccess& a : phase.accesses) {
        if (loaded && is_state(a)) continue;
        STRATA_TRY(acquire(a.access, phase.key, poll));
      }
      // The update waits for the loader to hold this group's states.
      const auto states_here = static_cast<size_t>(
          std::count_if(phase.accesses.begin(), phase.accesses.end(), is_state));
      while (loaded && held_ahead[index] < states_here) {
        STRATA_TRY(within_transfer_limit());
        if (!backend.deliver_next()) {
          return Status::error(STRATA_E_PINNED_BUDGET,
                               "simulate: phase " + phase_label(phase.key) +
                                   " cannot fit its optimizer states beside the tensors held");
        }
        STRATA_TRY(poll());
      }
      // The phase's range copies (a sub-group's pieces), each started when its link has room
      // and waited for before the next: the virtual clock advances by delivering events.
      auto copy_ranges = [&](bool after_compute) -> Status {
        for (const StepCopy& c : phase.copies) {
          if (c.after_compute != after_compute) continue;
          const Access& from = phase.accesses.at(c.from).access;
          const Access& to = phase.accesses.at(c.to).access;
          uint64_t ticket = 0;
          for (;;) {
            Result<uint64_t> started = scheduler.start_copy_range(
                from.tensor, from.tier, c.from_offset, to.tensor, to.tier, c.to_offset, c.bytes,
                std::chrono::nanoseconds(0));
            if (started) {
              ticket = *started;
              break;
            }
            if (started.status().code() != STRATA_E_TIMEOUT || !backend.deliver_next()) {
              return std::move(started).take_status().with_context("simulate, phase " +
                                                                   phase_label(phase.key));
            }
          }
          for (;;) {
            STRATA_ASSIGN_OR_RETURN(bool done, scheduler.poll_copy_range(ticket),
                                    "simulate, phase " + phase_label(phase.key));
            if (done) break;
            const bool delivered = backend.deliver_next();
            STRATA_ASSERT(delivered);  // the copy is in flight: its completion is due
          }
        }
        return Status::ok();
      };
      STRATA_TRY(copy_ranges(false));
      if (measuring) stall += backend.now() - phase_start;
      if (config.trace != nullptr && backend.now() > phase_start) {
        config.trace->record_span(telemetry::kTrackWait, phase_label(phase.key), us(phase_start),
                                  us(backend.now()));
      }
      double seconds = 0;
      Resource resource = Resource::kCompute;
      switch (phase.compute) {
        case ComputeKind::kNone:
          break;
        case ComputeKind::kForward:
          seconds = phase.compute_units * model.forward_seconds_per_layer;
          break;
        case ComputeKind::kBackward:
          seconds = phase.compute_units * model.backward_seconds_per_layer;
          break;
        case ComputeKind::kOptimizer:
          seconds = phase.compute_units / model.cpu_optimizer_params_per_s;
          resource = Resource::kCpuOptimizer;
          break;
        case ComputeKind::kGradientScan:
          seconds = phase.compute_units / model.host_gradient_scan_elements_per_s;
          resource = Resource::kCpuOptimizer;
          break;
      }
      if (measuring) busy[static_cast<int>(resource)] += seconds;
      // A measurement by the name `strata bench finetune --trace` gives it.
      const std::string label = phase.compute == ComputeKind::kGradientScan
                                    ? "grad ready " + std::to_string(phase.key.layer)
                                    : phase_label(phase.key);
      const auto compute_for = [&](double part) -> Status {
        if (config.trace != nullptr && part > 0) {
          config.trace->record_span(resource == Resource::kCompute ? telemetry::kTrackCompute
                                                                   : telemetry::kTrackOptimizer,
                                    label, us(backend.now()), us(backend.now() + part));
        }
        // While it computes, the loader takes each state as its read completes, as the
        // runtime's thread does.
        const double computed = backend.now() + part;
        while (loaded && backend.deliver_next_before(computed)) STRATA_TRY(poll());
        backend.run_until(computed);
        return poll();
      };
      if (phase.packs.empty() && phase.unpacks.empty()) {
        STRATA_TRY(compute_for(seconds + model.phase_overhead_seconds));
      } else {
        // Saved activations move between the layer's operations, as autograd's hooks move them:
        // forward packs each tensor as an operation saves it, backward unpacks each one as the
        // node that saved it runs, and drops it after. The layer's compute is spread evenly
        // between its chunks: each unpack (hinting the next chunk) before a part, each pack after
        // one, an unpacked chunk discarded once its part has run.
        const size_t chunks = phase.packs.size() + phase.unpacks.size();
        const double part = seconds / static_cast<double>(chunks);
        for (size_t k = 0; k < phase.unpacks.size(); ++k) {
          const TensorHandle next =
              k + 1 < phase.unpacks.size() ? phase.unpacks[k + 1] : next_unpack[index];
          if (next.generation != 0) STRATA_TRY(scheduler.prefetch(next, Tier::kPinned));
          STRATA_TRY(move_saved(phase, phase.unpacks[k], false));
          STRATA_TRY(compute_for(part));
          STRATA_TRY(scheduler.discard(phase.unpacks[k]));
        }
        for (const TensorHandle chunk : phase.packs) {
          STRATA_TRY(compute_for(part));
          STRATA_TRY(move_saved(phase, chunk, true));
        }
        STRATA_TRY(compute_for(model.phase_overhead_seconds));
      }
      STRATA_TRY(copy_ranges(true));

      for (const StepAccess& a : phase.accesses) {
        Status released = scheduler.release(a.access.tensor, a.release_dirty);
        if (!released) return std::move(released).with_context("simulate");
        if (a.done_after) STRATA_TRY(scheduler.write_behind(a.access.tensor, state_write_back));
      }
      for (const StepAccess& a : phase.accesses) {
        if (a.discard_after) STRATA_TRY(scheduler.discard(a.access.tensor));
      }
      if (loaded) held_ahead[index] = 0;
      const bool continued =
          index + 1 < step.phases.size() && step.phases[index + 1].continues_phase;
      if (!continued) STRATA_TRY(scheduler.end_phase(open_phase));
    }
    Status ended = scheduler.end_step();
    if (!ended) return std::move(ended).with_context("simulate");
    if (step_track) {
      config.trace->record_span(*step_track,
                                "step " + std::to_string(s) + (measuring ? "" : " (warm-up)"),
                                us(step_start), us(backend.now()));
    }
  }

  SimulationResult result;
  result.policy = plan.policy;
  const double steps = config.measured_steps;
  result.step_seconds = (backend.now() - measure_start) / steps;
  result.stall_seconds = stall / steps;
  result.activation_seconds = activation_seconds / steps;
  for (int i = 0; i < kLinkCount; ++i) {
    const LinkCounters after = backend.link_counters(static_cast<Link>(i));
    result.link_bytes[i] = (after.bytes - links_before[i].bytes) / config.measured_steps;
    busy[i] = (after.busy_seconds - links_before[i].busy_seconds);
  }
  for (double& b : busy) b /= steps;
  result.busy_seconds = busy;
  const SchedulerStats stats_after = scheduler.stats();
  for (int k = 0; k < kTensorKindCount; ++k) {
    result.nvme_read_by_kind[k] =
        (stats_after.nvme_read_by_kind[k] - stats_before.nvme_read_by_kind[k]) /
        config.measured_steps;
    result.nvme_written_by_kind[k] =
        (stats_after.nvme_written_by_kind[k] - stats_before.nvme_written_by_kind[k]) /
        config.measured_steps;
  }

  const TierUsage pinned = scheduler.tier_usage(Tier::kPinned);
  const TierUsage device = scheduler.tier_usage(Tier::kDevice);
  result.peak_pinned_bytes = pinned.peak_footprint_bytes;
  result.peak_device_bytes = device.peak_footprint_bytes;
  result.peak_host_bytes =
      plan.host_static_bytes + std::max({pinned.peak_footprint_bytes, check_host_peak,
                                         pinned.reserved_bytes + plan.startup_transient_bytes});

  // The bottleneck: the busiest resource. A half-duplex drive is one resource for both
  // directions, named after the direction that kept it busier.
  const auto b = [&](Resource r) { return busy[static_cast<int>(r)]; };
  struct Candidate {
    Resource resource;
    double seconds;
  };
  std::vector<Candidate> candidates;
  if (model.nvme_full_duplex) {
    candidates.push_back({Resource::kNvmeRead, b(Resource::kNvmeRead)});
    candidates.push_back({Resource::kNvmeWrite, b(Resource::kNvmeWrite)});
  } else {
    const Resource more = b(Resource::kNvmeWrite) > b(Resource::kNvmeRead) ? Resource::kNvmeWrite
                                                                           : Resource::kNvmeRead;
    candidates.push_back({more, b(Resource::kNvmeRead) + b(Resource::kNvmeWrite)});
  }
  const Resource pcie = b(Resource::kDeviceToHost) > b(Resource::kHostToDevice)
                            ? Resource::kDeviceToHost
                            : Resource::kHostToDevice;
  candidates.push_back({pcie, b(pcie)});
  candidates.push_back({Resource::kCompute, b(Resource::kCompute)});
  candidates.push_back({Resource::kCpuOptimizer, b(Resource::kCpuOptimizer)});
  const Candidate* top = &candidates[0];
  for (const Candidate& c : candidates) {
    if (c.seconds > top->seconds) top = &c;
  }
  result.bottleneck = top->resource;
  result.bottleneck_label = bottleneck_name(top->resource);
  result.transfers = total_transfers(backend);
  result.scheduler = scheduler.stats();
  return result;
}

std::string format_result(const SimulationResult& r) {
  char line[256];
  std::string out;
  auto add = [&](const char* format, auto... args) {
    std::snprintf(line, sizeof(line), format, args...);
    out += line;
  };
  add("policy            %s\n", r.policy.c_str());
  add("step              %.3f s (stalled %.3f s)\n", r.step_seconds, r.stall_seconds);
  if (r.activation_seconds > 0) add("activation copies %.3f s\n", r.activation_seconds);
  add("bottleneck        %s\n", r.bottleneck_label);
  const char* names[kResourceCount] = {"nvme_read",      "nvme_write", "host_to_device",
                                       "device_to_host", "compute",    "cpu_optimizer"};
  for (int i = 0; i < kResourceCount; ++i) {
    add("busy %-13s %.3f s\n", names[i], r.busy_seconds[i]);
  }
  for (int i = 0; i < kLinkCount; ++i) {
    add("moved %-12s %s\n", names[i], format_bytes(r.link_bytes[i]).c_str());
  }
  add("peak pinned       %s\n", format_bytes(r.peak_pinned_bytes).c_str());
  add("peak device       %s\n", format_bytes(r.peak_device_bytes).c_str());
  add("peak host         %s\n", format_bytes(r.peak_host_bytes).c_str());
  return out;
}

}  // namespace strata::sched
