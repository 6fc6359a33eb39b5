// What a whole fine-tuning job costs: its tokens (--tokens, or --epochs x --dataset-tokens) in
// optimizer steps, hours and USD per price tier. docs/planner.md, "Job cost".
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "common/status.h"
#include "model/gpu_presets.h"

namespace strata {

struct JobCost {
  double tokens = 0;
  uint64_t steps = 0;           // optimizer steps: ceil(tokens / tokens per step)
  double hours = 0;             // steps x step time
  std::array<double, 3> usd{};  // hours x price per GPU-hour x GPUs, per tier low/typical/high
};

JobCost job_cost(double tokens, double tokens_per_step, double step_seconds,
                 const PriceRange& price, uint32_t gpus);

// More tokens than any job trains (Llama 3 was pretrained on 15e12), small enough that every
// count and step count below it is exact in a double and a uint64_t.
inline constexpr double kMaxJobTokens = 1e18;

// --tokens N alone, or --epochs E with --dataset-tokens D (E x D, rounded up to whole tokens);
// neither: no job. Anything else (both forms, one half of the second, a count that is not
// whole and positive, or past kMaxJobTokens) is an error.
Result<std::optional<double>> job_tokens(std::optional<double> tokens, std::optional<double> epochs,
                                         std::optional<double> dataset_tokens);

}  // namespace strata
