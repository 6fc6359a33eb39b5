#include "model/deepspeed_buffers.h"

#include <algorithm>
#include <bit>

namespace strata::deepspeed {
namespace {

constexpr uint32_t kModelDtypeBytes = 2;  // bf16 and fp16 alike
constexpr uint32_t kFp32Bytes = 4;

BufferSpec make(BufferRole role, std::string name, uint32_t count, uint64_t bytes, bool pinned,
                bool zero_source, BufferLife life, std::string when, std::string source) {
  BufferSpec b;
  b.role = role;
  b.name = std::move(name);
  b.count = count;
  b.each_bytes = bytes;
  b.each_held = pinned ? caching_host_allocator_size(bytes) : bytes;
  b.pinned = pinned;
  b.zero_source = zero_source;
  b.life = life;
  b.when = std::move(when);
  b.source = std::move(source);
  return b;
}

}  // namespace

const char* to_string(BufferLife life) {
  switch (life) {
    case BufferLife::kRun:
      return "run";
    case BufferLife::kStartup:
      return "startup";
    case BufferLife::kStep:
      return "step";
  }
  return "?";
}

uint64_t caching_host_allocator_size(uint64_t bytes) {
  return std::bit_ceil(bytes);
}

std::vector<BufferSpec> deepspeed_buffers(const DeepSpeedConfig& c, const DeepSpeedLayout& layout,
                                          const std::vector<TensorSpec>& inventory,
                                          Precision precision) {
  std::vector<BufferSpec> out;
  const bool any_swapped =
      std::find(layout.swapped.begin(), layout.swapped.end(), true) != layout.swapped.end();
  // In DeepSpeed's allocation order: zero.Init partitions the parameters first, then the stage-3
  // optimizer builds its fp16 partitions (stage3.py:360), its swapper (366) and its fp32
  // partitions and gradient buffer (404 -> 518-551).
  uint64_t small_bytes = 0;
  for (size_t p = 0; p < layout.params.size(); ++p) {
    const SubGroup& g = layout.sub_groups[layout.sub_group[p]];
    if (!layout.swapped[p] && !g.in_cpu) {
      small_bytes += inventory[layout.params[p]].elements() * kModelDtypeBytes;
    }
  }
  if (small_bytes > 0) {
    out.push_back(make(BufferRole::kUnswappedParameters, "unswapped parameter partitions", 1,
                       small_bytes, c.param_pin_memory, false, BufferLife::kRun, "zero.Init, held",
                       "partition_parameters.py:1609-1616; partitioned_param_swapper.py:100,144 "
                       "(under max(1 MiB, block_size) bytes)"));
  }
  if (any_swapped) {
    const uint64_t slot = io_aligned_elements(c, c.param_buffer_elements, kModelDtypeBytes);
    out.push_back(make(
        BufferRole::kParameterSwap, "parameter swap buffers (buffer_count x buffer_size)", 1,
        uint64_t{c.param_buffer_count} * slot * kModelDtypeBytes, true, false, BufferLife::kRun,
        "zero.Init, held", "partitioned_param_swapper.py:104-134 (pin_memory(torch.empty))"));
  }
  if (layout.cpu_flat_elements > 0) {
    out.push_back(make(BufferRole::kCpuFlatParameters, "max_in_cpu flat parameter buffer", 1,
                       layout.cpu_flat_elements * kModelDtypeBytes, true, false, BufferLife::kRun,
                       "optimizer init, held", "stage3.py:678-701 (pin_memory(torch.empty))"));
  }
  bool any_nvme_group = false;
  const SubGroup* largest_nvme = nullptr;
  for (const SubGroup& g : layout.sub_groups) {
    if (g.in_cpu) continue;
    any_nvme_group = true;
    if (largest_nvme == nullptr || g.elements > largest_nvme->elements) largest_nvme = &g;
  }
  if (any_nvme_group) {
    uint64_t elements = 0;
    for (size_t p : largest_nvme->params) {
      elements += io_aligned_elements(c, inventory[layout.params[p]].elements(), kModelDtypeBytes);
    }
    out.push_back(
        make(BufferRole::kWriteBack, "parameter write-back buffer (largest sub-group, model dtype)",
             1, elements * kModelDtypeBytes, true, true, BufferLife::kRun, "optimizer init, held",
             "stage3.py:776-784; partitioned_param_swapper.py:396-402 "
             "(pin_memory(torch.zeros))"));
  }
  out.push_back(make(BufferRole::kOptimizerSwap,
                     "optimizer swap buffers (buffer_count x largest sub-group, fp32)",
                     c.optimizer_buffer_count, layout.largest_sub_group_swap_elements * kFp32Bytes,
                     true, true, BufferLife::kRun, "optimizer init, held",
                     "swap_tensor/utils.py:182-189; optimizer_utils.py:137-141 "
                     "(pin_memory(torch.zeros) each)"));
  if (any_nvme_group) {
    out.push_back(make(BufferRole::kMasterSource, "fp32 master source of one sub-group", 1,
                       largest_nvme->elements * kFp32Bytes, false, false, BufferLife::kStartup,
                       "optimizer init, one sub-group at a time, freed after its swap-out",
                       "stage3.py:879-883 (torch.empty, filled from the bf16 partition)"));
  }
  if (layout.host_state_elements > 0) {
    out.push_back(make(BufferRole::kHostStates,
                       "unswapped sub-groups: fp32 master, exp_avg, exp_avg_sq, gradient", 1,
                       layout.host_state_elements * 4 * kFp32Bytes, false, false, BufferLife::kRun,
                       "optimizer init and first step, held",
                       "stage3.py:990-995, 1511-1515 (sub-groups under the minimum I/O size "
                       "stay in CPU memory)"));
  }
  out.push_back(make(BufferRole::kFlatGradients,
                     "flat gradient buffer (gradient accumulation dtype)", 1,
                     layout.total_elements * kModelDtypeBytes, c.optimizer_pin_memory,
                     c.optimizer_pin_memory, BufferLife::kRun, "optimizer init, held",
                     "stage3.py:547-551 (torch.zeros, pinned only if "
                     "offload_optimizer.pin_memory); engine.py:1017-1021"));
  if (precision == Precision::kFp16) {
    out.push_back(make(BufferRole::kOverflowTemporary,
                       "overflow check temporaries (isinf, then isnan)", 1, layout.total_elements,
                       false, false, BufferLife::kStep,
                       "every step before the update, one pass after the other",
                       "stage3.py:2034 (fp16 only), 2208-2218"));
  }
  return out;
}

BufferPeaks buffer_peaks(const std::vector<BufferSpec>& buffers) {
  BufferPeaks peaks;
  uint64_t held = 0;  // run-long buffers so far, in allocation order
  auto consider = [&](uint64_t moment, std::string what) {
    if (moment > peaks.run) {
      peaks.run = moment;
      peaks.run_moment = std::move(what);
    }
  };
  for (const BufferSpec& b : buffers) {
    if (b.pinned) peaks.pinned += b.held_bytes();
    if (b.life == BufferLife::kStartup) {
      consider(held + b.held_bytes(), "start-up: " + b.name);
    } else if (b.life == BufferLife::kRun) {
      // The last allocation of a zeroed-source buffer: its source and pinned copy at once.
      consider(held + b.held_bytes() + (b.zero_source ? b.each_bytes : 0),
               "start-up: " + b.name + (b.zero_source ? " (pinned copy of zeros)" : ""));
      held += b.held_bytes();
    }
  }
  peaks.steps = held;
  peaks.steps_moment = "every buffer held";
  for (const BufferSpec& b : buffers) {
    if (b.life == BufferLife::kStep && held + b.held_bytes() > peaks.steps) {
      peaks.steps = held + b.held_bytes();
      peaks.steps_moment = "step: " + b.name;
    }
  }
  consider(peaks.steps, peaks.steps_moment);
  return peaks;
}

}  // namespace strata::deepspeed
