// The simulator: the real Scheduler, unchanged, driving a SimulatedBackend on a virtual clock,
// with a modelled framework playing a training step (training_step.h) through try_acquire /
// release. Full-size models (a 405B model: ~1,100 parameters, ~5,700 tensors, ~6 TB of states)
// simulate in seconds because nothing is allocated, copied or slept.
//
// What it models: per-link FIFO transfers with rates and latencies (device_model.h), prefetch,
// eviction and write-back exactly as the scheduler decides them, streamed device transfers when
// the memory plan has staging, GPU compute per layer, the CPU optimizer per parameter or, for an
// inventory laid out by split_optimizer_states, per sub-group with the pieces' range copies
// (training_step.h), a host-side overflow check when the memory plan has one, pools with their
// size classes and up-front reservations, offloaded activations as the framework moves them
// (training_step.h's packs and unpacks: its own blocking copies on the links, the chunks
// through the pinned pool). What it leaves out: activations kept and framework memory on the
// device, CPU memory bandwidth contention, NUMA, the optimizer overlapping the backward pass
// (phases run one after another, as in ZeRO-Infinity).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "sched/device_model.h"
#include "sched/memory_plan.h"
#include "sched/scheduler.h"
#include "sched/training_step.h"
#include "telemetry/trace_recorder.h"
#include "vocabulary/tensor_spec.h"

namespace strata::sched {

// Resources whose busy time the simulator reports.
enum class Resource : uint8_t {
  kNvmeRead = 0,
  kNvmeWrite = 1,
  kHostToDevice = 2,
  kDeviceToHost = 3,
  kCompute = 4,       // GPU forward / backward
  kCpuOptimizer = 5,  // CPU optimizer and host-side overflow checks
};
inline constexpr int kResourceCount = 6;
// "nvme_read", "nvme_write", "pcie" (either direction), "compute", "cpu_optimizer".
const char* bottleneck_name(Resource resource);

struct SimulationConfig {
  DeviceModel device;
  MemoryPlan memory = strata_memory_plan(uint64_t{64} << 30, uint64_t{40} << 30);
  std::array<uint32_t, kLinkCount> max_inflight = {8, 8, 4, 4};
  PrefetchWindow window;
  double clean_headroom = 0.10;
  TrainingStepOptions step;
  // Gradient accumulation: forward and backward passes per optimizer step (>= 1). After the
  // first, backward adds into the gradients, so it reads them where the first overwrote them.
  uint32_t micro_batches = 1;
  uint32_t warmup_steps = 1;    // steps played before measuring (fill the pipeline)
  uint32_t measured_steps = 1;  // steps averaged in the result (>= 1)
  // Explicit limit on simulated transfers, so a pathological configuration fails instead of
  // running for hours.
  uint64_t max_transfers = 100'000'000;
  // When set (not owned), every step's transfers, waits and compute as spans on the virtual
  // clock, warm-up steps included (SimulatedBackend::set_trace): what `strata plan --trace`
  // exports. nullptr: nothing recorded.
  telemetry::TraceRecorder* trace = nullptr;
  // Tests: the scheduler recounts its books after every pump (SchedulerConfig::check_invariants).
  // A scan of every record and scheduled access per pump: for small inventories only.
  bool check_invariants = false;
};

struct SimulationResult {
  std::string policy;        // the memory plan's
  double step_seconds = 0;   // mean over the measured steps
  double stall_seconds = 0;  // per step: the framework waiting in acquire
  // Per step: the compute stream copying offloaded activations out and back (each chunk's copy,
  // from its issue, behind what the link already carries, to its end), in which it computes
  // nothing. Waiting to acquire a chunk counts as a stall.
  double activation_seconds = 0;
  std::array<double, kResourceCount> busy_seconds{};  // per step
  std::array<uint64_t, kLinkCount> link_bytes{};      // per step
  // Per step, by the tensor's kind: completed NVMe reads and writes (SchedulerStats' counts).
  std::array<uint64_t, kTensorKindCount> nvme_read_by_kind{};
  std::array<uint64_t, kTensorKindCount> nvme_written_by_kind{};
  // Peaks over the measured steps. Pinned and device: what the pools hold (reserved blocks
  // count whole). Host: pinned plus unpinned host memory of the plan (flat buffers,
  // overflow-check temporaries) and, for plans that copy at startup, the startup peak.
  uint64_t peak_pinned_bytes = 0;
  uint64_t peak_device_bytes = 0;
  uint64_t peak_host_bytes = 0;
  Resource bottleneck = Resource::kCompute;
  const char* bottleneck_label = "compute";
  uint64_t transfers = 0;    // simulated, all steps
  SchedulerStats scheduler;  // at the end of the run
};

// Registers `inventory` (parameters and optimizer states start on NVMe, gradients unwritten; the
// plan's pinned-home kinds rest in pinned memory), declares the step's schedule and plays
// warmup + measured steps. Errors: a bad configuration (STRATA_E_INVALID), a tensor or a phase
// that cannot fit its budget (STRATA_E_PINNED_BUDGET / DEVICE_BUDGET, with the phase named),
// or max_transfers exceeded (STRATA_E_LIMIT).
Result<SimulationResult> simulate(const std::vector<TensorSpec>& inventory,
                                  const SimulationConfig& config);

// One line per quantity, for logs and the CLI.
std::string format_result(const SimulationResult& result);

}  // namespace strata::sched
