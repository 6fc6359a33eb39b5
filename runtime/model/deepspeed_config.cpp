#include "model/deepspeed_config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "common/align.h"

namespace strata::deepspeed {
namespace {

// swap_tensor/utils.py:15-16.
constexpr uint64_t kMinAioBytes = uint64_t{1} << 20;
constexpr uint64_t kAioAlignedBytes = 1024;
constexpr uint64_t kDirectIoAlignment = 4096;
// The pipelined optimizer swapper holds three sub-groups' buffers at once (the one being read
// ahead, the one being updated, the one being written), four each: master, exp_avg, exp_avg_sq
// and the gradient (pipelined_optimizer_swapper.py:102-158, 204-239).
constexpr uint32_t kPipelinedOptimizerBuffers = 3 * 4;
// ds_nvme_tune's sweep (nvme/perf_run_sweep.py): block 1M / 8M, queue depth 32 / 128,
// parallelism 1 / 8. One drive saturates at queue depth 32 with 1 MiB blocks (offload-baseline.md,
// "Numbers from the field"); the sweep's larger settings only add host memory in flight.
constexpr uint32_t kTunedQueueDepth = 32;

uint64_t scaled(uint64_t elements, double factor) {
  return std::max<uint64_t>(
      1, static_cast<uint64_t>(std::llround(static_cast<double>(elements) * factor)));
}

}  // namespace

const char* to_string(Precision precision) {
  return precision == Precision::kBf16 ? "bf16" : "fp16";
}

Result<Precision> parse_precision(const std::string& name) {
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  return invalid_argument("--precision '" + name + "' is not bf16 or fp16");
}

Result<std::vector<std::string>> parse_baselines(const std::string& list) {
  std::vector<std::string> names;
  std::stringstream in(list);
  std::string name;
  while (std::getline(in, name, ',')) {
    if (name != kDeepSpeedDefaults && name != kDeepSpeedPinned && name != kDeepSpeedTuned) {
      return invalid_argument("--baseline '" + name + "' is not one of " + kAllBaselines);
    }
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      return invalid_argument("--baseline names '" + name + "' twice");
    }
    names.push_back(name);
  }
  if (names.empty()) return invalid_argument(std::string("--baseline is empty: ") + kAllBaselines);
  return names;
}

Result<DeepSpeedConfig> labelled_config(const std::string& name,
                                        const std::vector<TensorSpec>& inventory,
                                        double parameter_factor) {
  if (!(parameter_factor > 0.0 && parameter_factor <= 1.0)) {
    return invalid_argument("parameter factor outside (0, 1]");
  }
  DeepSpeedConfig c;
  c.name = name;
  c.param_buffer_elements = scaled(c.param_buffer_elements, parameter_factor);
  c.max_in_cpu = scaled(c.max_in_cpu, parameter_factor);
  c.sub_group_elements = scaled(c.sub_group_elements, parameter_factor);
  c.prefetch_bucket_elements = scaled(c.prefetch_bucket_elements, parameter_factor);
  c.param_persistence_threshold = scaled(c.param_persistence_threshold, parameter_factor);
  c.max_live_parameters = scaled(c.max_live_parameters, parameter_factor);
  c.max_reuse_distance = scaled(c.max_reuse_distance, parameter_factor);
  uint64_t largest = 0;
  for (const TensorSpec& t : inventory) {
    if (t.kind == TensorKind::kParameter) largest = std::max(largest, t.elements());
  }
  // partitioned_param_swapper.py:360 asserts that a swapped parameter fits one buffer; users
  // raise buffer_size to the largest parameter (the embedding / LM head), no further.
  c.param_buffer_elements = std::max(c.param_buffer_elements, largest);
  if (name == kDeepSpeedDefaults) return c;
  if (name == kDeepSpeedPinned) {
    c.param_pin_memory = true;
    c.optimizer_pin_memory = true;
    return c;
  }
  if (name == kDeepSpeedTuned) {
    c.sub_group_elements = 1;  // each sub-group one parameter: the smallest buffers possible
    c.max_in_cpu = 0;
    c.pipeline_read = true;
    c.pipeline_write = true;
    c.optimizer_buffer_count = kPipelinedOptimizerBuffers;
    c.aio_queue_depth = kTunedQueueDepth;
    return c;
  }
  return invalid_argument("unknown DeepSpeed configuration '" + name + "'");
}

uint64_t io_aligned_elements(const DeepSpeedConfig& config, uint64_t n, uint32_t element_bytes) {
  const uint64_t alignment =
      std::max(kDirectIoAlignment, kAioAlignedBytes * config.aio_intra_op_parallelism);
  return align_up(n * element_bytes, alignment) / element_bytes;
}

Result<DeepSpeedLayout> deepspeed_layout(const DeepSpeedConfig& config,
                                         const std::vector<TensorSpec>& inventory) {
  DeepSpeedLayout layout;
  const uint64_t min_aio_bytes = std::max<uint64_t>(kMinAioBytes, config.aio_block_bytes);
  for (size_t i = 0; i < inventory.size(); ++i) {
    const TensorSpec& t = inventory[i];
    if (t.kind != TensorKind::kParameter) continue;
    const uint64_t n = t.elements();
    layout.params.push_back(i);
    // partitioned_param_swapper.py:100,139-144: partitions under max(1 MiB, block_size) bytes
    // stay in CPU memory.
    layout.swapped.push_back(n * dtype_size(t.dtype) >= min_aio_bytes);
    layout.persistent.push_back(n < config.param_persistence_threshold);
    layout.largest_param = std::max(layout.largest_param, n);
    layout.total_elements += n;
  }
  if (layout.params.empty()) return invalid_argument("the model has no trainable parameters");
  // stage3.py:943-966 (_create_fp16_sub_groups): close a group once it reaches the size.
  SubGroup current;
  for (size_t p = 0; p < layout.params.size(); ++p) {
    current.params.push_back(p);
    current.elements += inventory[layout.params[p]].elements();
    layout.sub_group.push_back(layout.sub_groups.size());
    if (current.elements >= config.sub_group_elements || p + 1 == layout.params.size()) {
      layout.largest_sub_group = std::max(layout.largest_sub_group, current.elements);
      layout.sub_groups.push_back(std::move(current));
      current = SubGroup{};
    }
  }
  // stage3.py:678-701 and 744-769: one flat CPU buffer of min(all, max_in_cpu) elements; the
  // sub-groups that fit in it whole, in order, keep their bf16 partition there, the rest go to
  // NVMe. (Offload to NVMe only: every parameter is in the one trainable group here.)
  layout.cpu_flat_elements = std::min(layout.total_elements, config.max_in_cpu);
  uint64_t offset = 0;
  for (SubGroup& g : layout.sub_groups) {
    g.in_cpu = offset + g.elements <= layout.cpu_flat_elements;
    offset += g.elements;
    if (g.in_cpu) {
      for (size_t p : g.params) layout.swapped[p] = false;
    }
  }
  for (const SubGroup& g : layout.sub_groups) {
    if (!g.swapped_states) continue;
    uint64_t aligned = 0;
    for (size_t p : g.params) {
      aligned += io_aligned_elements(config, inventory[layout.params[p]].elements(), 4);
    }
    layout.largest_sub_group_swap_elements =
        std::max(layout.largest_sub_group_swap_elements,
                 std::max(aligned, io_aligned_elements(config, g.elements, 4)));
  }
  for (SubGroup& g : layout.sub_groups) {
    g.swapped_states = g.elements * 4 >= min_aio_bytes;
    if (!g.swapped_states) {
      g.host_offset = layout.host_state_elements;
      layout.host_state_elements += g.elements;
    }
  }
  // The fetch order of a micro-batch: every parameter by unit (the tensors before the layers,
  // each layer, the tensors after them) in forward order, then all of it reversed. A
  // parameter of the last unit stays on the GPU for its backward use when fewer than
  // max_reuse_distance elements are fetched in between.
  const auto unit_of = [&](size_t p) {
    const int32_t layer = inventory[layout.params[p]].layer;
    if (layer >= 0) return static_cast<int64_t>(layer);
    bool after_layers = false;
    for (size_t q = 0; q < p && !after_layers; ++q) {
      after_layers = inventory[layout.params[q]].layer >= 0;
    }
    return after_layers ? INT64_MAX : int64_t{-1};
  };
  std::vector<int64_t> unit(layout.params.size());
  for (size_t p = 0; p < layout.params.size(); ++p) unit[p] = unit_of(p);
  std::vector<size_t> forward(layout.params.size());
  for (size_t p = 0; p < forward.size(); ++p) forward[p] = p;
  std::stable_sort(forward.begin(), forward.end(),
                   [&](size_t a, size_t b) { return unit[a] < unit[b]; });
  const int64_t last_unit = unit[forward.back()];
  layout.kept_for_backward.assign(layout.params.size(), false);
  for (size_t i = 0; i < forward.size(); ++i) {
    const size_t p = forward[i];
    if (unit[p] != last_unit) continue;
    // Fetched between: the rest of the forward order, then the backward order up to p.
    uint64_t between = 0;
    for (size_t j = i + 1; j < forward.size(); ++j) {
      between += inventory[layout.params[forward[j]]].elements();
    }
    for (size_t j = forward.size(); j-- > i + 1;) {
      between += inventory[layout.params[forward[j]]].elements();
    }
    layout.kept_for_backward[p] = between < config.max_reuse_distance;
  }
  if (layout.largest_sub_group_swap_elements == 0) {
    return unsupported(
        "no DeepSpeed sub-group reaches the swapper's minimum I/O size: every "
        "optimizer state would stay in CPU memory (use a larger --scale)");
  }
  return layout;
}

}  // namespace strata::deepspeed
