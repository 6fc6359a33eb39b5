#include "model/plan_report.h"

namespace strata {
namespace {

using nlohmann::json;

json offload_json(const OffloadEstimate& e) {
  json breakdown = json::array();
  for (const ByteItem& item : e.host_breakdown) {
    breakdown.push_back({{"what", item.what}, {"bytes", item.bytes}});
  }
  json out = {{"policy", e.policy},
              {"estimate", e.model},
              {"host_bytes", e.host_bytes},
              {"nvme_bytes", e.nvme_bytes},
              {"step_seconds", e.step_seconds},
              {"bottleneck", e.bottleneck},
              {"compute_seconds", e.compute_seconds},
              {"pcie_seconds", e.pcie_seconds},
              {"nvme_seconds", e.nvme_seconds},
              {"cpu_optimizer_seconds", e.cpu_optimizer_seconds},
              {"nvme_read_bytes_per_step", e.nvme_read_bytes},
              {"nvme_write_bytes_per_step", e.nvme_write_bytes},
              {"pcie_h2d_bytes_per_step", e.pcie_h2d_bytes},
              {"pcie_d2h_bytes_per_step", e.pcie_d2h_bytes},
              {"host_breakdown", breakdown}};
  if (e.model == "simulated") {
    out["stall_seconds"] = e.stall_seconds;
    out["pinned_budget_bytes"] = e.pinned_budget_bytes;
    out["peak_pinned_bytes"] = e.peak_pinned_bytes;
    out["device_budget_bytes"] = e.device_budget_bytes;
    out["peak_device_bytes"] = e.peak_device_bytes;
    out["simulated_transfers"] = e.transfers;
  }
  return out;
}

json gpu_json(const GpuPlan& g) {
  return {{"gpu", g.choice.gpu.name},
          {"count", g.choice.count},
          {"fits", g.fits()},
          {"fits_gpu", g.fits_gpu},
          {"fits_host", g.fits_host},
          {"why_not", g.why_not},
          {"offload", to_string(g.offload)},
          {"weights_streamed", !g.params_resident},
          {"gpu_bytes", g.memory.total()},
          {"gpu_capacity_bytes", g.choice.gpu.memory_bytes()},
          {"host_bytes", g.host_bytes},
          {"nvme_bytes", g.nvme_bytes},
          {"step_seconds", g.step_seconds},
          {"tokens_per_s", g.tokens_per_s},
          {"bottleneck", g.bottleneck},
          {"hours_per_mtok", g.hours_per_mtok},
          {"usd_per_mtok_low", g.usd_per_mtok[0]},
          {"usd_per_mtok_typical", g.usd_per_mtok[1]},
          {"usd_per_mtok_high", g.usd_per_mtok[2]}};
}

}  // namespace

json plan_to_json(const Plan& plan) {
  const PlanRequest& r = plan.request;
  const GpuPlan& p = plan.gpus.at(plan.primary);
  json gpus = json::array();
  for (const GpuPlan& g : plan.gpus) gpus.push_back(gpu_json(g));
  json cheapest = json::object();
  for (int tier = 0; tier < 3; ++tier) {
    const CheapestOption& c = plan.cheapest[tier];
    cheapest[kPriceTierNames[tier]] =
        c.found ? json{{"gpu", c.gpu}, {"count", c.count}, {"usd_per_mtok", c.usd_per_mtok}}
                : json(nullptr);
  }
  json zero_infinity = offload_json(plan.zero_infinity);
  zero_infinity["fits_host"] =
      plan.zero_infinity_fits_host ? json(*plan.zero_infinity_fits_host) : json(nullptr);
  const GpuMemory& m = p.memory;
  return {
      {"model", r.model.name},
      {"method", to_string(r.method)},
      {"precision", to_string(r.precision)},
      {"lora_rank", r.method == FinetuneMethod::kFull ? 0 : r.lora_rank},
      {"lora_targets", r.method == FinetuneMethod::kFull ? "" : to_string(r.lora_targets)},
      {"seq", r.seq_len},
      {"batch", r.micro_batch},
      {"grad_accum", r.grad_accum},
      {"checkpointing", to_string(r.checkpointing)},
      {"params", plan.states.params},
      {"trainable_params", plan.states.trainable_params},
      {"weight_bytes", plan.states.weight_bytes},
      {"model_state_bytes", plan.states.model_state_bytes},
      {"gpu", p.choice.gpu.name},
      {"gpu_count", p.choice.count},
      {"offload", to_string(p.offload)},
      {"weights_streamed", !p.params_resident},
      {"fits", p.fits()},
      {"gpu_bytes", m.total()},
      {"gpu_memory",
       {{"weights", m.weights},
        {"gradients", m.gradients},
        {"optimizer", m.optimizer},
        {"activations", m.activations},
        {"logits", m.logits},
        {"buffers", m.buffers},
        {"cuda_context", m.cuda_context}}},
      {"host_bytes", p.host_bytes},
      {"nvme_bytes", p.nvme_bytes},
      {"step_seconds", p.step_seconds},
      {"tokens_per_step", p.tokens_per_step},
      {"tokens_per_s", p.tokens_per_s},
      {"bottleneck", p.bottleneck},
      {"stages", offload_json(p.stages)},
      {"strata_nvme", offload_json(plan.strata_nvme)},
      {"zero_infinity", zero_infinity},
      {"nvme",
       {{"label", r.nvme.label},
        {"read_gbps", r.nvme.read_gbps},
        {"write_gbps", r.nvme.write_gbps}}},
      {"assumptions",
       {{"mfu", r.assume.mfu},
        {"adam_params_per_s", r.assume.adam_params_per_s},
        {"pcie_efficiency", r.assume.pcie_efficiency},
        {"host_scan_gbps", r.assume.host_scan_gbps},
        {"cuda_context_bytes", r.assume.cuda_context_bytes}}},
      {"host_ram_bytes", r.host_ram_bytes ? json(*r.host_ram_bytes) : json(nullptr)},
      {"gpus", gpus},
      {"cheapest", cheapest},
  };
}

}  // namespace strata
