// The machine-readable form of a plan: `strata plan --json`.
#pragma once

#include <nlohmann/json.hpp>

#include "model/plan.h"

namespace strata {

// Top-level fields describe the plan on plan.gpus[plan.primary]:
// {"model","method","params","trainable_params","model_state_bytes","gpu_bytes","host_bytes",
//  "nvme_bytes","step_seconds","tokens_per_s","bottleneck","zero_infinity":{"host_bytes",
//  "step_seconds",...},"gpus":[{"gpu","fits","usd_per_mtok_low","usd_per_mtok_typical",
//  "usd_per_mtok_high",...}], ...} plus breakdowns, assumptions and the cheapest option per tier.
nlohmann::json plan_to_json(const Plan& plan);

// DeepSpeed's host buffers, one object each (the benchmark's worker and the plan print the same):
// [{"name","count","bytes_each","held_bytes","pinned","rounded","startup_copy","life","when",
//   "deepspeed_source"}].
nlohmann::json deepspeed_buffers_json(const std::vector<deepspeed::BufferSpec>& buffers);

}  // namespace strata
