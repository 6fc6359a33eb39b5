#include "model/plan_deepspeed.h"

#include <algorithm>

namespace strata {
namespace {

constexpr uint32_t kModelBytes = 2;  // bf16 and fp16 alike
constexpr uint32_t kFp32Bytes = 4;
constexpr double kGB = 1e9;
// unscale_and_clip_grads' grad.mul_ (stage3.py:2178-2187): reads and writes each fp32 element.
constexpr double kClipPassBytesPerElement = 8;
// _reassign_or_swap_out_partitioned_parameters' fp16_flat.copy_(fp32_flat) (stage3.py:2071-2072,
// or the same copy into a swap buffer: stage3.py:1008, swap_tensor/utils.py:52), a pass of its
// own after Adam: reads the fp32 master (4 bytes) and writes the 16-bit weight (2) through the
// cache, which first reads each destination line for ownership (2). Measured beside the clipping
// pass with DeepSpeed's own step (bench/deepspeed/zero3-step-compare.sh, 50M, 2 threads): 9.5 ms
// against its 7.7, both at the memory's rate (docs/optimizer.md).
constexpr double kWeightCopyBytesPerElement = 8;

double seconds(uint64_t bytes, double gbps) {
  return bytes == 0 ? 0.0 : static_cast<double>(bytes) / (gbps * kGB);
}

}  // namespace

DeepSpeedStepIo deepspeed_step_io(const deepspeed::DeepSpeedConfig& config,
                                  const deepspeed::DeepSpeedLayout& layout,
                                  const std::vector<TensorSpec>& inventory,
                                  uint32_t micro_batches) {
  DeepSpeedStepIo io;
  const auto aligned = [&](uint64_t n, uint32_t bytes) {
    return deepspeed::io_aligned_elements(config, n, bytes) * bytes;
  };
  for (size_t p = 0; p < layout.params.size(); ++p) {
    if (!layout.swapped[p]) continue;  // in CPU memory: no file
    const uint64_t file = aligned(inventory[layout.params[p]].elements(), kModelBytes);
    io.parameter_reads += uint64_t{micro_batches} * (layout.kept_for_backward[p] ? 1 : 2) * file;
    io.parameter_writes += file;
  }
  for (const deepspeed::SubGroup& g : layout.sub_groups) {
    if (!g.swapped_states) continue;  // its states and gradient stay in CPU memory
    const uint64_t state = aligned(g.elements, kFp32Bytes);
    io.state_reads += 3 * state;
    io.state_writes += 3 * state;
    for (size_t p : g.params) {
      const uint64_t slice = aligned(inventory[layout.params[p]].elements(), kFp32Bytes);
      io.gradient_writes += slice;
      io.gradient_reads += slice;
    }
  }
  return io;
}

Result<DeepSpeedEstimate> estimate_deepspeed_offload(const OffloadJob& job, const std::string& name,
                                                     double knob_factor) {
  if (!job.optimizer_on_host) {
    return unsupported(
        "the labelled DeepSpeed configurations train every parameter (full "
        "fine-tuning)");
  }
  if (job.param_bytes != kModelBytes) {
    return unsupported("the labelled DeepSpeed configurations model bf16 or fp16 weights");
  }
  STRATA_ASSIGN_OR_RETURN(deepspeed::DeepSpeedConfig config,
                          deepspeed::labelled_config(name, job.inventory, knob_factor));
  STRATA_ASSIGN_OR_RETURN(deepspeed::DeepSpeedLayout layout,
                          deepspeed::deepspeed_layout(config, job.inventory), name);

  DeepSpeedEstimate d;
  d.name = name;
  d.knob_factor = knob_factor;
  d.buffers = deepspeed::deepspeed_buffers(
      config, layout, job.inventory,
      job.fp16_loss_scaling ? deepspeed::Precision::kFp16 : deepspeed::Precision::kBf16);
  const deepspeed::BufferPeaks peaks = deepspeed::buffer_peaks(d.buffers);
  d.host_bytes_steps = peaks.steps;
  d.host_moment = peaks.run_moment;
  const uint32_t passes = std::max<uint32_t>(job.grad_accum, 1);
  d.io = deepspeed_step_io(config, layout, job.inventory, passes);

  OffloadEstimate& e = d.offload;
  e.policy = name;
  e.model = "analytic";
  e.host_bytes = peaks.run;
  for (const deepspeed::BufferSpec& b : d.buffers) {
    e.host_breakdown.push_back({b.name, b.held_bytes()});
    if (b.pinned) e.peak_pinned_bytes += b.held_bytes();
  }
  e.pinned_budget_bytes = e.peak_pinned_bytes;
  // Its files: each swapped partition, each swapped sub-group's three states and gradient slices,
  // exactly what one step writes.
  e.nvme_bytes = deepspeed_step_io(config, layout, job.inventory, 1).written();
  e.nvme_read_bytes = d.io.read();
  e.nvme_write_bytes = d.io.written();
  // One rank: each fetch copies the partition to the GPU, each backward its gradient back.
  for (size_t p = 0; p < layout.params.size(); ++p) {
    const uint64_t bytes = job.inventory[layout.params[p]].elements() * kModelBytes;
    e.pcie_h2d_bytes += uint64_t{passes} * (layout.kept_for_backward[p] ? 1 : 2) * bytes;
    e.pcie_d2h_bytes += uint64_t{passes} * bytes;
  }
  e.pcie_seconds =
      std::max(seconds(e.pcie_h2d_bytes, job.pcie_gbps), seconds(e.pcie_d2h_bytes, job.pcie_gbps));
  e.compute_seconds = job.compute_seconds;
  const double read_rate = job.nvme_read_gbps, write_rate = job.nvme_write_gbps;
  const double disk_passes =
      seconds(d.io.parameter_reads, read_rate) + seconds(d.io.gradient_writes, write_rate);
  const double disk_optimizer = seconds(d.io.state_reads + d.io.gradient_reads, read_rate) +
                                seconds(d.io.state_writes + d.io.parameter_writes, write_rate);
  const double cpu = static_cast<double>(layout.total_elements) / job.adam_params_per_s +
                     static_cast<double>(layout.total_elements) *
                         (kClipPassBytesPerElement + kWeightCopyBytesPerElement) /
                         (job.host_scan_gbps * kGB);
  const bool pipelined = config.pipeline_read || config.pipeline_write;
  const double passes_time = std::max(job.compute_seconds, disk_passes);
  const double optimizer_time = pipelined ? std::max(disk_optimizer, cpu) : disk_optimizer + cpu;
  e.nvme_seconds = disk_passes + disk_optimizer;
  e.cpu_optimizer_seconds = cpu;
  e.step_seconds = passes_time + optimizer_time;
  // The GPU waits for everything but its own compute.
  e.stall_seconds = std::max(0.0, e.step_seconds - job.compute_seconds);
  // The busiest resource; the drive counts once for both directions, named after the busier.
  e.bottleneck = seconds(d.io.written(), write_rate) > seconds(d.io.read(), read_rate)
                     ? "nvme-write"
                     : "nvme-read";
  double top = e.nvme_seconds;
  if (e.compute_seconds > top) {
    top = e.compute_seconds;
    e.bottleneck = "compute";
  }
  if (cpu > top) e.bottleneck = "cpu-optimizer";
  return d;
}

}  // namespace strata
