// DeepSpeed 0.16.5's defaults for the knobs that size ZeRO-Infinity's buffers, one record each:
// the scheduler's zero-infinity memory plan (sched/memory_plan.h, the C API's
// STRATA_POLICY_ZERO_INFINITY) and the labelled configurations of `strata plan` and `strata bench
// finetune` (model/deepspeed_config.h) both read them here, below both in the layout.
#pragma once

#include <cstdint>

namespace strata::deepspeed {

inline constexpr uint32_t kParamBufferCount = 5;               // offload_config.py:33
inline constexpr uint64_t kParamBufferElements = 100'000'000;  // offload_config.py:36
inline constexpr uint32_t kOptimizerBufferCount = 4;           // offload_config.py:64
inline constexpr uint64_t kSubGroupElements = 1'000'000'000;   // zero/config.py:168

}  // namespace strata::deepspeed
