#include "sched/memory_plan.h"

#include <algorithm>

namespace strata::sched {

namespace {

constexpr uint64_t kDeviceAlignment = 256;

uint64_t rounded(bool power_of_two, uint64_t bytes) {
  const uint64_t paged = align_up(bytes, kPageSize);
  return power_of_two ? next_power_of_two(paged) : paged;
}

PoolSpec device_pool(uint64_t budget) {
  PoolSpec pool;
  pool.name = "device";
  pool.tier = Tier::kDevice;
  pool.budget_bytes = budget;
  pool.size = {SizeClass::kExact, kDeviceAlignment, 0};
  return pool;
}

}  // namespace

Status validate(const MemoryPlan& plan) {
  if (plan.pools.empty()) return invalid_argument("memory plan '" + plan.policy + "' has no pools");
  if (plan.pools.size() > kMaxPools) {
    return invalid_argument("memory plan has " + std::to_string(plan.pools.size()) +
                            " pools; at most " + std::to_string(kMaxPools));
  }
  for (const PoolSpec& pool : plan.pools) {
    const std::string where = "pool '" + pool.name + "': ";
    if (pool.tier != Tier::kPinned && pool.tier != Tier::kDevice) {
      return invalid_argument(where + "tier must be pinned or device");
    }
    if (pool.budget_bytes == 0) {
      return invalid_argument(where + "budget is 0 bytes" +
                              (pool.tier == Tier::kPinned && plan.stream_staging_bytes > 0
                                   ? " (the streaming staging buffers, " +
                                         std::to_string(plan.stream_staging_bytes) +
                                         " bytes, take the whole pinned budget)"
                                   : std::string()));
    }
    if ((pool.kinds & kAllKinds) == 0) return invalid_argument(where + "serves no tensor kind");
    if (pool.reserved_bytes != 0 && pool.reserved_bytes < pool.budget_bytes) {
      return invalid_argument(where + "reserves less than its budget");
    }
    STRATA_TRY(charged_bytes(pool.size, 1).status(), where + "size rule");
  }
  return Status::ok();
}

int find_pool(const MemoryPlan& plan, Tier tier, TensorKind kind) {
  for (size_t i = 0; i < plan.pools.size(); ++i) {
    const PoolSpec& pool = plan.pools[i];
    if (pool.tier == tier && (pool.kinds & kind_bit(kind)) != 0) return static_cast<int>(i);
  }
  return -1;
}

uint64_t reserved_bytes(const MemoryPlan& plan, Tier tier) {
  uint64_t total = 0;
  for (const PoolSpec& pool : plan.pools) {
    if (pool.tier == tier) total += pool.reserved_bytes;
  }
  return total;
}

MemoryPlan strata_memory_plan(uint64_t pinned_budget_bytes, uint64_t device_budget_bytes,
                              uint64_t stream_staging_bytes) {
  MemoryPlan plan;
  plan.policy = "strata";
  plan.stream_staging_bytes = stream_staging_bytes;
  PoolSpec pinned;
  pinned.name = "pinned";
  pinned.tier = Tier::kPinned;
  pinned.budget_bytes =
      pinned_budget_bytes > stream_staging_bytes ? pinned_budget_bytes - stream_staging_bytes : 0;
  pinned.size = {SizeClass::kExact, kPageSize, 0};
  plan.pools.push_back(std::move(pinned));
  plan.pools.push_back(device_pool(device_budget_bytes));
  return plan;
}

Result<MemoryPlan> zero_infinity_memory_plan(const std::vector<TensorSpec>& inventory,
                                             const ZeroInfinityOptions& options,
                                             uint64_t device_budget_bytes) {
  if (options.param_buffer_count == 0 || options.optimizer_buffer_count == 0 ||
      options.sub_group_elements == 0) {
    return invalid_argument("zero-infinity: buffer counts and sub-group size must be > 0");
  }
  uint64_t largest_param_elements = 0, param_elements = 0, gradient_bytes = 0,
           gradient_elements = 0;
  uint32_t param_dtype_bytes = 2;
  for (const TensorSpec& spec : inventory) {
    if (spec.kind == TensorKind::kParameter) {
      largest_param_elements = std::max(largest_param_elements, spec.elements());
      param_elements += spec.elements();
      param_dtype_bytes = dtype_size(spec.dtype);
    } else if (spec.kind == TensorKind::kGradient) {
      gradient_bytes += spec.bytes();
      gradient_elements += spec.elements();
    }
  }
  if (param_elements == 0) return invalid_argument("zero-infinity: inventory has no parameters");
  const bool pow2 = options.power_of_two_pinned;

  MemoryPlan plan;
  plan.policy = "zero-infinity";

  // Parameter staging: buffer_count uniform slots in one pinned block.
  const uint64_t slot_elements = std::max(options.param_buffer_elements, largest_param_elements);
  const uint64_t slot_bytes = slot_elements * param_dtype_bytes;
  PoolSpec params;
  params.name = "zi-params";
  params.tier = Tier::kPinned;
  params.kinds = kind_bit(TensorKind::kParameter);
  params.budget_bytes = slot_bytes * options.param_buffer_count;
  params.reserved_bytes = rounded(pow2, params.budget_bytes);
  params.size = {SizeClass::kUniformSlot, kPageSize, slot_bytes};
  plan.pools.push_back(params);

  // Optimizer: buffer_count fp32 buffers of the largest sub-group, plus one for the write-back of
  // updated parameters; each its own (rounded) pinned allocation.
  const uint64_t sub_group_bytes = std::min(options.sub_group_elements, param_elements) * 4;
  PoolSpec optimizer;
  optimizer.name = "zi-optimizer";
  optimizer.tier = Tier::kPinned;
  optimizer.kinds = kind_bit(TensorKind::kMasterWeight) | kind_bit(TensorKind::kAdamM) |
                    kind_bit(TensorKind::kAdamV);
  optimizer.budget_bytes = sub_group_bytes * options.optimizer_buffer_count;
  optimizer.reserved_bytes =
      rounded(pow2, sub_group_bytes) * (uint64_t{options.optimizer_buffer_count} + 1);
  optimizer.size = {SizeClass::kExact, kPageSize, 0};
  plan.pools.push_back(optimizer);

  // Gradients: one flat buffer holding every gradient partition.
  if (gradient_bytes > 0) {
    PoolSpec gradients;
    gradients.name = "zi-gradients";
    gradients.tier = Tier::kPinned;
    gradients.kinds = kind_bit(TensorKind::kGradient);
    // Tensors are packed into the flat buffer; page-aligning each here costs at most a page
    // apiece, which the budget allows for.
    gradients.budget_bytes = rounded(pow2, gradient_bytes) + kPageSize * inventory.size();
    gradients.reserved_bytes = gradients.budget_bytes;
    gradients.size = {SizeClass::kExact, kPageSize, 0};
    plan.pools.push_back(gradients);
    plan.pinned_home_kinds |= kind_bit(TensorKind::kGradient);
  }

  if (options.other_pinned_budget_bytes > 0) {
    PoolSpec other;
    other.name = "zi-other";
    other.tier = Tier::kPinned;
    other.budget_bytes = options.other_pinned_budget_bytes;
    other.size = {pow2 ? SizeClass::kPowerOfTwo : SizeClass::kExact, kPageSize, 0};
    plan.pools.push_back(other);
  }
  plan.pools.push_back(device_pool(device_budget_bytes));

  plan.overflow_check_passes = options.overflow_check_passes;
  plan.overflow_check_temp_bytes = gradient_elements * options.overflow_temp_bytes_per_element;
  uint64_t largest_block = 0;
  for (const PoolSpec& pool : plan.pools) {
    if (pool.tier == Tier::kPinned) largest_block = std::max(largest_block, pool.reserved_bytes);
  }
  plan.startup_transient_bytes = largest_block;
  STRATA_TRY(validate(plan));
  return plan;
}

}  // namespace strata::sched
