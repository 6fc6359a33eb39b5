// Host memory, NVMe space and step time of offloading model states, as the planner uses them.
//
// CPU offload is closed-form: exact-size states in RAM, PCIe and CPU Adam overlapping compute.
// NVMe offload is a simulated training step: sched::simulate runs the real Scheduler, with
// Strata's memory plan (sched/memory_plan.h), over the job's tensor inventory on devices modelled
// from the GPU preset, the NVMe array and the CPU optimizer rate. The host RAM it reports is the
// simulated peak (pinned pools plus the plan's unpinned host memory); the step time is the
// simulated clock. docs/planner.md, "NVMe offload", explains both. DeepSpeed's NVMe offload is
// plan_deepspeed.h's.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "sched/device_model.h"
#include "sched/pinned_sizing.h"
#include "telemetry/trace_recorder.h"
#include "vocabulary/tensor_spec.h"

namespace strata {

class SimulationPool;  // model/simulation_pool.h

// What the offload estimators need to know about a job, independent of the policy.
// A training server's CPU optimizer threads and the queue depth of 1 MiB requests that keeps a
// datacenter NVMe drive at full speed, unless the plan is told otherwise.
inline constexpr uint32_t kPlanOptimizerThreads = 16;
inline constexpr uint32_t kPlanDriveQueueDepth = 32;

struct OffloadJob {
  // What lives off the GPU, in forward order (build_inventory's): every parameter as stored (a
  // QLoRA layer weight is its NF4 bytes, kUInt8), and for full fine-tuning each one's gradient,
  // fp32 master and Adam m and v. (Q)LoRA adapters and their states stay on the GPU.
  std::vector<TensorSpec> inventory;
  uint64_t params = 0;            // all parameters
  uint64_t trainable_params = 0;  // = params for full fine-tuning; adapters for (Q)LoRA
  uint64_t weight_bytes = 0;      // stored weights forward/backward read
  std::vector<uint64_t> trainable_tensor_elements;  // trainable tensors in model order
  uint32_t param_bytes = 2;             // bytes per element of weights and gradients (precision)
  bool optimizer_on_host = true;        // full fine-tuning: CPU Adam; (Q)LoRA: adapters on the GPU
  bool fp16_loss_scaling = false;       // fp16 training checks gradients for overflow
  bool params_resident_on_gpu = false;  // weights fit on the GPU(s), so they are not streamed
  uint32_t grad_accum = 1;              // micro-batches per optimizer step
  uint32_t gpus = 1;                    // one node; states partitioned ZeRO-3 style

  // Rates.
  double compute_seconds = 0;         // GPU time of one step (all micro-batches), per GPU
  double forward_fraction = 1.0 / 3;  // the part of compute_seconds that is forward passes
  double pcie_gbps = 0;               // achievable host<->device rate per GPU per direction
  double nvme_read_gbps = 0;          // aggregate over drives
  double nvme_write_gbps = 0;
  double adam_params_per_s = 0;  // CPU optimizer rate
  double host_scan_gbps = 0;     // single-pass host memory scan rate (overflow checks)
  // Per GPU: the GPU memory the offloaded states may occupy (the plan's weights, gradient and
  // streaming buffers); the rest of the GPU is activations, logits and the context.
  uint64_t device_budget_bytes = 0;
  // device_budget_bytes is `--device-budget`'s, not the formulas': errors name the option.
  bool device_budget_given = false;
  std::optional<uint64_t> host_budget_bytes;  // RAM the job may use, when the user said
  // Strata's pinned pool exactly, no floor (`--pinned-budget`, as `strata bench finetune
  // --pinned-budget` sets it): to replay a run's budget. Overrides host_budget_bytes.
  std::optional<uint64_t> strata_pinned_bytes;
  sched::PinnedSplitGiven strata_pinned_given;  // with strata_pinned_bytes: as PlanRequest's
  // The training machine's CPU optimizer threads and the drives' queue depth at full speed: what
  // the automatic pinned budget is sized from (sched/pinned_sizing.h).
  uint32_t optimizer_threads = kPlanOptimizerThreads;
  uint32_t drive_queue_depth = kPlanDriveQueueDepth;
  uint32_t warmup_steps = 1;  // simulated before the measured step (PlanRequest's)
  // Activation offload under NVMe offload of the states (the simulated step plays it; closed
  // forms take add_activation_offload instead): the saved activations leaving each GPU per
  // micro-batch, (layers - 1) layers' worth, and whether they go to NVMe through the pinned pool
  // (strata.torch's activations="nvme") or rest in it (activations="pinned").
  uint64_t offloaded_activation_bytes = 0;
  bool activations_to_nvme = false;
  // activations_alone_job's: the weights rest on the device for good (strata.torch's
  // param_home="device"; MemoryPlan::device_home_kinds), so the simulated step moves the
  // activations only.
  bool params_home_on_device = false;
  // Where the simulation records its transfers, waits and compute (SimulationConfig::trace; not
  // owned, not part of what same_simulation compares): set only by write_strata_nvme_trace.
  telemetry::TraceRecorder* trace = nullptr;
};

// Named bytes, for the breakdowns people read.
struct ByteItem {
  std::string what;
  uint64_t bytes = 0;
};

struct OffloadEstimate {
  std::string policy;  // "cpu", "strata", or a DeepSpeed configuration's name
  // "analytic" (closed form), "simulated" (sched::simulate), or "analytic, activations
  // simulated" (add_simulated_activations).
  std::string model = "analytic";
  // Whether any figure comes from a simulated step (stall, pool, bytes by kind).
  bool has_simulation() const { return model != "analytic"; }
  uint64_t host_bytes = 0;  // peak host RAM the policy uses
  uint64_t nvme_bytes = 0;  // NVMe space the policy uses
  std::vector<ByteItem> host_breakdown;
  // Per optimizer step.
  uint64_t pcie_h2d_bytes = 0;  // per GPU
  uint64_t pcie_d2h_bytes = 0;  // per GPU
  uint64_t nvme_read_bytes = 0;
  uint64_t nvme_write_bytes = 0;
  // Simulated runs: the same by tensor kind (TensorKind's order).
  std::array<uint64_t, kTensorKindCount> nvme_read_by_kind{};
  std::array<uint64_t, kTensorKindCount> nvme_write_by_kind{};
  double compute_seconds = 0;        // busy time of each resource
  double pcie_seconds = 0;           // the busier direction
  double nvme_seconds = 0;           // read + write (a drive serves one direction at a time)
  double cpu_optimizer_seconds = 0;  // CPU Adam and, for ZeRO-Infinity, its overflow check
  double stall_seconds = 0;          // the GPU waiting for data (simulated)
  // The compute stream copying saved activations out and back (activation offload): blocking
  // copies that compute waits for, so the stream is busy compute_seconds plus this (simulated:
  // each chunk's copy from its issue, which may wait behind the link's other transfers; waiting
  // for the chunk itself, read back or room for it, is a stall).
  double activation_copy_seconds = 0;
  // Activation offload under NVMe offload: the same step simulated without them. The step is at
  // least this plus activation_copy_seconds (simulate_strata_nvme_offload); 0 otherwise.
  double states_only_step_seconds = 0;
  // Activation offload to NVMe with no or CPU offload of the states (a closed form otherwise):
  // the step simulated with the activations alone passing through Strata's pinned pool
  // (activations_alone_job). The step is at least this (add_simulated_activations); 0 otherwise.
  double activations_alone_step_seconds = 0;
  double step_seconds = 0;
  std::string bottleneck;  // "compute", "pcie", "nvme-read", "nvme-write", "cpu-optimizer"
  // Simulated runs: the budgets the scheduler ran under and the peaks it reached.
  uint64_t pinned_budget_bytes = 0;
  uint64_t device_budget_bytes = 0;  // all GPUs
  uint64_t peak_pinned_bytes = 0;
  uint64_t peak_device_bytes = 0;  // all GPUs
  uint64_t transfers = 0;          // simulated, warm-up steps included
  // Strata: how its pinned budget was chosen, one line per figure (sched::PinnedSizing's), and
  // whether it is the RAM given (what the headroom leaves of --host-ram, beside the states where
  // the closed form keeps them in RAM) rather than the automatic or --pinned-budget's.
  std::vector<std::string> pinned_derivation;
  bool pinned_budget_from_ram = false;
};

// CPU offload (no NVMe): states in host RAM, exact size; PCIe and CPU Adam overlap compute.
// Host bytes: the streamed weights (when not resident on the GPU), gradients and optimizer
// states of the trainable parameters.
OffloadEstimate estimate_cpu_offload(const OffloadJob& job);

// Activation offload added to a closed-form estimate (no or CPU offload of the states): one
// micro-batch's saved activations (`bytes_per_micro_batch`, per GPU) cross PCIe out and back per
// micro-batch, and rest in host RAM (pinned) or on NVMe (`to_nvme`: written and read once per
// micro-batch, the most the runtime's spilling moves). The copies are blocking ones on the
// compute stream, as the runtime makes them (activation_copy_seconds); the step is the slowest of
// compute with them, PCIe, the CPU optimizer and the drives. To NVMe, host RAM also holds the
// pinned pool they pass through (the runtime's automatic budget, or --pinned-budget's), and
// peak_pinned_bytes says how much of host_bytes that is.
void add_activation_offload(const OffloadJob& job, uint64_t bytes_per_micro_batch, bool to_nvme,
                            OffloadEstimate& e);

// Activation offload to NVMe with no or CPU offload of the states: the closed form above takes
// the drives' time as overlapped with compute wholly, as if every chunk were back in time. The
// job whose simulation says how far that holds, as strata.torch runs it with param_home="device":
// the weights of `inventory` at home on the device (they give the step its layers, compute and
// declared schedule; they never move), no optimizer states (the GPU's, or CPU offload's, which
// the closed form keeps), and one micro-batch's `activation_bytes` per GPU through Strata's
// pinned pool to NVMe. The pool: --pinned-budget's; else what the RAM given leaves beside the
// states the closed form keeps in RAM (`states_host_bytes`: the budget to set, as NVMe offload's
// pool takes the RAM given); else the runtime's automatic budget, the drive's figure.
// simulate_strata_nvme_offload runs it.
OffloadJob activations_alone_job(const OffloadJob& job, const std::vector<TensorSpec>& inventory,
                                 uint64_t activation_bytes, uint64_t states_host_bytes);

// `e` (add_activation_offload's estimate of `job` with to_nvme) given `alone`, the simulated step
// of its activations_alone_job: the drives' bytes and time, the pool's peak in host RAM and its
// derivation are the simulation's, the GPU's stall too; the step is the slower of the closed
// form's and the simulated one (which leaves out the states' PCIe traffic under CPU offload).
void add_simulated_activations(const OffloadJob& job, const OffloadEstimate& alone,
                               OffloadEstimate& e);

// Explicit limit: micro-batches played per simulated step (the scheduler's cost grows with the
// phases of a step; 70B at 4 micro-batches takes about a second). Beyond it the step is
// extended linearly at the rate micro-batches kMax/2 + 1 .. kMax added, which a second
// simulation of kMax/2 gives (docs/planner.md, "Gradient accumulation").
inline constexpr uint32_t kMaxSimulatedMicroBatches = 4;

// Strata's automatic pinned budget for drives of these rates, as the runtime sizes it
// (sched::size_pinned_budget): staging for the bytes the drives need in flight, the optimizer's
// read-ahead of sub-groups for its threads, its pieces. The least host RAM that keeps the drives
// at full speed, whatever the model's size.
sched::PinnedSizing strata_pinned_sizing(double read_gbps, double write_gbps,
                                         uint32_t optimizer_threads, uint32_t drive_queue_depth);

// The machine sched::simulate models for `job`: NVMe rates (half duplex), PCIe at the GPU's
// rate times the GPU count (one link per GPU), per-layer forward and backward times that add up
// to compute_seconds over the step's layers and LM head, the CPU optimizer rate, and the host
// overflow-check rate (host_scan_gbps over a bool temporary and the gradient: b + 1 bytes per
// element).
sched::DeviceModel offload_device_model(const OffloadJob& job);

// NVMe offload with Strata's memory plan, simulated as the runtime runs it: the automatic pinned
// budget (strata_pinned_sizing; the RAM given when larger, or --pinned-budget exactly), device
// transfers streamed through its staging, the optimizer's states in sub-groups with each
// parameter and gradient held on the device (device_budget_bytes x gpus) and moved through pinned
// pieces; one warm-up step, one measured step of grad_accum forward/backward passes and the
// optimizer. Errors: the simulator's (a budget that
// cannot hold a phase is STRATA_E_PINNED_BUDGET / STRATA_E_DEVICE_BUDGET). Past
// kMaxSimulatedMicroBatches a second, shorter step is simulated; with a pool it runs there, beside
// the first (model/simulation_pool.h). With offloaded activations (offloaded_activation_bytes)
// the step is simulated without them too, and is at least that one plus the copies
// (states_only_step_seconds).
Result<OffloadEstimate> simulate_strata_nvme_offload(const OffloadJob& job,
                                                     SimulationPool* pool = nullptr);

}  // namespace strata
