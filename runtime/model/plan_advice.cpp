#include "model/plan_advice.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/units.h"
#include "model/simulation_pool.h"

namespace strata {
namespace {

struct Knob {
  std::string flag;
  std::string reason;
  PlanRequest request;
};

std::string seconds_text(double s) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f s", s);
  return buffer;
}

// 10 -> "10", 27.5 -> "27.5": a measured rate as it is written.
std::string fixed_text(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", v);
  return buffer;
}

}  // namespace

Result<std::vector<Advice>> plan_advice(const Plan& plan) {
  SimulationPool pool(SimulationPool::default_threads());
  return plan_advice(plan, pool);
}

Result<std::vector<Advice>> plan_advice(const Plan& plan, SimulationPool& pool) {
  std::vector<Advice> advice;
  const GpuPlan& p = plan.gpus.at(plan.primary);
  if (!p.fits() || p.bottleneck == "compute" || !(p.stages.compute_seconds > 0)) return advice;

  PlanRequest base = plan.request;
  GpuChoice choice = p.choice;
  choice.auto_count = false;
  base.gpus = {choice};
  base.offload = p.offload;
  base.job_tokens.reset();

  const OffloadEstimate& st = p.stages;
  const double dominant = std::max({st.cpu_optimizer_seconds, st.nvme_seconds, st.pcie_seconds});
  std::vector<Knob> knobs;

  // Stages paid once per optimizer step stay while compute grows with the micro-batches.
  const double ratio = std::ceil(dominant / st.compute_seconds);
  const uint64_t factor = std::bit_ceil(static_cast<uint64_t>(std::clamp(ratio, 2.0, 64.0)));
  if (base.grad_accum * factor <= 65536) {
    Knob k{"--grad-accum " + std::to_string(base.grad_accum * factor), "", base};
    k.request.grad_accum *= factor;
    // Streamed weights are read in every micro-batch: only the optimizer's share is spread.
    const bool weights_streamed = !p.params_resident && p.bottleneck.starts_with("nvme");
    k.reason =
        p.bottleneck + " (" + seconds_text(dominant) + " against compute " +
        seconds_text(st.compute_seconds) +
        (weights_streamed ? "): the optimizer's states move once per optimizer step, so more "
                            "micro-batches spread them over more tokens; the streamed weights are "
                            "read in every micro-batch and are not spread"
                          : ") is paid per optimizer step; more micro-batches spread it over more "
                            "tokens");
    knobs.push_back(std::move(k));
  }
  if (base.micro_batch * 2 <= 65536) {
    Knob k{"--batch " + std::to_string(base.micro_batch * 2),
           "twice the tokens per micro-batch for the same weight traffic and optimizer step", base};
    k.request.micro_batch *= 2;
    knobs.push_back(std::move(k));
  }
  // More drives: only to an array someone measured (NvmePreset::measured_arrays), the next
  // larger one; past the largest the rates are an extrapolation, not advice.
  const NvmeArray& nvme = plan.request.nvme;
  if (p.bottleneck.starts_with("nvme") && !nvme.generation.empty()) {
    Result<NvmePreset> drive = find_nvme(nvme.generation + "-x4");
    const std::vector<NvmeArrayPoint> measured =
        drive ? std::move(drive->measured_arrays) : std::vector<NvmeArrayPoint>{};
    const auto next = std::find_if(measured.begin(), measured.end(),
                                   [&](const NvmeArrayPoint& a) { return a.drives > nvme.drives; });
    if (next != measured.end()) {
      const std::string flag = std::to_string(next->drives) + ":" + nvme.generation;
      if (Result<NvmeArray> array = parse_nvme(flag)) {
        Knob k{"--nvme " + flag,
               "a RAID-0 array of " + std::to_string(next->drives) + " drives moves " +
                   fixed_text(next->read_gbps) + " / " + fixed_text(next->write_gbps) +
                   " GB/s as measured",
               base};
        k.request.nvme = *array;
        knobs.push_back(std::move(k));
      }
    }
  }

  // Each re-plan simulates its own job; they share nothing, so they run side by side.
  std::vector<std::optional<Result<Plan>>> replanned(knobs.size());
  std::vector<SimulationPool::Ticket> tickets;
  for (size_t k = 0; k < knobs.size(); ++k) {
    tickets.push_back(
        pool.post([&, k] { replanned[k].emplace(make_gpu_plans(knobs[k].request, pool)); }));
  }
  for (const SimulationPool::Ticket& ticket : tickets) pool.join(ticket);
  for (size_t k = 0; k < knobs.size(); ++k) {
    Result<Plan>& made = *replanned[k];
    if (!made) continue;  // e.g. a budget the knob makes too small: not advice
    const GpuPlan& q = made->gpus.front();
    if (!q.fits()) continue;
    const double speedup = q.tokens_per_s / p.tokens_per_s;
    if (speedup < kAdviceMinSpeedup) continue;
    advice.push_back({knobs[k].flag, knobs[k].reason, q.tokens_per_s, q.usd_per_mtok[1], speedup});
  }
  std::sort(advice.begin(), advice.end(), [](const Advice& a, const Advice& b) {
    return a.usd_per_mtok_typical < b.usd_per_mtok_typical;
  });
  return advice;
}

}  // namespace strata
