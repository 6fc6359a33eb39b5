// DeepSpeed ZeRO-3 NVMe offload (ZeRO-Infinity) of a planned job, in the labelled configurations
// `strata bench finetune` runs (deepspeed_config.h), from the same records the benchmark's
// baseline worker allocates and issues: host memory buffer by buffer (deepspeed_buffers.h), NVMe
// bytes per step request by request, and a step time from those bytes, DeepSpeed's serial phases
// and the job's rates. Closed form, not simulated: DeepSpeed does not run Strata's scheduler, and
// its step is a fixed list of synchronous phases (docs/planner.md, "Strata vs DeepSpeed").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/deepspeed_buffers.h"
#include "model/deepspeed_config.h"
#include "model/plan_offload.h"

namespace strata {

// What one optimizer step of DeepSpeed moves to and from NVMe, as the baseline worker issues it:
// every request io-aligned (deepspeed::io_aligned_elements), `micro_batches` forward/backward
// passes and one optimizer pass.
struct DeepSpeedStepIo {
  // Each micro-batch fetches every swapped bf16 partition for forward and again for backward,
  // except those kept on the GPU in between (DeepSpeedLayout::kept_for_backward).
  uint64_t parameter_reads = 0;
  // The fp32 gradient slices of swapped sub-groups, written once, at the accumulation boundary:
  // earlier micro-batches accumulate into the flat host buffer (stage3.py:1481-1526).
  uint64_t gradient_writes = 0;
  // Per swapped sub-group: master, exp_avg, exp_avg_sq read and written back, the gradient
  // slices read back (partitioned_optimizer_swapper.py:207-230), and the updated bf16 partitions
  // of its swapped parameters written (partitioned_param_swapper.py:404-425).
  uint64_t state_reads = 0;
  uint64_t gradient_reads = 0;
  uint64_t state_writes = 0;
  uint64_t parameter_writes = 0;
  uint64_t read() const { return parameter_reads + state_reads + gradient_reads; }
  uint64_t written() const { return gradient_writes + state_writes + parameter_writes; }
};
DeepSpeedStepIo deepspeed_step_io(const deepspeed::DeepSpeedConfig& config,
                                  const deepspeed::DeepSpeedLayout& layout,
                                  const std::vector<TensorSpec>& inventory, uint32_t micro_batches);

struct DeepSpeedEstimate {
  std::string name;          // deepspeed-defaults | deepspeed-pinned | deepspeed-tuned
  double knob_factor = 1.0;  // DeepSpeed's element-count knobs were multiplied by this
  // model "analytic"; host_bytes: the peak over the whole run (start-up copies included: the RAM
  // DeepSpeed needs), step_seconds and NVMe bytes per optimizer step, pinned_budget_bytes and
  // peak_pinned_bytes: the pinned buffers.
  OffloadEstimate offload;
  uint64_t host_bytes_steps = 0;  // the peak over the steps alone
  std::string host_moment;        // what sets the run's peak
  DeepSpeedStepIo io;
  std::vector<deepspeed::BufferSpec> buffers;
};

// The job's trainable tensors under configuration `name`, its element-count knobs scaled by
// `knob_factor` (1 at full size; the scaled model's parameters over the full model's, as
// `strata bench finetune` scales them). Full fine-tuning only (job.optimizer_on_host): the
// labelled configurations train every parameter. Step time, by DeepSpeed's phases:
// - forward and backward: max(compute, parameter reads / read rate + gradient writes / write
//   rate): prefetch overlaps reads with compute, gradient writes are asynchronous, and the
//   drive serves one direction at a time;
// - optimizer: sub-group by sub-group, reads, wait, the clipping pass, Adam and the 16-bit
//   weight copy, writes, wait (stage3.py:2086-2135): disk time + CPU time; pipelined (tuned)
//   overlaps them (pipelined_optimizer_swapper.py:102-158): max(disk time, CPU time).
// CPU time is trainable / adam_params_per_s plus the clipping pass (grad.mul_, 8 bytes an
// element) and the weight copy (copy_, 8 bytes an element), each at host_scan_gbps. Bad names
// and factors are STRATA_E_INVALID.
Result<DeepSpeedEstimate> estimate_deepspeed_offload(const OffloadJob& job, const std::string& name,
                                                     double knob_factor);

}  // namespace strata
