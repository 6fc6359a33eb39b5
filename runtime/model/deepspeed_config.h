// The DeepSpeed ZeRO-3 NVMe-offload configurations Strata is compared with, by `strata bench
// finetune` (which runs them) and `strata plan` (which predicts them), each a labelled set of
// DeepSpeed's own knobs (version 0.16.5, commit 38327e07f; every default
// below cites the DeepSpeed file and line that sets it), and the layout those knobs give a model:
// which parameters are swapped, how parameters fall into optimizer sub-groups, which sub-groups
// stay in CPU memory. The buffers (deepspeed_buffers.h), the benchmark's baseline worker
// (bench/finetune/deepspeed_worker.cpp) and the planner's estimate (plan_deepspeed.h) are all
// derived from this one record, so a knob changes everything it changes in DeepSpeed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "sched/deepspeed_defaults.h"
#include "vocabulary/tensor_spec.h"

namespace strata::deepspeed {

// The training precision of the compared job. bf16 (the default) runs no overflow check in
// DeepSpeed since v0.11.2 (stage3.py:2034, `if self.dtype == torch.float16`); fp16 adds the
// isinf / isnan passes and their one-byte temporaries (stage3.py:2208-2218).
enum class Precision : uint8_t { kBf16 = 0, kFp16 = 1 };
const char* to_string(Precision precision);
Result<Precision> parse_precision(const std::string& name);

struct DeepSpeedConfig {
  std::string name;  // deepspeed-defaults | deepspeed-pinned | deepspeed-tuned
  // offload_param (zero/offload_config.py:33-45).
  uint32_t param_buffer_count = kParamBufferCount;
  uint64_t param_buffer_elements = kParamBufferElements;
  uint64_t max_in_cpu = 1'000'000'000;
  bool param_pin_memory = false;
  // offload_optimizer (zero/offload_config.py:64-84).
  uint32_t optimizer_buffer_count = kOptimizerBufferCount;
  bool optimizer_pin_memory = false;
  bool pipeline_read = false;
  bool pipeline_write = false;
  // zero_optimization (zero/config.py:168-237).
  uint64_t sub_group_elements = kSubGroupElements;
  uint64_t prefetch_bucket_elements = 50'000'000;
  uint64_t param_persistence_threshold = 100'000;
  uint64_t max_live_parameters = 1'000'000'000;
  uint64_t max_reuse_distance = 1'000'000'000;
  // aio (swap_tensor/constants.py:20-28).
  uint32_t aio_block_bytes = 1u << 20;
  uint32_t aio_queue_depth = 8;
  uint32_t aio_intra_op_parallelism = 1;
  // Hugging Face's Trainer passes max_grad_norm = 1.0 as DeepSpeed's gradient_clipping.
  double gradient_clipping = 1.0;
};

// The three labelled configurations (docs/results.md, "The baselines"):
inline constexpr const char* kDeepSpeedDefaults = "deepspeed-defaults";
inline constexpr const char* kDeepSpeedPinned = "deepspeed-pinned";
inline constexpr const char* kDeepSpeedTuned = "deepspeed-tuned";
inline constexpr const char* kAllBaselines = "deepspeed-defaults,deepspeed-pinned,deepspeed-tuned";

// One optimizer sub-group: consecutive trainable parameters, taken in order until the group
// reaches sub_group_size (stage3.py:943-966), so the largest can exceed it.
struct SubGroup {
  std::vector<size_t> params;  // indices into DeepSpeedLayout::params
  uint64_t elements = 0;
  bool in_cpu = false;  // its bf16 partition lives in the max_in_cpu flat buffer, not on NVMe
  // Its fp32 master, states and gradient go through NVMe: at least max(1 MiB, block_size)
  // bytes of fp32 (optimizer_utils.py swappable_tensor, stage3.py:990-995); else they stay in
  // CPU memory.
  bool swapped_states = true;
  uint64_t host_offset = 0;  // unswapped: its place in the host optimizer block, elements
};

struct DeepSpeedLayout {
  std::vector<size_t> params;     // inventory indices of the trainable parameters, model order
  std::vector<bool> swapped;      // per param: its bf16 partition is swapped to NVMe
  std::vector<bool> persistent;   // per param: below param_persistence_threshold, kept on GPU
  std::vector<size_t> sub_group;  // per param: its sub-group
  // Per param: fetched once per micro-batch, not twice: its backward use comes within
  // max_reuse_distance elements of fetches after its forward one, so it stays on the GPU
  // (partitioned_param_coordinator.py:543-553, __params_to_release).
  // Only the last unit's parameters (the tensors after the layers) can be: every other unit's
  // device memory is reused by the units after it.
  std::vector<bool> kept_for_backward;
  std::vector<SubGroup> sub_groups;
  uint64_t largest_param = 0;      // elements
  uint64_t largest_sub_group = 0;  // elements: what every optimizer swap buffer holds
  // The same with each parameter's gradient slice io-aligned, as the slices are read into it.
  uint64_t largest_sub_group_swap_elements = 0;
  uint64_t total_elements = 0;
  uint64_t cpu_flat_elements = 0;    // the max_in_cpu flat buffer (stage3.py:678-701)
  uint64_t host_state_elements = 0;  // the unswapped sub-groups' elements
};

// `name` at this scale: DeepSpeed's element-count knobs multiplied by `parameter_factor` (the
// scaled model's parameters / the full model's), so that every buffer keeps its full-size
// proportion to the model; buffer_size then raised just above the largest parameter, as
// partitioned_param_swapper.py's assert makes users do. Tuned: sub-groups of one parameter,
// max_in_cpu 0, pipelined optimizer swaps with the 12 buffers they need, ds_nvme_tune's
// queue depth 32.
Result<DeepSpeedConfig> labelled_config(const std::string& name,
                                        const std::vector<TensorSpec>& inventory,
                                        double parameter_factor);
// "a,b,c" -> names, each checked.
Result<std::vector<std::string>> parse_baselines(const std::string& list);

Result<DeepSpeedLayout> deepspeed_layout(const DeepSpeedConfig& config,
                                         const std::vector<TensorSpec>& inventory);

// DeepSpeed's I/O alignment (swap_tensor/utils.py:16, AIO_ALIGNED_BYTES x intra_op_parallelism)
// rounded up to O_DIRECT's 4 KiB: the elements one swap file or buffer slot holds for `n`.
uint64_t io_aligned_elements(const DeepSpeedConfig& config, uint64_t n, uint32_t element_bytes);

}  // namespace strata::deepspeed
