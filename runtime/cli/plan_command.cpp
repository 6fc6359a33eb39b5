// `strata plan`: whether a fine-tuning job fits each GPU, its host RAM and NVMe needs, its step
// time and its cost per million tokens - before anyone rents a machine. The numbers come from
// runtime/model/plan.h; this file turns flags into a PlanRequest and a plan into text or JSON.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/units.h"
#include "model/plan.h"
#include "model/plan_report.h"
#include "report.h"

namespace strata::cli {
namespace {

struct PlanOptions {
  std::string model;
  std::string method = "full";
  uint32_t lora_rank = 16;
  std::string lora_targets = "all-linear";
  std::string precision = "bf16";
  uint64_t seq = 4096;
  uint64_t batch = 1;
  uint64_t grad_accum = 1;
  std::string checkpointing = "full";
  std::vector<std::string> gpus;
  std::string host_ram;
  std::string nvme = "1:gen4";
  std::string offload;
  double mfu = 0.4;
  double adam_gparams = 2.0;
  double pcie_efficiency = 0;
  bool json = false;
};

// 68976648192 -> "68,976,648,192".
std::string grouped(uint64_t value) {
  std::string digits = std::to_string(value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string human_seconds(double s) {
  if (s < 1) return bench::fixed(s * 1000, 1) + " ms";
  if (s < 600) return bench::fixed(s, 2) + " s";
  if (s < 3 * 3600) return bench::fixed(s / 60, 1) + " min";
  return bench::fixed(s / 3600, 1) + " h";
}

std::string money(double usd) {
  return "$" + bench::fixed(usd, usd < 1 ? 3 : 2);
}

Result<PlanRequest> to_request(const PlanOptions& o) {
  PlanRequest r;
  Result<ModelConfig> model = load_model(o.model);
  if (!model) return std::move(model).take_status();
  r.model = *model;
  Result<FinetuneMethod> method = parse_method(o.method);
  if (!method) return std::move(method).take_status();
  r.method = *method;
  r.lora_rank = o.lora_rank;
  Result<LoraTargets> targets = parse_lora_targets(o.lora_targets);
  if (!targets) return std::move(targets).take_status();
  r.lora_targets = *targets;
  Result<DType> precision = parse_precision(o.precision);
  if (!precision) return std::move(precision).take_status();
  r.precision = *precision;
  r.seq_len = o.seq;
  r.micro_batch = o.batch;
  r.grad_accum = o.grad_accum;
  Result<Checkpointing> ckpt = parse_checkpointing(o.checkpointing);
  if (!ckpt) return std::move(ckpt).take_status();
  r.checkpointing = *ckpt;
  for (const std::string& text : o.gpus) {
    Result<GpuChoice> gpu = parse_gpu_choice(text);
    if (!gpu) return std::move(gpu).take_status();
    r.gpus.push_back(*gpu);
  }
  if (!o.host_ram.empty()) {
    std::optional<uint64_t> bytes = parse_bytes(o.host_ram);
    if (!bytes || *bytes == 0) {
      return invalid_argument("--host-ram \"" + o.host_ram + "\" is not a byte size such as 256G");
    }
    r.host_ram_bytes = *bytes;
  }
  Result<NvmeArray> nvme = parse_nvme(o.nvme);
  if (!nvme) return std::move(nvme).take_status();
  r.nvme = *nvme;
  if (!o.offload.empty()) {
    Result<Offload> offload = parse_offload(o.offload);
    if (!offload) return std::move(offload).take_status();
    r.offload = *offload;
  }
  r.assume.mfu = o.mfu;
  r.assume.adam_params_per_s = o.adam_gparams * 1e9;
  r.assume.pcie_efficiency = o.pcie_efficiency;
  STRATA_TRY(validate(r));
  return r;
}

void print_text(const Plan& plan) {
  const PlanRequest& r = plan.request;
  const ModelStates& s = plan.states;
  std::string method = to_string(r.method);
  if (r.method != FinetuneMethod::kFull) {
    method += " (rank " + std::to_string(r.lora_rank) + ", " + to_string(r.lora_targets) + ")";
  }
  std::printf("strata plan: %s, %s, %s, seq %llu x batch %llu x accum %llu, %s checkpointing\n\n",
              r.model.name.c_str(), method.c_str(), to_string(r.precision),
              static_cast<unsigned long long>(r.seq_len),
              static_cast<unsigned long long>(r.micro_batch),
              static_cast<unsigned long long>(r.grad_accum), to_string(r.checkpointing));
  std::printf("  parameters     %s (trainable %s)\n", grouped(s.params).c_str(),
              grouped(s.trainable_params).c_str());
  std::printf("  model states   %s (%s B/param)\n", format_bytes(s.model_state_bytes).c_str(),
              bench::fixed(static_cast<double>(s.model_state_bytes) / s.params, 2).c_str());

  const GpuPlan& p = plan.gpus[plan.primary];
  const GpuMemory& m = p.memory;
  std::printf("\nOn %s x%u: offload %s%s%s\n", p.choice.gpu.name.c_str(), p.choice.count,
              to_string(p.offload), p.params_resident ? "" : ", weights streamed per layer",
              p.fits() ? "" : ("  -- DOES NOT FIT: " + p.why_not).c_str());
  std::printf(
      "  GPU memory     %s of %s per GPU: weights %s, grads %s, optimizer %s,\n"
      "                 activations %s, logits %s, buffers %s, context %s\n",
      format_bytes(m.total()).c_str(), format_bytes(p.choice.gpu.memory_bytes()).c_str(),
      format_bytes(m.weights).c_str(), format_bytes(m.gradients).c_str(),
      format_bytes(m.optimizer).c_str(), format_bytes(m.activations).c_str(),
      format_bytes(m.logits).c_str(), format_bytes(m.buffers).c_str(),
      format_bytes(m.cuda_context).c_str());
  std::printf("  host RAM       %s%s\n", format_bytes(p.host_bytes).c_str(),
              r.host_ram_bytes ? (" of " + format_bytes(*r.host_ram_bytes)).c_str() : "");
  std::printf("  NVMe           %s (%s: %s / %s GB/s)\n", format_bytes(p.nvme_bytes).c_str(),
              r.nvme.label.c_str(), bench::fixed(r.nvme.read_gbps, 1).c_str(),
              bench::fixed(r.nvme.write_gbps, 1).c_str());
  const OffloadEstimate& st = p.stages;
  std::printf("  step           %s, %s tokens/s, bound by %s%s\n",
              human_seconds(p.step_seconds).c_str(), bench::fixed(p.tokens_per_s, 0).c_str(),
              p.bottleneck.c_str(), st.model == "simulated" ? " (simulated)" : "");
  std::printf("  busy           compute %s, PCIe %s, NVMe %s, CPU Adam %s",
              human_seconds(st.compute_seconds).c_str(), human_seconds(st.pcie_seconds).c_str(),
              human_seconds(st.nvme_seconds).c_str(),
              human_seconds(st.cpu_optimizer_seconds).c_str());
  if (st.model == "simulated") {
    std::printf(", GPU stalled %s", human_seconds(st.stall_seconds).c_str());
  }
  std::printf("\n");

  const OffloadEstimate& sn = plan.strata_nvme;
  const OffloadEstimate& zi = plan.zero_infinity;
  std::printf(
      "\nNVMe offload of this job on %s, Strata vs ZeRO-Infinity (simulated step, "
      "docs/planner.md):\n",
      p.choice.gpu.name.c_str());
  bench::Table versus({"", "Strata", "ZeRO-Infinity", "ratio"});
  auto ratio = [](double a, double b) { return b > 0 ? bench::fixed(a / b, 2) : std::string("-"); };
  versus.add_row({"peak host RAM", format_bytes(sn.host_bytes), format_bytes(zi.host_bytes),
                  ratio(static_cast<double>(sn.host_bytes), static_cast<double>(zi.host_bytes))});
  versus.add_row({"pinned budget", format_bytes(sn.pinned_budget_bytes),
                  format_bytes(zi.pinned_budget_bytes), ""});
  versus.add_row({"step time", human_seconds(sn.step_seconds), human_seconds(zi.step_seconds),
                  ratio(sn.step_seconds, zi.step_seconds)});
  versus.add_row(
      {"GPU stalled", human_seconds(sn.stall_seconds), human_seconds(zi.stall_seconds), ""});
  versus.add_row(
      {"NVMe read / step", format_bytes(sn.nvme_read_bytes), format_bytes(zi.nvme_read_bytes), ""});
  versus.add_row({"NVMe written / step", format_bytes(sn.nvme_write_bytes),
                  format_bytes(zi.nvme_write_bytes), ""});
  versus.add_row({"bound by", sn.bottleneck, zi.bottleneck, ""});
  if (r.host_ram_bytes) {
    versus.add_row({"fits " + format_bytes(*r.host_ram_bytes) + " RAM",
                    sn.host_bytes <= *r.host_ram_bytes ? "yes" : "no",
                    zi.host_bytes <= *r.host_ram_bytes ? "yes" : "no", ""});
  }
  std::fputs(versus.render().c_str(), stdout);

  std::printf("\nEvery GPU (prices: USD per GPU-hour, low / typical / high):\n");
  bench::Table table({"gpu", "fits", "offload", "GPU mem", "host", "step", "tok/s", "h/Mtok",
                      "$/Mtok low", "typical", "high"});
  for (const GpuPlan& g : plan.gpus) {
    const std::string name =
        g.choice.gpu.name + (g.choice.count > 1 ? ":" + std::to_string(g.choice.count) : "");
    table.add_row({name, g.fits() ? "yes" : "no", to_string(g.offload),
                   format_bytes(g.memory.total()), format_bytes(g.host_bytes),
                   human_seconds(g.step_seconds), bench::fixed(g.tokens_per_s, 0),
                   bench::fixed(g.hours_per_mtok, 2), money(g.usd_per_mtok[0]),
                   money(g.usd_per_mtok[1]), money(g.usd_per_mtok[2])});
  }
  std::fputs(table.render().c_str(), stdout);
  std::printf("\nCheapest that fits:");
  for (int tier = 0; tier < 3; ++tier) {
    const CheapestOption& c = plan.cheapest[tier];
    std::printf("%s %s %s", tier ? ";" : "", kPriceTierNames[tier],
                c.found ? (c.gpu + (c.count > 1 ? ":" + std::to_string(c.count) : "") + " " +
                           money(c.usd_per_mtok) + "/Mtok")
                              .c_str()
                        : "none");
  }
  std::printf(
      "\nAssumed: MFU %s, CPU Adam %s Gparam/s, PCIe %s, NVMe %s. Host RAM and step time of\n"
      "NVMe offload come from a simulated step of the scheduler (sched::simulate).\n",
      bench::fixed(r.assume.mfu, 2).c_str(),
      bench::fixed(r.assume.adam_params_per_s / 1e9, 1).c_str(),
      r.assume.pcie_efficiency > 0
          ? (bench::fixed(r.assume.pcie_efficiency, 2) + " x link rate").c_str()
          : "measured pinned-copy rate",
      r.nvme.label.c_str());
}

int run_plan(const PlanOptions& options) {
  Result<PlanRequest> request = to_request(options);
  if (!request) {
    std::fprintf(stderr, "strata plan: %s\n", request.status().message().c_str());
    return 2;
  }
  Result<Plan> plan = make_plan(*request);
  if (!plan) {
    std::fprintf(stderr, "strata plan: %s\n", plan.status().message().c_str());
    return 2;
  }
  if (options.json) {
    std::printf("%s\n", plan_to_json(*plan).dump(2).c_str());
  } else {
    print_text(*plan);
  }
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Memory, host RAM, NVMe, step time and cost of a fine-tuning job on each GPU");
  cmd->add_option("--model", options->model, "Preset name (e.g. llama-2-70b) or HF config.json")
      ->required();
  cmd->add_option("--method", options->method, "full | lora | qlora")->capture_default_str();
  cmd->add_option("--lora-rank", options->lora_rank, "LoRA rank r")->capture_default_str();
  cmd->add_option("--lora-targets", options->lora_targets,
                  "all-linear, or a list of q,k,v,o,gate,up,down")
      ->capture_default_str();
  cmd->add_option("--precision", options->precision, "bf16 | fp16 | fp32")->capture_default_str();
  cmd->add_option("--seq", options->seq, "Sequence length (tokens)")->capture_default_str();
  cmd->add_option("--batch", options->batch, "Micro-batch (sequences per GPU)")
      ->capture_default_str();
  cmd->add_option("--grad-accum", options->grad_accum, "Micro-batches per optimizer step")
      ->capture_default_str();
  cmd->add_option("--checkpointing", options->checkpointing, "none | selective | full")
      ->capture_default_str();
  cmd->add_option("--gpu", options->gpus, "GPU preset NAME[:COUNT]; repeatable (default: all)");
  cmd->add_option("--host-ram", options->host_ram, "Host RAM available, e.g. 256G");
  cmd->add_option("--nvme", options->nvme, "COUNT:gen4|gen5 or READ_GBPS/WRITE_GBPS")
      ->capture_default_str();
  cmd->add_option("--offload", options->offload,
                  "none | cpu | nvme (default: the first that fits, per GPU)");
  cmd->add_option("--mfu", options->mfu, "Achieved fraction of dense peak FLOPS")
      ->capture_default_str();
  cmd->add_option("--adam-rate", options->adam_gparams, "CPU Adam, billions of parameters/s")
      ->capture_default_str();
  cmd->add_option("--pcie-efficiency", options->pcie_efficiency,
                  "Fraction of the PCIe link rate (0: measured pinned-copy rate of the preset)")
      ->capture_default_str();
  cmd->add_flag("--json", options->json, "Print JSON instead of tables");
  cmd->callback([options] {
    const int rc = run_plan(*options);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace strata::cli
