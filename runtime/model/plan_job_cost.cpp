#include "model/plan_job_cost.h"

#include <cmath>
#include <string>

namespace strata {

JobCost job_cost(double tokens, double tokens_per_step, double step_seconds,
                 const PriceRange& price, uint32_t gpus) {
  JobCost cost;
  cost.tokens = tokens;
  // A partial last step still runs in full.
  cost.steps = static_cast<uint64_t>(std::ceil(tokens / tokens_per_step));
  cost.hours = static_cast<double>(cost.steps) * step_seconds / 3600.0;
  const double prices[3] = {price.low, price.typical, price.high};
  for (int tier = 0; tier < 3; ++tier) cost.usd[tier] = cost.hours * prices[tier] * gpus;
  return cost;
}

Result<std::optional<double>> job_tokens(std::optional<double> tokens, std::optional<double> epochs,
                                         std::optional<double> dataset_tokens) {
  const auto positive = [](std::optional<double> v) { return v && std::isfinite(*v) && *v > 0; };
  // A count of tokens is whole: half a token printed as "0 tokens = 1 steps", and 2e19
  // (past 2^64) as "0 tokens".
  const auto count = [](double v) { return v >= 1 && v <= kMaxJobTokens && std::floor(v) == v; };
  const std::string limit = " from 1 to 1e18";
  if (tokens) {
    if (epochs || dataset_tokens) {
      return invalid_argument("give --tokens, or --epochs with --dataset-tokens, not both");
    }
    if (!positive(tokens) || !count(*tokens)) {
      return invalid_argument("--tokens must be a whole count" + limit);
    }
    return std::optional<double>(*tokens);
  }
  if (!epochs && !dataset_tokens) return std::optional<double>();
  if (!epochs || !dataset_tokens) {
    return invalid_argument("--epochs and --dataset-tokens go together");
  }
  if (!positive(epochs) || !positive(dataset_tokens)) {
    return invalid_argument("--epochs and --dataset-tokens must be positive");
  }
  if (!count(*dataset_tokens)) {
    return invalid_argument("--dataset-tokens must be a whole count" + limit);
  }
  // A fraction of an epoch (1.5) reads part of the dataset: its tokens rounded up to whole ones.
  const double product = std::ceil(*epochs * *dataset_tokens);
  if (!count(product)) {
    return invalid_argument("--epochs x --dataset-tokens must come to at most 1e18 tokens");
  }
  return std::optional<double>(product);
}

}  // namespace strata
