// Host memory, NVMe bytes and step time of NVMe offload, for Strata's policy and for DeepSpeed
// ZeRO-Infinity's, as the planner uses them.
//
// ANALYTIC STAND-IN. The runtime's answer to "how much host RAM and how long a step" is a
// simulated step of the real scheduler (runtime/sched/), which replays the same placement and
// prefetch policies on modelled devices. Until the planner calls it, these two functions answer
// from closed-form formulas (docs/planner.md, "NVMe offload"). They are the only place the
// planner gets these numbers from: swapping in the simulator means reimplementing these two
// functions over the same inputs and outputs, nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata {

// What the offload estimators need to know about a job, independent of the policy.
struct OffloadJob {
  // Sizes, from the model inventory.
  uint64_t params = 0;            // all parameters
  uint64_t trainable_params = 0;  // = params for full fine-tuning; adapters for (Q)LoRA
  uint64_t weight_bytes = 0;      // stored weights forward/backward read (bf16; 4-bit for QLoRA)
  uint64_t largest_unit_weight_bytes = 0;           // biggest layer (or embedding/head), stored
  uint64_t largest_unit_trainable_params = 0;       // biggest layer's trainable parameters
  uint64_t largest_weight_elements = 0;             // biggest single weight tensor
  std::vector<uint64_t> trainable_tensor_elements;  // trainable tensors in model order
  uint32_t param_bytes = 2;             // bytes per element of weights and gradients (precision)
  bool optimizer_on_host = true;        // full fine-tuning: CPU Adam; (Q)LoRA: adapters on GPU
  bool fp16_loss_scaling = false;       // fp16 training checks gradients for overflow
  bool params_resident_on_gpu = false;  // weights fit on the GPU(s), so they are not streamed
  uint64_t grad_accum = 1;              // micro-batches per optimizer step
  uint32_t gpus = 1;

  // Rates.
  double compute_seconds = 0;  // GPU time of one step (all micro-batches)
  double pcie_gbps = 0;        // achievable host<->device rate per GPU per direction
  double nvme_read_gbps = 0;   // aggregate over drives
  double nvme_write_gbps = 0;
  double adam_params_per_s = 0;               // CPU optimizer rate
  double host_scan_gbps = 0;                  // single-pass host memory scan rate (overflow checks)
  std::optional<uint64_t> host_budget_bytes;  // RAM the job may use, when the user said
};

// Named bytes, for the breakdowns people read.
struct ByteItem {
  std::string what;
  uint64_t bytes = 0;
};

struct OffloadEstimate {
  uint64_t host_bytes = 0;  // peak host RAM the policy uses
  uint64_t nvme_bytes = 0;  // NVMe space the policy uses
  std::vector<ByteItem> host_breakdown;
  // Per optimizer step.
  uint64_t pcie_h2d_bytes = 0;  // per GPU
  uint64_t pcie_d2h_bytes = 0;  // per GPU
  uint64_t nvme_read_bytes = 0;
  uint64_t nvme_write_bytes = 0;
  double compute_seconds = 0;
  double pcie_seconds = 0;
  double nvme_seconds = 0;
  double cpu_optimizer_seconds = 0;
  double serial_seconds = 0;  // work nothing overlaps with (ZeRO-Infinity's overflow check)
  double step_seconds = 0;
  std::string bottleneck;            // "compute", "pcie", "nvme", "cpu-optimizer", "overflow-check"
  bool gradients_on_host = false;    // all of them
  uint64_t host_gradient_bytes = 0;  // gradients kept in RAM (the rest spill to NVMe)
  uint64_t cached_weight_bytes = 0;  // weights kept in RAM rather than read from NVMe
  uint64_t working_set_bytes = 0;    // the least host RAM the policy runs in
  std::string model = "analytic";    // "analytic" now; "simulated" once the scheduler answers
};

// Strata's NVMe policy: exact-size (4 KiB-rounded) pinned buffers; an adaptive pool holding
// kParamUnitsInFlight layers of weights and kGradUnitsInFlight layers of gradients; the
// optimizer streaming kOptimizerTensorsInFlight tensors' states through host memory; the
// overflow check fused into the gradient stream (no temporaries). Without host_budget_bytes
// that working set is all it uses (the least RAM the job can run in). With a budget, it keeps
// as many gradients on the host as fit (the rest go to NVMe beside their optimizer states),
// then caches as many weights as the rest of the budget holds. Stages overlap: the step takes
// as long as its slowest stage.
OffloadEstimate estimate_nvme_offload(const OffloadJob& job);

// DeepSpeed ZeRO-Infinity with offload_param and offload_optimizer on NVMe and its defaults,
// as runtime/../offload-baseline.md describes it (five uniform parameter slots, power-of-two
// pinning, 4 + 1 optimizer swap buffers of the largest sub-group, a flat host gradient
// buffer, overflow-check temporaries, the startup double copy). Its forward/backward, its
// optimizer step and its overflow check run one after another.
OffloadEstimate estimate_zero_infinity_offload(const OffloadJob& job);

// CPU offload (no NVMe): states in host RAM, exact size; PCIe and CPU Adam overlap compute.
// Host bytes: the streamed weights (when not resident on the GPU), gradients and optimizer
// states of the trainable parameters.
OffloadEstimate estimate_cpu_offload(const OffloadJob& job);

inline constexpr int kParamUnitsInFlight = 3;        // read from NVMe, copy to GPU, slack
inline constexpr int kGradUnitsInFlight = 2;         // copied from GPU, draining to the optimizer
inline constexpr int kOptimizerTensorsInFlight = 3;  // reading, updating, writing back

// ZeRO-Infinity defaults (offload-baseline.md).
inline constexpr uint64_t kZeroParamBufferCount = 5;
inline constexpr uint64_t kZeroParamBufferElements = 100'000'000;
inline constexpr uint64_t kZeroMaxInCpuElements = 1'000'000'000;
inline constexpr uint64_t kZeroOptimizerBufferCount = 4;
inline constexpr uint64_t kZeroSubGroupElements = 1'000'000'000;

// DeepSpeed's sub-groups: parameters taken in order until a group reaches sub_group_size
// elements (stage3.py _create_fp16_sub_groups). Returns the largest group's element count.
uint64_t zero_largest_sub_group(const std::vector<uint64_t>& tensor_elements,
                                uint64_t sub_group_elements = kZeroSubGroupElements);

}  // namespace strata
