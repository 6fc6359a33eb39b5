// The simulator against the real thing: the same small model, budgets and memory plan, played
// once through the real runtime (io_uring, extent store, pinned arena, emulated device) and once
// through sched::simulate with a device model calibrated from the real run's own measurements.
// Step time and peak pinned memory must agree within 15% (issue 4), and the real run must show
// its I/O overlapping compute.
//
// Compute is a sleep of a known length in both runs (a layer's forward or backward, the
// optimizer's update): what is validated is the model of transfers, overlap and memory, which
// the simulator exists for, not the speed of this machine's CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "api/runtime.h"
#include "sched/device_model.h"
#include "sched/memory_plan.h"
#include "sched/simulator.h"
#include "sched/training_step.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
using strata::Tier;

constexpr int kLayers = 6;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kPinnedBudget = 64 * kMiB;
constexpr uint64_t kDeviceBudget = 16 * kMiB;
constexpr uint32_t kQueueDepth = 16;
// The modelled compute: long enough that I/O of later layers can hide behind it.
constexpr double kForwardSecondsPerLayer = 0.020;
constexpr double kBackwardSecondsPerLayer = 0.040;
constexpr double kOptimizerParamsPerSecond = 100e6;
constexpr uint32_t kWarmupSteps = 1;
constexpr uint32_t kMeasuredSteps = 3;

std::string scratch_dir() {
  const char* dir = std::getenv("STRATA_TEST_DIR");
  return dir != nullptr ? dir : "/tmp";
}

// Per layer two bf16 parameters (3 MiB and 1 MiB) with bf16 gradients and fp32 master, m, v;
// an embedding before the layers and a head after them.
std::vector<TensorSpec> validation_inventory() {
  std::vector<TensorSpec> inventory;
  auto add_parameter = [&](const std::string& name, uint64_t elements, int32_t layer) {
    inventory.push_back({name, {elements}, DType::kBFloat16, TensorKind::kParameter, layer});
    inventory.push_back(
        {name + "#grad", {elements}, DType::kBFloat16, TensorKind::kGradient, layer});
    inventory.push_back(
        {name + "#master", {elements}, DType::kFloat32, TensorKind::kMasterWeight, layer});
    inventory.push_back({name + "#adam_m", {elements}, DType::kFloat32, TensorKind::kAdamM, layer});
    inventory.push_back({name + "#adam_v", {elements}, DType::kFloat32, TensorKind::kAdamV, layer});
  };
  add_parameter("embed", 512 * 1024, -1);
  for (int l = 0; l < kLayers; ++l) {
    const std::string prefix = "layers." + std::to_string(l);
    add_parameter(prefix + ".mlp", 1536 * 1024, l);
    add_parameter(prefix + ".attn", 512 * 1024, l);
  }
  add_parameter("head", 512 * 1024, -1);
  return inventory;
}

struct RealRun {
  double step_seconds = 0;       // mean over the measured steps
  double stall_seconds = 0;      // per step: waiting in acquire
  double compute_seconds = 0;    // per step: the sleeps
  double nvme_busy_seconds = 0;  // per step: time with a read or a write in flight
  uint64_t peak_pinned_bytes = 0;
  sched::Measurements measured;
  // Over the measured steps: transfers issued ahead of any demand (the schedule's prefetch and
  // write-behind) against those an acquire waited for, and acquires that found their tensor ready.
  uint64_t prefetch_transfers = 0;
  uint64_t demand_transfers = 0;
  uint64_t acquires = 0;
  uint64_t acquire_hits = 0;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Sleeps `seconds` and returns how long it really took.
double compute_for(double seconds) {
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  return seconds_since(start);
}

// Plays the simulator's training step (training_step.h) through the real runtime, with blocking
// acquires: the same loop as sched::simulate, on the wall clock.
Result<RealRun> play_real(api::Runtime& runtime, const std::vector<TensorSpec>& inventory) {
  sched::Scheduler& scheduler = runtime.scheduler();
  datapath::RealBackend& backend = runtime.backend();
  constexpr auto kTimeout = std::chrono::seconds(60);

  // Steady state as the simulator assumes it: every tensor but the gradients has contents on
  // NVMe, nothing is resident.
  std::vector<sched::TensorHandle> handles;
  for (const TensorSpec& spec : inventory) {
    Result<sched::TensorHandle> handle = scheduler.register_tensor(spec);
    if (!handle) return std::move(handle).take_status();
    handles.push_back(*handle);
    if (spec.kind == TensorKind::kGradient) continue;
    Result<sched::Acquired> acquired =
        scheduler.acquire(*handle, Tier::kPinned, sched::AccessMode::kOverwrite, kTimeout);
    if (!acquired) return std::move(acquired).take_status();
    std::memset(acquired->data, static_cast<int>(handles.size()), acquired->bytes);
    STRATA_TRY(scheduler.release(*handle, /*dirty=*/true));
  }
  // Clean pinned copies may remain: the warm-up step leaves the steady state behind it.
  STRATA_TRY(scheduler.flush(kTimeout));

  Result<sched::TrainingStep> planned = sched::plan_training_step(inventory, handles);
  if (!planned) return std::move(planned).take_status();
  Result<sched::AccessSchedule> schedule = sched::schedule_of(*planned);
  if (!schedule) return std::move(schedule).take_status();
  STRATA_TRY(scheduler.declare_schedule(std::move(*schedule)));

  RealRun run;
  std::array<sched::LinkCounters, sched::kLinkCount> before{};
  double forward_seconds = 0, backward_seconds = 0, forward_units = 0, backward_units = 0;
  double optimizer_seconds = 0, optimizer_params = 0;
  Clock::time_point measure_start;
  sched::SchedulerStats stats_before;  // at the start of the measured steps
  for (uint32_t s = 0; s < kWarmupSteps + kMeasuredSteps; ++s) {
    const bool measuring = s >= kWarmupSteps;
    if (s == kWarmupSteps) {
      for (int i = 0; i < sched::kLinkCount; ++i)
        before[i] = backend.link_counters(static_cast<sched::Link>(i));
      scheduler.reset_peaks();
      stats_before = scheduler.stats();
      measure_start = Clock::now();
    }
    STRATA_TRY(scheduler.begin_step());
    for (const sched::StepPhase& phase : planned->phases) {
      STRATA_TRY(scheduler.begin_phase(phase.key));
      const auto wait_start = Clock::now();
      for (const sched::StepAccess& a : phase.accesses) {
        Result<sched::Acquired> acquired =
            scheduler.acquire(a.access.tensor, a.access.tier, a.access.mode, kTimeout);
        if (!acquired) return std::move(acquired).take_status();
      }
      if (measuring) run.stall_seconds += seconds_since(wait_start);

      double took = 0;
      switch (phase.compute) {
        case sched::ComputeKind::kNone:
          break;
        case sched::ComputeKind::kForward:
          took = compute_for(phase.compute_units * kForwardSecondsPerLayer);
          forward_seconds += took;
          forward_units += phase.compute_units;
          break;
        case sched::ComputeKind::kBackward:
          took = compute_for(phase.compute_units * kBackwardSecondsPerLayer);
          backward_seconds += took;
          backward_units += phase.compute_units;
          break;
        case sched::ComputeKind::kOptimizer:
          took = compute_for(phase.compute_units / kOptimizerParamsPerSecond);
          optimizer_seconds += took;
          optimizer_params += phase.compute_units;
          break;
        case sched::ComputeKind::kGradientScan:  // none: this step leaves measure_gradients off
          return Status::error(STRATA_E_INTERNAL, "unexpected gradient scan in the validated step");
      }
      if (measuring) run.compute_seconds += took;

      for (const sched::StepAccess& a : phase.accesses) {
        STRATA_TRY(scheduler.release(a.access.tensor, a.release_dirty));
      }
      for (const sched::StepAccess& a : phase.accesses) {
        if (a.discard_after) STRATA_TRY(scheduler.discard(a.access.tensor));
      }
      STRATA_TRY(scheduler.end_phase(phase.key));
    }
    STRATA_TRY(scheduler.end_step());
  }
  const double measured_seconds = seconds_since(measure_start);

  const sched::SchedulerStats stats = scheduler.stats();
  run.prefetch_transfers = stats.prefetch_transfers - stats_before.prefetch_transfers;
  run.demand_transfers = stats.demand_transfers - stats_before.demand_transfers;
  run.acquires = stats.acquires - stats_before.acquires;
  run.acquire_hits = stats.acquire_hits - stats_before.acquire_hits;
  run.step_seconds = measured_seconds / kMeasuredSteps;
  run.stall_seconds /= kMeasuredSteps;
  run.compute_seconds /= kMeasuredSteps;
  run.peak_pinned_bytes = scheduler.tier_usage(Tier::kPinned).peak_footprint_bytes;
  for (int i = 0; i < sched::kLinkCount; ++i) {
    const sched::LinkCounters after = backend.link_counters(static_cast<sched::Link>(i));
    sched::LinkCounters& delta = run.measured.links[i];
    delta.bytes = after.bytes - before[i].bytes;
    delta.transfers = after.transfers - before[i].transfers;
    delta.busy_seconds = after.busy_seconds - before[i].busy_seconds;
  }
  run.nvme_busy_seconds =
      (run.measured.links[0].busy_seconds + run.measured.links[1].busy_seconds) / kMeasuredSteps;
  run.measured.forward_seconds_per_layer = forward_seconds / forward_units;
  run.measured.backward_seconds_per_layer = backward_seconds / backward_units;
  run.measured.optimizer_params = optimizer_params;
  run.measured.optimizer_seconds = optimizer_seconds;
  // Everything the step spent outside acquire and compute (releasing, bookkeeping), per phase.
  run.measured.phase_overhead_seconds =
      std::max(0.0, run.step_seconds - run.stall_seconds - run.compute_seconds) /
      static_cast<double>(planned->phases.size());
  return run;
}

TEST(SimulatorValidation, StepTimeAndPeakPinnedMatchARealRunWithin15Percent) {
  strata_config config{};
  strata_config_init(&config);
  const std::string dir = scratch_dir();
  config.nvme_path = dir.c_str();
  config.nvme_capacity_bytes = 1024 * kMiB;
  config.pinned_budget_bytes = kPinnedBudget;
  config.device_budget_bytes = kDeviceBudget;
  config.queue_depth = kQueueDepth;
  config.device_backend = STRATA_DEVICE_EMULATED;
  Result<std::unique_ptr<api::Runtime>> runtime = api::Runtime::create(config);
  ASSERT_TRUE(runtime) << runtime.status().message();

  const std::vector<TensorSpec> inventory = validation_inventory();
  Result<RealRun> real = play_real(**runtime, inventory);
  ASSERT_TRUE(real) << real.status().message();

  // The simulation: the runtime's own memory plan and in-flight limits, the model calibrated
  // from what the real run measured.
  Result<sched::DeviceModel> model = sched::calibrate(real->measured);
  ASSERT_TRUE(model) << model.status().message();
  sched::SimulationConfig sim;
  sim.device = *model;
  sim.device.nvme_full_duplex = true;  // measured per direction, while the other was busy too
  sim.memory = sched::strata_memory_plan(kPinnedBudget, kDeviceBudget);
  const uint32_t nvme_inflight = std::clamp<uint32_t>(kQueueDepth, 4, 64);
  sim.max_inflight = {nvme_inflight, nvme_inflight, 8, 8};
  sim.warmup_steps = kWarmupSteps;
  sim.measured_steps = kMeasuredSteps;
  Result<sched::SimulationResult> simulated = sched::simulate(inventory, sim);
  ASSERT_TRUE(simulated) << simulated.status().message();

  const double time_ratio = simulated->step_seconds / real->step_seconds;
  const double pinned_ratio = static_cast<double>(simulated->peak_pinned_bytes) /
                              static_cast<double>(real->peak_pinned_bytes);
  RecordProperty("real_step_s", std::to_string(real->step_seconds));
  RecordProperty("simulated_step_s", std::to_string(simulated->step_seconds));
  std::printf(
      "real:      step %.3f s, stall %.3f s, compute %.3f s, other %.3f s, nvme busy %.3f s, "
      "peak pinned %.1f MiB\n",
      real->step_seconds, real->stall_seconds, real->compute_seconds,
      real->step_seconds - real->stall_seconds - real->compute_seconds, real->nvme_busy_seconds,
      static_cast<double>(real->peak_pinned_bytes) / kMiB);
  std::printf("simulated: step %.3f s, stall %.3f s, peak pinned %.1f MiB\n%s",
              simulated->step_seconds, simulated->stall_seconds,
              static_cast<double>(simulated->peak_pinned_bytes) / kMiB,
              sched::format_result(*simulated).c_str());
  EXPECT_NEAR(time_ratio, 1.0, 0.15) << "simulated / real step time";
  EXPECT_NEAR(pinned_ratio, 1.0, 0.15) << "simulated / real peak pinned";

  // Overlap, by structure rather than by the clock (the machine is shared; a loaded CI runner
  // stretched the I/O behind the sleeps until the stall was 95% of it, 2026-12-02): most
  // transfers are issued ahead of the acquire that needs them, and most acquires find their
  // tensor ready, so the I/O ran while the loop computed. The time hidden is printed: on an idle
  // 2-core VM, nvme busy 0.24-0.26 s against a stall of 0.14-0.17 s.
  std::printf(
      "overlap: %llu transfers ahead of demand, %llu on demand; %llu of %llu acquires "
      "ready; %.3f s of I/O hidden behind compute\n",
      static_cast<unsigned long long>(real->prefetch_transfers),
      static_cast<unsigned long long>(real->demand_transfers),
      static_cast<unsigned long long>(real->acquire_hits),
      static_cast<unsigned long long>(real->acquires),
      real->nvme_busy_seconds - real->stall_seconds);
  EXPECT_GT(real->prefetch_transfers, 2 * real->demand_transfers)
      << "transfers were issued on demand rather than ahead of it";
  EXPECT_GT(2 * real->acquire_hits, real->acquires) << "most acquires waited for their tensor";
}

}  // namespace
}  // namespace strata
