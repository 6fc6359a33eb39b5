// Advice when a stage other than compute bounds the headline plan: which knob would help, and by
// how much, each measured by planning the job again with the knob turned (docs/planner.md,
// "Advice").
#pragma once

#include <vector>

#include "common/status.h"
#include "model/plan.h"

namespace strata {

// Improvements below this fraction of tokens/s are not advice.
inline constexpr double kAdviceMinSpeedup = 1.05;

// For plan.gpus[plan.primary] when it fits and is not compute-bound:
// - more micro-batches per optimizer step (--grad-accum): the CPU optimizer and the optimizer's
//   NVMe traffic are paid once per step, so tokens per step amortise them; the factor is the
//   dominant stage over compute, rounded up to a power of two (at most 64x);
// - a micro-batch twice as large (--batch), when it fits the GPU: streamed weights cross PCIe
//   once per micro-batch;
// - four times the drives (--nvme), when NVMe bounds it.
// Each is re-planned (make_gpu_plans: the same GPU and offload); the ones at least
// kAdviceMinSpeedup faster are returned, cheapest per token first. The re-plans run on `pool`
// (model/simulation_pool.h), or on a pool of their own.
Result<std::vector<Advice>> plan_advice(const Plan& plan);
Result<std::vector<Advice>> plan_advice(const Plan& plan, SimulationPool& pool);

}  // namespace strata
