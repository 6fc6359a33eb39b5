// `strata bench finetune`: what the user asked for, the defaults that make the README's main
// command finish in about five minutes on a 2-core machine, and everything derived from them
// that both the parent process and the per-strategy worker processes need to agree on (the scaled
// model, its inventory, the budgets, ZeRO-Infinity's DeepSpeed-sized buffers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/gpu_presets.h"
#include "model/inventory.h"
#include "model/model_config.h"
#include "sched/memory_plan.h"

namespace strata::bench::finetune {

// The two strategies this benchmark compares, each in its own process.
enum class Strategy : uint8_t { kStrata = 0, kZeroInfinity = 1 };
inline constexpr int kStrategyCount = 2;
const char* to_string(Strategy strategy);  // "strata", "zero-infinity"
Result<Strategy> parse_strategy(const std::string& name);

// How a layer's forward / backward compute is produced.
enum class ComputeMode : uint8_t { kModeled = 0, kCpu = 1, kGpu = 2 };
const char* to_string(ComputeMode mode);
Result<ComputeMode> parse_compute_mode(const std::string& name);

// Defaults of the README's main command (`--model llama-2-70b --strategy both`): a llama-2-70b
// shape narrowed to a quarter of its width and cut to 6 of its 80 layers (354M parameters,
// 5.7 GB of model states per strategy on NVMe), 4 steps. docs/results.md explains each choice.
inline constexpr double kDefaultScale = 0.25;
inline constexpr int kDefaultLayers = 6;
inline constexpr uint32_t kDefaultSteps = 4;
inline constexpr uint32_t kDefaultSeq = 4096;
// 8 sequences: this machine's disk (~0.9 GB/s) is ~8x slower than one Gen4 NVMe drive (7 GB/s),
// so 8x the tokens of a seq-4096 batch-1 fine-tune keep compute : NVMe time per parameter what
// it is for that job on the modelled H100 (compute ~7% of the parameter streaming time).
inline constexpr uint32_t kDefaultBatch = 8;
inline constexpr double kDefaultMfu = 0.4;
inline constexpr const char* kDefaultGpu = "h100-sxm";

// DeepSpeed's defaults (offload-baseline.md, "Defaults"), before scaling.
inline constexpr uint32_t kDeepSpeedParamBufferCount = 5;
inline constexpr uint64_t kDeepSpeedParamBufferElements = 100'000'000;
inline constexpr uint32_t kDeepSpeedOptimizerBufferCount = 4;
inline constexpr uint64_t kDeepSpeedSubGroupElements = 1'000'000'000;
inline constexpr uint32_t kDeepSpeedAioBlockBytes = 1u << 20;
inline constexpr uint32_t kDeepSpeedAioQueueDepth = 8;
inline constexpr uint32_t kDeepSpeedAioThreads = 1;

struct FinetuneOptions {
  std::string model;
  double scale = kDefaultScale;
  int layers = kDefaultLayers;
  uint32_t seq = kDefaultSeq;
  uint32_t batch = kDefaultBatch;
  std::string strategy = "both";
  uint32_t steps = kDefaultSteps;
  std::string nvme_dir;  // empty: the system temporary directory
  std::string compute = "modeled";
  std::string gpu = kDefaultGpu;
  double mfu = kDefaultMfu;
  bool json = false;
  std::string trace_path;
  std::string plot_path;
  std::string project_gpu;
  int metrics_port = -1;      // -1: no endpoint; 0: an ephemeral port (printed on stderr)
  std::string pinned_budget;  // "" : automatic (see Plan::strata_pinned_budget)
  std::string device_budget;  // "" : automatic
  // Strata only: step each layer's parameters as soon as its backward is done (LoHan / Fuyou),
  // so gradients are consumed where they were produced instead of waiting in pinned memory.
  std::string optimizer_overlap = "on";
  // Hidden: set by the parent when it starts a worker process.
  std::string worker;  // strategy name
  int worker_fd = -1;
  std::string worker_trace;
};

// Everything derived from the options, computed identically in the parent and the workers.
struct FinetunePlan {
  FinetuneOptions options;
  std::vector<Strategy> strategies;
  ComputeMode compute = ComputeMode::kModeled;
  GpuPreset gpu;
  ModelConfig full_model;
  ModelConfig model;  // scaled
  std::vector<TensorSpec> inventory;
  InventoryTotals totals;
  uint64_t parameters = 0;
  uint64_t tokens = 0;  // seq * batch per step
  // The factor by which the parameter count shrank (scaled / full): DeepSpeed's element-count
  // defaults (sub_group_size, buffer_size) shrink by it so that its buffers keep their full-size
  // proportion to the model.
  double parameter_factor = 1.0;
  uint64_t strata_pinned_budget = 0;
  uint64_t device_budget = 0;
  uint64_t nvme_capacity = 0;  // per worker's swap file
  // DeepSpeed's settings at this scale and the ZeRO-Infinity plan they give.
  sched::ZeroInfinityOptions zero_options;
  sched::MemoryPlan zero_plan;
};

// Checks every option (a clear message for each bad one) and derives the plan.
Result<FinetunePlan> make_plan(const FinetuneOptions& options);

// The worker's command line (after the program name): the same experiment, one strategy.
std::vector<std::string> worker_arguments(const FinetuneOptions& options, Strategy strategy, int fd,
                                          const std::string& trace_path);

// Bytes per parameter element the optimizer holds while it updates a tensor: the bf16 gradient,
// the fp32 master, m and v, and the new bf16 weights.
inline constexpr uint64_t kOptimizerBytesPerElement = 2 + 4 + 4 + 4 + 2;

// Strata's pinned budget unless --pinned-budget says otherwise: room for the optimizer working
// set of the largest tensor four times over. The optimizer streams tensor by tensor; with this
// room the next tensors' states are read while the last ones' are written back, and part of the
// gradients backward produces can wait in pinned memory for the optimizer instead of making a
// round trip to NVMe. (Twice the working set is the least that keeps the optimizer pipelined;
// docs/results.md has the step time against the budget.)
uint64_t default_strata_pinned_budget(uint64_t largest_parameter_elements);

// Seconds of modelled compute for `parameters` over `tokens` at the preset's bf16 rate x MFU:
// 2 FLOPs per parameter and token forward, 4 backward.
double modeled_seconds(const FinetunePlan& plan, uint64_t parameters, bool backward);

}  // namespace strata::bench::finetune
