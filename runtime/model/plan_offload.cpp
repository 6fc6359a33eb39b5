#include "model/plan_offload.h"

#include <algorithm>
#include <utility>

#include "common/align.h"

namespace strata {
namespace {

constexpr double kGB = 1e9;  // rates are decimal GB/s, as datasheets give them

double seconds(uint64_t bytes, double gbps) {
  return bytes == 0 ? 0.0 : static_cast<double>(bytes) / (gbps * kGB);
}

// Names the slowest of overlapped stages; the first listed wins ties.
std::pair<double, std::string> slowest(
    std::initializer_list<std::pair<double, const char*>> stages) {
  std::pair<double, std::string> best{-1.0, ""};
  for (const auto& [s, name] : stages) {
    if (s > best.first) best = {s, name};
  }
  return best;
}

// Traffic every policy shares: weights fetched twice per micro-batch (forward, then backward,
// whose recomputation under checkpointing reuses the same fetch), gradients sent back once per
// micro-batch. Weights resident on the GPU only receive the optimizer's update once per step.
void common_pcie(const OffloadJob& job, OffloadEstimate& e) {
  const uint64_t trainable_grad_bytes = job.trainable_params * job.param_bytes;
  uint64_t h2d = 0;
  uint64_t d2h = 0;
  if (job.params_resident_on_gpu) {
    if (job.optimizer_on_host) h2d = trainable_grad_bytes;  // updated weights
  } else {
    h2d = 2 * job.grad_accum * job.weight_bytes;
  }
  if (job.optimizer_on_host) d2h = job.grad_accum * trainable_grad_bytes;
  // ZeRO-style partitioning: each GPU moves its share over its own link.
  e.pcie_h2d_bytes = h2d / job.gpus;
  e.pcie_d2h_bytes = d2h / job.gpus;
  // PCIe is full duplex: the two directions overlap.
  e.pcie_seconds =
      std::max(seconds(e.pcie_h2d_bytes, job.pcie_gbps), seconds(e.pcie_d2h_bytes, job.pcie_gbps));
}

uint64_t optimizer_state_bytes_per_param(const OffloadJob& job) {
  // fp32 master (unless the weights are fp32 already), Adam m and v.
  return (job.param_bytes == 4 ? 0 : 4) + 8;
}

}  // namespace

uint64_t zero_largest_sub_group(const std::vector<uint64_t>& tensor_elements,
                                uint64_t sub_group_elements) {
  uint64_t largest = 0;
  uint64_t current = 0;
  for (uint64_t n : tensor_elements) {
    current += n;
    if (current >= sub_group_elements) {
      largest = std::max(largest, current);
      current = 0;
    }
  }
  return std::max(largest, current);
}

OffloadEstimate estimate_cpu_offload(const OffloadJob& job) {
  OffloadEstimate e;
  e.compute_seconds = job.compute_seconds;
  common_pcie(job, e);
  auto add = [&](const char* what, uint64_t bytes) {
    if (bytes == 0) return;
    bytes = align_up(bytes, kPageSize);
    e.host_breakdown.push_back({what, bytes});
    e.host_bytes += bytes;
  };
  if (!job.params_resident_on_gpu) add("weights", job.weight_bytes);
  if (job.optimizer_on_host) {
    add("gradients", job.trainable_params * job.param_bytes);
    add("optimizer states", job.trainable_params * optimizer_state_bytes_per_param(job));
    e.cpu_optimizer_seconds = static_cast<double>(job.trainable_params) / job.adam_params_per_s;
  }
  e.gradients_on_host = job.optimizer_on_host;
  e.host_gradient_bytes = job.optimizer_on_host ? job.trainable_params * job.param_bytes : 0;
  e.working_set_bytes = e.host_bytes;
  auto [step, name] = slowest({{e.compute_seconds, "compute"},
                               {e.pcie_seconds, "pcie"},
                               {e.cpu_optimizer_seconds, "cpu-optimizer"}});
  e.step_seconds = step;
  e.bottleneck = name;
  return e;
}

OffloadEstimate estimate_nvme_offload(const OffloadJob& job) {
  OffloadEstimate e;
  e.compute_seconds = job.compute_seconds;
  common_pcie(job, e);
  const uint64_t b = job.param_bytes;
  const uint64_t opt_bpp = optimizer_state_bytes_per_param(job);

  // Host working set: exact-size buffers (page-rounded), sized by the shapes that occur.
  auto add = [&](const char* what, uint64_t bytes) {
    if (bytes == 0) return;
    bytes = align_up(bytes, kPageSize);
    e.host_breakdown.push_back({what, bytes});
    e.host_bytes += bytes;
  };
  if (!job.params_resident_on_gpu) {
    add("weight staging (layers in flight)", kParamUnitsInFlight * job.largest_unit_weight_bytes);
  }
  uint64_t largest_trainable = 0;
  for (uint64_t n : job.trainable_tensor_elements)
    largest_trainable = std::max(largest_trainable, n);
  if (job.optimizer_on_host) {
    add("gradient staging (layers in flight)",
        kGradUnitsInFlight * job.largest_unit_trainable_params * b);
    // Per tensor in flight: master/m/v read from NVMe, its gradient, the new low-precision weight.
    add("optimizer tensors in flight",
        kOptimizerTensorsInFlight * largest_trainable * (opt_bpp + 2 * b));
  }
  // The overflow check is fused into the gradient stream: no temporaries, no extra pass.

  // Gradients (accumulated over micro-batches) stay on the host as far as the user's RAM has
  // room, the rest on NVMe beside the optimizer states. They come before cached weights: a byte
  // of either saves 2 x grad_accum NVMe transfers per step, but half of the gradient's are writes,
  // which drives do more slowly.
  e.working_set_bytes = e.host_bytes;
  const uint64_t grad_bytes = job.optimizer_on_host ? job.trainable_params * b : 0;
  uint64_t host_grads = 0;
  if (grad_bytes > 0 && job.host_budget_bytes && *job.host_budget_bytes > e.host_bytes) {
    host_grads = std::min(grad_bytes, align_down(*job.host_budget_bytes - e.host_bytes, kPageSize));
    add(host_grads == grad_bytes ? "gradients (exact size)" : "gradients (part)", host_grads);
  }
  e.host_gradient_bytes = host_grads;
  e.gradients_on_host = grad_bytes > 0 && host_grads == grad_bytes;
  const uint64_t spilled_grads = grad_bytes - host_grads;

  // RAM still left over caches weights, sparing their NVMe reads (each weight is read twice per
  // micro-batch, so a cached byte saves as much traffic as a gradient byte kept on the host).
  uint64_t cached_weights = 0;
  if (!job.params_resident_on_gpu && job.host_budget_bytes &&
      *job.host_budget_bytes > e.host_bytes) {
    cached_weights =
        std::min(job.weight_bytes, align_down(*job.host_budget_bytes - e.host_bytes, kPageSize));
    add("weights cached in RAM", cached_weights);
  }
  e.cached_weight_bytes = cached_weights;

  // NVMe: weights, optimizer states, and gradients when not on the host.
  const uint64_t optimizer_bytes = job.optimizer_on_host ? job.trainable_params * opt_bpp : 0;
  e.nvme_bytes = job.weight_bytes + optimizer_bytes + spilled_grads;

  uint64_t reads = 0;
  uint64_t writes = 0;
  if (!job.params_resident_on_gpu)
    reads += 2 * job.grad_accum * (job.weight_bytes - cached_weights);
  if (job.optimizer_on_host) {
    reads += optimizer_bytes;
    writes += optimizer_bytes;
    if (!job.params_resident_on_gpu) writes += job.trainable_params * b;  // updated weights
    // Spilled gradients: micro-batch 1 writes them, 2..G read-accumulate-write, the optimizer
    // reads them once.
    writes += job.grad_accum * spilled_grads;
    reads += job.grad_accum * spilled_grads;
  }
  e.nvme_read_bytes = reads;
  e.nvme_write_bytes = writes;
  // Drives do not sustain their read and write peaks at once: the two add up.
  e.nvme_seconds = seconds(reads, job.nvme_read_gbps) + seconds(writes, job.nvme_write_gbps);
  if (job.optimizer_on_host) {
    e.cpu_optimizer_seconds = static_cast<double>(job.trainable_params) / job.adam_params_per_s;
  }

  // The scheduler overlaps all stages (prefetch during compute, optimizer per tensor as states
  // stream), so the slowest stage sets the pace.
  auto [step, name] = slowest({{e.compute_seconds, "compute"},
                               {e.pcie_seconds, "pcie"},
                               {e.nvme_seconds, "nvme"},
                               {e.cpu_optimizer_seconds, "cpu-optimizer"}});
  e.step_seconds = step;
  e.bottleneck = name;
  return e;
}

OffloadEstimate estimate_zero_infinity_offload(const OffloadJob& job) {
  OffloadEstimate e;
  e.compute_seconds = job.compute_seconds;
  common_pcie(job, e);
  const uint64_t b = job.param_bytes;
  const uint64_t opt_bpp = optimizer_state_bytes_per_param(job);

  // Every pinned allocation goes through PyTorch's caching host allocator: next power of two.
  uint64_t pinned = 0;
  auto pin = [&](const char* what, uint64_t bytes) {
    if (bytes == 0) return;
    bytes = next_power_of_two(bytes);
    e.host_breakdown.push_back({what, bytes});
    pinned += bytes;
  };
  if (!job.params_resident_on_gpu) {
    // buffer_count uniform slots, each >= the largest parameter, in one pinned block.
    const uint64_t slot = std::max(kZeroParamBufferElements, job.largest_weight_elements);
    pin("param swap buffers (5 uniform slots)", kZeroParamBufferCount * slot * b);
  }
  uint64_t cached_in_cpu = 0;
  uint64_t largest_sub_group = 0;
  if (job.optimizer_on_host) {
    // offload_param.max_in_cpu: trainable weights kept in a pinned flat buffer.
    if (!job.params_resident_on_gpu) {
      cached_in_cpu = std::min(kZeroMaxInCpuElements, job.trainable_params);
      pin("params kept in CPU (max_in_cpu)", cached_in_cpu * b);
    }
    largest_sub_group = zero_largest_sub_group(job.trainable_tensor_elements);
    for (uint64_t i = 0; i < kZeroOptimizerBufferCount; ++i) {
      pin("optimizer swap buffer (largest sub-group, fp32)", largest_sub_group * 4);
    }
    pin("param write-back buffer (largest sub-group)", largest_sub_group * b);
    pin("flat gradient buffer", job.trainable_params * b);
  }
  // Transients on top of the pinned set: the overflow check's per-element temporaries during a
  // step (bool, plus an fp32 upcast under fp16 loss scaling), and at startup the unpinned
  // original of the largest buffer, alive while it is copied into pinned memory.
  const uint64_t overflow_temp =
      job.optimizer_on_host ? job.trainable_params * (1 + (job.fp16_loss_scaling ? 4 : 0)) : 0;
  const uint64_t startup_copy = job.optimizer_on_host ? job.trainable_params * b : 0;
  e.host_bytes = pinned + std::max(overflow_temp, startup_copy);
  e.working_set_bytes = e.host_bytes;  // fixed by its defaults: it cannot run in less
  e.gradients_on_host = job.optimizer_on_host;
  e.host_gradient_bytes = job.optimizer_on_host ? job.trainable_params * b : 0;
  if (overflow_temp >= startup_copy && overflow_temp > 0) {
    e.host_breakdown.push_back({"overflow-check temporaries", overflow_temp});
  } else if (startup_copy > 0) {
    e.host_breakdown.push_back({"startup double copy (unpinned original)", startup_copy});
  }

  const uint64_t optimizer_bytes = job.optimizer_on_host ? job.trainable_params * opt_bpp : 0;
  e.nvme_bytes = job.weight_bytes + optimizer_bytes;

  // Forward/backward: weights not cached in CPU stream from NVMe.
  uint64_t fwd_bwd_reads = 0;
  if (!job.params_resident_on_gpu) {
    const double uncached = job.params == 0 ? 0.0
                                            : 1.0 - static_cast<double>(cached_in_cpu) /
                                                        static_cast<double>(job.params);
    fwd_bwd_reads = static_cast<uint64_t>(2.0 * job.grad_accum * job.weight_bytes * uncached);
  }
  const uint64_t opt_reads = optimizer_bytes;
  const uint64_t opt_writes =
      optimizer_bytes + (job.params_resident_on_gpu ? 0 : job.trainable_params * b);
  e.nvme_read_bytes = fwd_bwd_reads + opt_reads;
  e.nvme_write_bytes = opt_writes;
  const double fwd_bwd_nvme = seconds(fwd_bwd_reads, job.nvme_read_gbps);
  const double opt_nvme =
      seconds(opt_reads, job.nvme_read_gbps) + seconds(opt_writes, job.nvme_write_gbps);
  e.nvme_seconds = fwd_bwd_nvme + opt_nvme;
  if (job.optimizer_on_host) {
    e.cpu_optimizer_seconds = static_cast<double>(job.trainable_params) / job.adam_params_per_s;
    // isinf(grads).any() then isnan(grads).any(): two passes, each reading the gradients and
    // writing a one-byte-per-element temporary.
    e.serial_seconds = seconds(2 * job.trainable_params * (b + 1), job.host_scan_gbps);
  }

  // Three phases run one after another: forward/backward (compute, PCIe and parameter swaps
  // overlap), the sub-group optimizer step (swaps and CPU Adam pipelined), the overflow check.
  auto [fwd_bwd, fwd_bwd_name] =
      slowest({{e.compute_seconds, "compute"}, {e.pcie_seconds, "pcie"}, {fwd_bwd_nvme, "nvme"}});
  auto [opt, opt_name] = slowest({{opt_nvme, "nvme"}, {e.cpu_optimizer_seconds, "cpu-optimizer"}});
  e.step_seconds = fwd_bwd + opt + e.serial_seconds;
  auto [_, overall] = slowest({{fwd_bwd, fwd_bwd_name.c_str()},
                               {opt, opt_name.c_str()},
                               {e.serial_seconds, "overflow-check"}});
  e.bottleneck = overall;
  return e;
}

}  // namespace strata
