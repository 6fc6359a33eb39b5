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
              {"activation_copy_seconds", e.activation_copy_seconds},
              {"pcie_seconds", e.pcie_seconds},
              {"nvme_seconds", e.nvme_seconds},
              {"cpu_optimizer_seconds", e.cpu_optimizer_seconds},
              {"nvme_read_bytes_per_step", e.nvme_read_bytes},
              {"nvme_write_bytes_per_step", e.nvme_write_bytes},
              {"pcie_h2d_bytes_per_step", e.pcie_h2d_bytes},
              {"pcie_d2h_bytes_per_step", e.pcie_d2h_bytes},
              {"host_breakdown", breakdown},
              {"activations_alone_step_seconds", e.activations_alone_step_seconds}};
  // A closed form with its activations' way to NVMe simulated has the simulated fields too.
  if (e.has_simulation()) {
    out["stall_seconds"] = e.stall_seconds;
    out["states_only_step_seconds"] = e.states_only_step_seconds;
    out["pinned_budget_bytes"] = e.pinned_budget_bytes;
    out["peak_pinned_bytes"] = e.peak_pinned_bytes;
    if (!e.pinned_derivation.empty()) out["pinned_budget_derivation"] = e.pinned_derivation;
    out["device_budget_bytes"] = e.device_budget_bytes;
    out["peak_device_bytes"] = e.peak_device_bytes;
    out["simulated_transfers"] = e.transfers;
    json read = json::object(), written = json::object();
    for (int k = 0; k < kTensorKindCount; ++k) {
      const char* name = to_string(static_cast<TensorKind>(k));
      read[name] = e.nvme_read_by_kind[k];
      written[name] = e.nvme_write_by_kind[k];
    }
    out["nvme_read_bytes_per_step_by_kind"] = std::move(read);
    out["nvme_write_bytes_per_step_by_kind"] = std::move(written);
  }
  return out;
}

json tiers_json(const std::array<double, 3>& values) {
  return {{"low", values[0]}, {"typical", values[1]}, {"high", values[2]}};
}

json host_json(const HostRam& h) {
  return {{"job_bytes", h.job_bytes},
          {"recommended_bytes", h.recommended_bytes},
          {"full_speed_bytes", h.full_speed_bytes},
          {"full_speed_recommended_bytes", h.full_speed_recommended_bytes}};
}

json optional_json(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

json wear_json(const GpuPlan& g) {
  if (!g.nvme_wear.reported) return nullptr;
  const NvmeWear& w = g.nvme_wear;
  return {
      {"tb_written_per_step", static_cast<double>(w.write_bytes_per_step) / 1e12},
      {"endurance_tb", w.endurance_bytes / 1e12},
      {"steps_to_rated_endurance", w.steps_to_endurance},
      {"tb_written_per_job", w.job_write_bytes ? json(*w.job_write_bytes / 1e12) : json(nullptr)},
      {"endurance_share", optional_json(w.job_share)},
      {"warning", w.warn}};
}

json job_json(const std::optional<JobCost>& c) {
  if (!c) return nullptr;
  return {
      {"tokens", c->tokens}, {"steps", c->steps}, {"hours", c->hours}, {"usd", tiers_json(c->usd)}};
}

json more_ram_json(const std::optional<RamUpgrade>& m) {
  if (!m) return nullptr;
  return {{"host_ram_bytes", m->host_ram_bytes},
          {"offload", "cpu"},
          {"step_seconds", m->step_seconds},
          {"tokens_per_s", m->tokens_per_s},
          {"usd_per_mtok", tiers_json(m->usd_per_mtok)}};
}

json activation_offload_json(const std::optional<ActivationUpgrade>& a) {
  if (!a) return nullptr;
  return {{"activation_offload", "pinned"},
          {"offload", to_string(a->offload)},
          {"gpu_count", a->gpu_count},
          {"gpu_bytes", a->gpu_bytes},
          {"host_recommended_bytes", a->host_recommended_bytes},
          {"fits_host", a->fits_host},
          {"step_seconds", a->step_seconds},
          {"tokens_per_s", a->tokens_per_s},
          {"usd_per_mtok", tiers_json(a->usd_per_mtok)}};
}

json gpu_json(const GpuPlan& g) {
  // Rows that do not fit are not priced: a job that cannot run has no cost.
  const auto price = [&](double usd) { return g.fits() ? json(usd) : json(nullptr); };
  return {{"gpu", g.choice.gpu.name},
          {"count", g.choice.count},
          {"count_chosen_automatically", g.choice.auto_count},
          {"fits", g.fits()},
          {"fits_gpu", g.fits_gpu},
          {"fits_host", g.fits_host},
          {"fits_nvme", g.fits_nvme},
          {"why_not", g.why_not},
          {"offload", to_string(g.offload)},
          {"weights_streamed", !g.params_resident},
          {"activations_offloaded_bytes", g.activations_offloaded_bytes},
          {"gpu_bytes", g.memory.total()},
          {"gpu_capacity_bytes", g.choice.gpu.memory_bytes()},
          {"host_bytes", g.host_bytes},
          {"nvme_bytes", g.nvme_bytes},
          {"step_seconds", g.step_seconds},
          {"tokens_per_s", g.tokens_per_s},
          {"bottleneck", g.bottleneck},
          {"hours_per_mtok", g.hours_per_mtok},
          {"usd_per_mtok_low", price(g.usd_per_mtok[0])},
          {"usd_per_mtok_typical", price(g.usd_per_mtok[1])},
          {"usd_per_mtok_high", price(g.usd_per_mtok[2])},
          {"host", host_json(g.host)},
          {"with_more_ram", more_ram_json(g.more_ram)},
          {"with_activation_offload", activation_offload_json(g.with_activation_offload)},
          {"job", job_json(g.job_cost)},
          {"nvme_wear", wear_json(g)}};
}

json deepspeed_json(const DeepSpeedComparison& c, const OffloadEstimate& strata_least) {
  const auto ratio = [](double a, double b) { return b > 0 ? json(a / b) : json(nullptr); };
  const DeepSpeedEstimate& d = c.deepspeed;
  const OffloadEstimate& e = d.offload;
  json out = offload_json(e);
  out["name"] = d.name;
  out["deepspeed_knob_factor"] = d.knob_factor;
  out["host_bytes_steps"] = d.host_bytes_steps;
  out["host_moment"] = d.host_moment;
  out["pinned_bytes"] = e.peak_pinned_bytes;
  out["stall_seconds"] = e.stall_seconds;
  out["nvme_io_per_step"] = {
      {"parameter_reads", d.io.parameter_reads}, {"gradient_writes", d.io.gradient_writes},
      {"state_reads", d.io.state_reads},         {"gradient_reads", d.io.gradient_reads},
      {"state_writes", d.io.state_writes},       {"parameter_writes", d.io.parameter_writes}};
  out["buffers"] = deepspeed_buffers_json(d.buffers);
  out["fits_host"] = c.fits_host ? json(*c.fits_host) : json(nullptr);
  out["strata_equal_ram"] = offload_json(c.strata_equal_ram);
  out["host_ratio_each_side_least"] =
      ratio(static_cast<double>(strata_least.host_bytes), static_cast<double>(e.host_bytes));
  out["step_time_ratio_each_side_least"] = ratio(strata_least.step_seconds, e.step_seconds);
  out["step_time_ratio_equal_ram"] = ratio(c.strata_equal_ram.step_seconds, e.step_seconds);
  return out;
}

json like_for_like_json(const Plan& plan) {
  const OffloadComparison& c = plan.like_for_like;
  json estimate = nullptr;
  if (c.deepspeed_estimate) {
    estimate = {{"function", "estimate_zero3_model_states_mem_needs"},
                {"offload", "cpu (offload_param and offload_optimizer), zero_init"},
                {"cpu_bytes", c.deepspeed_estimate->cpu_bytes},
                {"gpu_bytes_per_gpu", c.deepspeed_estimate->gpu_bytes}};
  }
  const bool simulated = c.strata_not_simulated.empty();
  json out = {{"strata_least_ram", simulated ? offload_json(c.strata_least) : json(nullptr)},
              {"strata_not_simulated", simulated ? json(nullptr) : json(c.strata_not_simulated)},
              {"deepspeed_estimator", estimate},
              {"deepspeed_knob_factor", plan.request.deepspeed_knob_factor}};
  json configurations = json::array();
  for (const DeepSpeedComparison& d : c.deepspeed) {
    configurations.push_back(deepspeed_json(d, c.strata_least));
  }
  out["deepspeed"] = configurations;
  out["deepspeed_why_not"] = c.deepspeed.empty() ? json(c.deepspeed_why_not) : json(nullptr);
  // deepspeed-defaults under the names the block had before the labelled configurations.
  if (!c.deepspeed.empty()) {
    const json defaults = configurations.front();
    out["zero_infinity"] = defaults;
    out["strata_equal_ram"] = defaults["strata_equal_ram"];
    for (const char* key : {"host_ratio_each_side_least", "step_time_ratio_each_side_least",
                            "step_time_ratio_equal_ram"}) {
      out[key] = defaults[key];
    }
  } else {
    for (const char* key : {"zero_infinity", "strata_equal_ram", "host_ratio_each_side_least",
                            "step_time_ratio_each_side_least", "step_time_ratio_equal_ram"}) {
      out[key] = nullptr;
    }
  }
  return out;
}

}  // namespace

json deepspeed_buffers_json(const std::vector<deepspeed::BufferSpec>& buffers) {
  json out = json::array();
  for (const deepspeed::BufferSpec& b : buffers) {
    out.push_back({{"name", b.name},
                   {"count", b.count},
                   {"bytes_each", b.each_bytes},
                   {"held_bytes", b.held_bytes()},
                   {"pinned", b.pinned},
                   {"rounded", b.pinned && b.each_held != b.each_bytes},
                   {"startup_copy", b.zero_source},
                   {"life", to_string(b.life)},
                   {"when", b.when},
                   {"deepspeed_source", b.source}});
  }
  return out;
}

json plan_to_json(const Plan& plan) {
  const PlanRequest& r = plan.request;
  const GpuPlan& p = plan.gpus.at(plan.primary);
  json gpus = json::array();
  for (const GpuPlan& g : plan.gpus) gpus.push_back(gpu_json(g));
  json cheapest = json::object();
  for (int tier = 0; tier < 3; ++tier) {
    const CheapestOption& c = plan.cheapest[tier];
    cheapest[kPriceTierNames[tier]] = c.found ? json{{"gpu", c.gpu},
                                                     {"count", c.count},
                                                     {"usd_per_mtok", c.usd_per_mtok},
                                                     {"job_usd", optional_json(c.job_usd)}}
                                              : json(nullptr);
  }
  json advice = json::array();
  for (const Advice& a : plan.advice) {
    advice.push_back({{"knob", a.knob},
                      {"reason", a.reason},
                      {"tokens_per_s", a.tokens_per_s},
                      {"usd_per_mtok_typical", a.usd_per_mtok_typical},
                      {"speedup", a.speedup}});
  }
  const HostHeadroom& headroom = r.assume.host_headroom;
  // deepspeed-defaults, the configuration `zero_infinity` names (null where none applies).
  const json like_for_like = like_for_like_json(plan);
  const json& zero_infinity = like_for_like["zero_infinity"];
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
      {"host", host_json(p.host)},
      {"host_ram_assumed", !r.host_ram_bytes},
      {"with_more_ram", more_ram_json(p.more_ram)},
      {"with_activation_offload", activation_offload_json(p.with_activation_offload)},
      {"nvme_bytes", p.nvme_bytes},
      {"step_seconds", p.step_seconds},
      {"tokens_per_step", p.tokens_per_step},
      {"tokens_per_s", p.tokens_per_s},
      {"bottleneck", p.bottleneck},
      {"attention", to_string(r.attention)},
      {"attention_flops_per_token", attention_flops_per_token(r.model, r.seq_len, r.checkpointing)},
      {"activation_offload", to_string(r.activation_offload)},
      {"activations_offloaded_bytes", p.activations_offloaded_bytes},
      {"job", job_json(p.job_cost)},
      {"nvme_wear", wear_json(p)},
      {"advice", advice},
      {"like_for_like", like_for_like},
      {"stages", offload_json(p.stages)},
      {"strata_nvme",
       plan.strata_nvme.policy.empty() ? json(nullptr) : offload_json(plan.strata_nvme)},
      {"zero_infinity", zero_infinity},
      {"nvme",
       {{"label", r.nvme.label},
        {"read_gbps", r.nvme.read_gbps},
        {"write_gbps", r.nvme.write_gbps},
        {"drives", std::max<uint32_t>(r.nvme.drives, 1)},
        {"drives_assumed", r.nvme.drives == 0},
        {"drive", r.nvme_drive.name},
        {"capacity_tb_per_drive",
         r.nvme_drive.capacity_tb > 0 ? json(r.nvme_drive.capacity_tb) : json(nullptr)},
        {"tbw_tb_per_drive", r.nvme_drive.tbw_tb}}},
      {"assumptions",
       {{"mfu", r.assume.mfu},
        {"adam_params_per_s", r.assume.adam_params_per_s},
        {"pcie_efficiency", r.assume.pcie_efficiency},
        {"host_scan_gbps", r.assume.host_scan_gbps},
        {"cuda_context_bytes", r.assume.cuda_context_bytes},
        {"host_headroom_fraction", headroom.fraction},
        {"host_reserve_bytes", headroom.reserve_bytes},
        {"nvme_wear_warn_fraction", r.assume.nvme_wear_warn_fraction},
        {"simulated_warmup_steps", r.simulated_warmup_steps}}},
      {"host_ram_bytes", r.host_ram_bytes ? json(*r.host_ram_bytes) : json(nullptr)},
      {"gpus", gpus},
      {"cheapest", cheapest},
      {"fits_anywhere", plan.any_fits()},
  };
}

}  // namespace strata
