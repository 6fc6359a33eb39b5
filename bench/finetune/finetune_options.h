// `strata bench finetune`: what the user asked for, the defaults that make the README's main
// command finish in about five minutes on a 2-core machine, and everything derived from them
// that both the parent process and the per-strategy worker processes need to agree on (the scaled
// model, its inventory, the budgets, ZeRO-Infinity's DeepSpeed-sized buffers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/deepspeed_buffers.h"
#include "model/deepspeed_config.h"
#include "model/gpu_presets.h"
#include "model/inventory.h"
#include "model/model_config.h"
#include "model/plan.h"

namespace strata::bench::finetune {

// DeepSpeed's configurations, layout and buffers are the runtime's (model/deepspeed_*.h), shared
// with `strata plan`: the benchmark runs exactly what the planner predicts.
using deepspeed::buffer_peaks;
using deepspeed::BufferLife;
using deepspeed::BufferPeaks;
using deepspeed::BufferRole;
using deepspeed::BufferSpec;
using deepspeed::deepspeed_buffers;
using deepspeed::deepspeed_layout;
using deepspeed::DeepSpeedConfig;
using deepspeed::DeepSpeedLayout;
using deepspeed::io_aligned_elements;
using deepspeed::kAllBaselines;
using deepspeed::kDeepSpeedDefaults;
using deepspeed::kDeepSpeedPinned;
using deepspeed::kDeepSpeedTuned;
using deepspeed::labelled_config;
using deepspeed::parse_baselines;
using deepspeed::parse_precision;
using deepspeed::Precision;
using deepspeed::SubGroup;

// Who this benchmark runs, each in its own worker process: Strata (with its optimizer after the
// whole backward, the headline, and with it overlapped with backward, reported on its own line)
// and the labelled DeepSpeed ZeRO-3 configurations (deepspeed_config.h).
enum class ContenderKind : uint8_t { kStrata = 0, kDeepSpeed = 1 };
inline constexpr const char* kStrataName = "strata";
inline constexpr const char* kStrataOverlapName = "strata-overlap";

struct Contender {
  size_t index = 0;  // in FinetunePlan::contenders
  std::string name;  // strata | strata-overlap | deepspeed-defaults | ...
  ContenderKind kind = ContenderKind::kStrata;
  bool optimizer_overlap = false;  // Strata: each unit's update right after its backward
  // DeepSpeed: its configuration at this scale, the layout and the buffers it gives.
  DeepSpeedConfig deepspeed;
  DeepSpeedLayout layout;
  std::vector<BufferSpec> buffers;
};

// How a layer's forward / backward compute is produced.
enum class ComputeMode : uint8_t { kModeled = 0, kCpu = 1, kGpu = 2 };
const char* to_string(ComputeMode mode);
Result<ComputeMode> parse_compute_mode(const std::string& name);

// Defaults of the README's main command (`--model llama-2-70b --strategy both`): a llama-2-70b
// shape narrowed to a quarter of its width and cut to 6 of its 80 layers (354M parameters,
// 5.7 GB of model states per worker on NVMe), 3 steps (five workers: Strata twice, DeepSpeed in
// three configurations, in about six minutes). docs/results.md explains each choice.
inline constexpr double kDefaultScale = 0.25;
inline constexpr int kDefaultLayers = 6;
inline constexpr uint32_t kDefaultSteps = 3;
inline constexpr uint32_t kDefaultSeq = 4096;
// 8 sequences: this machine's disk (~0.9 GB/s) is ~8x slower than one Gen4 NVMe drive (7 GB/s),
// so 8x the tokens of a seq-4096 batch-1 fine-tune keep compute : NVMe time per parameter what
// it is for that job on the modelled H100 (compute ~7% of the parameter streaming time).
inline constexpr uint32_t kDefaultBatch = 8;
inline constexpr double kDefaultMfu = 0.4;
inline constexpr const char* kDefaultGpu = "h100-sxm";

// LoRA's defaults: rank 16 on every linear layer of the transformer (QLoRA's "all-linear").
inline constexpr uint32_t kDefaultLoraRank = 16;
inline constexpr uint32_t kMaxLoraRank = 1024;

struct FinetuneOptions {
  std::string model;
  // full: every weight trained (the main job); lora / qlora: the base frozen and streamed
  // read-only from NVMe (qlora: stored in NF4), rank-r adapters trained. Strata alone: no
  // DeepSpeed baseline is modelled for a frozen base.
  std::string method = "full";
  uint32_t lora_rank = kDefaultLoraRank;
  std::string lora_targets = "all-linear";
  double scale = kDefaultScale;
  int layers = kDefaultLayers;
  uint32_t seq = kDefaultSeq;
  uint32_t batch = kDefaultBatch;
  std::string strategy;                   // strata | deepspeed | both; "": both (full), strata
  std::string baselines = kAllBaselines;  // the DeepSpeed configurations run
  std::string precision = "bf16";         // bf16 | fp16
  double max_grad_norm = 1.0;             // global gradient clipping, both sides; 0: off
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
  std::string pinned_budget;  // "" or "auto": automatic, sized by the runtime from the drive
  // Comma-separated pinned budgets: Strata alone (optimizer after backward) at each of them and
  // at the default, host peak against step time. Empty: no sweep.
  std::string sweep_pinned;
  std::string device_budget;  // "" : automatic
  // Strata: step each layer's parameters as soon as its backward is done (LoHan / Fuyou), or
  // after the whole backward (the same order, clipping and skip rules as DeepSpeed: the
  // headline), or both (each its own worker).
  std::string optimizer_overlap = "both";
  // Hidden: set by the parent when it starts a worker process.
  std::string worker;  // contender name
  int worker_fd = -1;
  std::string worker_trace;
};

// What the training loop does with a tensor of the inventory (--method lora|qlora).
enum class TensorRole : uint8_t {
  kTrained = 0,    // a parameter with a gradient under the optimizer, or one of its states
  kFrozen = 1,     // a base weight: read-only, no gradient, no optimizer state
  kFrozenNf4 = 2,  // the same, stored in NF4 (strata_nf4_packed_bytes), dequantized to compute
};

// Everything derived from the options, computed identically in the parent and the workers.
struct FinetunePlan {
  FinetuneOptions options;
  FinetuneMethod method = FinetuneMethod::kFull;
  std::vector<Contender> contenders;
  Precision precision = Precision::kBf16;
  ComputeMode compute = ComputeMode::kModeled;
  GpuPreset gpu;
  ModelConfig full_model;
  ModelConfig model;  // scaled
  // Full fine-tuning: build_inventory's. LoRA: the base parameters, each targeted linear weight
  // followed by its adapters "NAME.lora_A" [r, in] and "NAME.lora_B" [out, r] with their
  // gradients, as trained parameters.
  std::vector<TensorSpec> inventory;
  std::vector<TensorRole> roles;     // per inventory tensor
  uint64_t frozen_stored_bytes = 0;  // LoRA: the base as stored on NVMe (NF4 for qlora)
  uint64_t adapter_parameters = 0;   // LoRA: elements of every adapter
  InventoryTotals totals;
  uint64_t parameters = 0;
  uint64_t tokens = 0;  // seq * batch per step
  // The factor by which the parameter count shrank (scaled / full): DeepSpeed's element-count
  // knobs (sub_group_size, buffer_size, max_in_cpu, prefetch and persistence thresholds, live
  // parameters, reuse distance) shrink by it, so that its buffers keep their full-size
  // proportion to the model (deepspeed_config.h).
  double parameter_factor = 1.0;
  uint64_t strata_pinned_budget = 0;  // 0: automatic (strata_config.pinned_budget_bytes 0)
  uint64_t device_budget = 0;
  uint64_t nvme_capacity = 0;  // per worker's swap file
};

// The bytes a tensor of the inventory takes in Strata: its own, or its NF4 packing.
uint64_t stored_bytes(const FinetunePlan& plan, size_t tensor);

// Checks every option (a clear message for each bad one) and derives the plan.
Result<FinetunePlan> make_plan(const FinetuneOptions& options);

// The worker's command line (after the program name): the same experiment, one strategy.
std::vector<std::string> worker_arguments(const FinetuneOptions& options,
                                          const Contender& contender, int fd,
                                          const std::string& trace_path);
const Contender* find_contender(const FinetunePlan& plan, const std::string& name);

// Seconds of modelled compute for `flops` at the preset's bf16 rate x MFU.
double modeled_seconds(const FinetunePlan& plan, double flops);

}  // namespace strata::bench::finetune
