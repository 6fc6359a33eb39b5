// How pinned and device memory is carved up: the pools the scheduler charges buffers to, and the
// host memory outside them. Two plans ship: Strata's (one exact-size, on-demand pinned pool) and
// DeepSpeed ZeRO-Infinity's (fixed up-front blocks, uniform slots, power-of-two rounding, a flat
// gradient buffer, overflow-check temporaries; per docs/offload-baseline.md). Both run through
// the same scheduler and simulator, so their step time and peaks compare like for like.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "sched/deepspeed_defaults.h"
#include "sched/policy.h"
#include "sched/residency.h"
#include "vocabulary/tensor_spec.h"

namespace strata::sched {

constexpr uint32_t kind_bit(TensorKind kind) {
  return 1u << static_cast<unsigned>(kind);
}
inline constexpr uint32_t kAllKinds = (1u << kTensorKindCount) - 1;

// Explicit limit: pools per plan (the scheduler keeps per-pool state in fixed arrays).
inline constexpr uint32_t kMaxPools = 16;

struct PoolSpec {
  std::string name;
  Tier tier = Tier::kPinned;   // kPinned or kDevice
  uint32_t kinds = kAllKinds;  // tensor kinds served (bits of kind_bit); first matching pool wins
  uint64_t budget_bytes = 0;   // charged bytes the pool's buffers may occupy at once (> 0)
  // Memory held from start to end whatever is in use (ZeRO-Infinity allocates its blocks up
  // front). 0: on demand, memory counts only while buffers exist. Peaks count max(reserved, used).
  uint64_t reserved_bytes = 0;
  SizeRule size;
};

struct MemoryPlan {
  std::string policy = "strata";
  std::vector<PoolSpec> pools;
  // Host memory outside the pools, for the simulator's host peak.
  uint64_t host_static_bytes = 0;          // unpinned, held all run
  uint64_t overflow_check_temp_bytes = 0;  // transient, during a host-side overflow check
  uint32_t overflow_check_passes = 0;      // host passes over all gradients per step (0: fused)
  uint64_t startup_transient_bytes = 0;    // extra host memory while the buffers are created
  // Kinds that rest in pinned memory for good (registered with home = pinned): ZeRO-Infinity's
  // flat gradient buffer. Bits of kind_bit.
  uint32_t pinned_home_kinds = 0;
  // Kinds that rest on the device for good (registered with home = device): strata.torch's
  // param_home="device", the weights of a job that offloads only its activations. Materialized
  // there before the first step (the framework wrote them at registration); they never move.
  uint32_t device_home_kinds = 0;
  // Pinned memory the backend holds from start to end for streamed device transfers
  // (TierBackend::stream_to_device / stream_to_nvme), outside the pools; counted in the pinned
  // tier as kind other. 0: no streaming: device data moves through a pinned buffer of its own
  // size, staged in the pinned pool (ZeRO-Infinity's way, and the only way before streaming).
  uint64_t stream_staging_bytes = 0;
};

// Pools on pinned/device tiers only, non-zero budgets, reserved 0 or >= budget, <= kMaxPools,
// size rules that charged_bytes accepts.
Status validate(const MemoryPlan& plan);

// The pool a tensor of `kind` uses on `tier`, or -1 when the plan has none.
int find_pool(const MemoryPlan& plan, Tier tier, TensorKind kind);

// Memory held whatever the use (sum of reserved_bytes) on a tier.
uint64_t reserved_bytes(const MemoryPlan& plan, Tier tier);

// Strata: one pinned pool (page-exact buffers, allocated on demand) shared by every kind, and one
// device pool (256-byte exact). With stream_staging_bytes > 0 device transfers stream, and the
// pinned pool's budget is what the staging buffers leave of pinned_budget_bytes (which must
// leave some: validate() refuses a plan without pinned room beside them).
MemoryPlan strata_memory_plan(uint64_t pinned_budget_bytes, uint64_t device_budget_bytes,
                              uint64_t stream_staging_bytes = 0);

// ZeRO-Infinity's memory plan for Strata's own scheduler, the C API's "zero-infinity" policy
// (api/runtime.cpp). Its element-count defaults are DeepSpeed's, from the one record of them
// (model/deepspeed_config.h); its pinned gradient buffer and overflow passes are an older,
// costlier reading of DeepSpeed than the labelled configurations `strata plan` and `strata
// bench finetune` use (model/deepspeed_buffers.h, ../shared/reference/offload-baseline.md).
struct ZeroInfinityOptions {
  uint32_t param_buffer_count = deepspeed::kParamBufferCount;          // offload_param.buffer_count
  uint64_t param_buffer_elements = deepspeed::kParamBufferElements;    // offload_param.buffer_size
                                                                       // (raised to the largest
                                                                       // parameter when smaller)
  uint32_t optimizer_buffer_count = deepspeed::kOptimizerBufferCount;  // offload_optimizer
  uint64_t sub_group_elements = deepspeed::kSubGroupElements;          // sub_group_size
  bool power_of_two_pinned = true;               // PyTorch's caching host allocator
  uint32_t overflow_temp_bytes_per_element = 1;  // isinf()/isnan() bool temporaries
  uint32_t overflow_check_passes = 2;            // isinf pass, then isnan pass
  uint64_t other_pinned_budget_bytes = 0;        // pool for kinds not listed above (0: none)
};

// ZeRO-Infinity's pools from an inventory: "zi-params" (uniform slots of the largest parameter,
// buffer_count of them, one block rounded to a power of two), "zi-optimizer" (fp32 master/m/v
// through buffer_count sub-group buffers, plus one more for the parameter write-back, each
// rounded), "zi-gradients" (a flat buffer holding every gradient), and a device pool. The host
// figures: the overflow check's temporaries, and the startup copy (buffers are created unpinned
// and copied into pinned memory: the largest block exists twice for a moment).
Result<MemoryPlan> zero_infinity_memory_plan(const std::vector<TensorSpec>& inventory,
                                             const ZeroInfinityOptions& options,
                                             uint64_t device_budget_bytes);

}  // namespace strata::sched
