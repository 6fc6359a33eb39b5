// `strata plan`: whether a fine-tuning job fits each GPU, its host RAM and NVMe needs, its step
// time and its cost per million tokens - before anyone rents a machine. The numbers come from
// runtime/model/plan.h; this file turns flags into a PlanRequest and a plan into text or JSON.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/report.h"
#include "common/units.h"
#include "model/plan.h"
#include "model/plan_report.h"
#include "storage/output_path.h"

namespace strata::cli {
namespace {

struct PlanOptions {
  std::string model;
  double scale = 1.0;  // the model narrowed as `strata bench finetune --scale` does
  int layers = -1;     // and cut to this many layers (-1: all)
  std::string method = "full";
  uint32_t lora_rank = 16;
  std::string lora_targets = "all-linear";
  bool lora_options_given = false;  // --lora-rank or --lora-targets on the command line
  bool nvme_given = false;          // --nvme on the command line (else 1:gen4, or the drive's)
  std::string precision = "bf16";
  uint64_t seq = 4096;
  uint64_t batch = 1;
  uint64_t grad_accum = 1;
  std::string checkpointing = "full";
  std::vector<std::string> gpus;
  std::string host_ram;
  std::string pinned_budget;
  std::string device_budget;
  std::string stream_chunk;     // with pinned_budget: the run's stream chunk
  uint32_t stream_buffers = 0;  // with pinned_budget: the run's staging buffers per direction
  std::string sub_group_bytes;  // with pinned_budget: the run's optimizer sub-group per state
  uint32_t optimizer_threads = kPlanOptimizerThreads;
  uint32_t drive_queue_depth = kPlanDriveQueueDepth;
  uint32_t warmup_steps = 1;  // simulated steps before the measured one
  std::string nvme = "1:gen4";
  std::string nvme_drive;
  std::optional<double> nvme_tbw;
  std::string offload;
  std::string attention = "flash";
  std::string activation_offload = "none";
  std::optional<double> tokens;
  std::optional<double> epochs;
  std::optional<double> dataset_tokens;
  double host_headroom = 0.10;
  std::string host_reserve = "8G";
  double mfu = 0.4;
  double adam_gparams = 2.0;
  double pcie_efficiency = 0;
  bool json = false;
  std::string trace;  // --trace FILE: the headline's simulated steps as a Chrome trace
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
  if (s < 1) return fixed(s * 1000, 1) + " ms";
  if (s < 600) return fixed(s, 2) + " s";
  if (s < 3 * 3600) return fixed(s / 60, 1) + " min";
  return fixed(s / 3600, 1) + " h";
}

// "$0.241", "$12.14", "$1,447.60": thousands grouped, as the job prices grow large.
std::string money(double usd) {
  const std::string digits = fixed(usd, usd < 1 ? 3 : 2);
  const size_t point = digits.find('.');
  const auto whole = static_cast<uint64_t>(std::strtoull(digits.c_str(), nullptr, 10));
  return "$" + grouped(whole) + (point == std::string::npos ? "" : digits.substr(point));
}

Result<PlanRequest> to_request(const PlanOptions& o) {
  PlanRequest r;
  Result<ModelConfig> model = load_model(o.model);
  if (!model) return std::move(model).take_status();
  r.model = *model;
  if (o.scale != 1.0 || o.layers != -1) {
    // The shapes `strata bench finetune` runs, so that a plan can be checked against a run:
    // narrower and shallower only (DeepSpeed's knobs scale with the model, down).
    if (!(o.scale > 0.0 && o.scale <= 1.0)) {
      return invalid_argument(
          "--scale narrows the model, as strata bench finetune --scale does: "
          "it must be in (0, 1], not " +
          fixed(o.scale, 3) + " (for a wider model, give its config.json to --model)");
    }
    const auto model_layers = static_cast<int>(r.model.num_hidden_layers);
    if (o.layers != -1 && (o.layers < 1 || o.layers > model_layers)) {
      return invalid_argument("--layers keeps that many of " + o.model + "'s " +
                              std::to_string(model_layers) + " layers: 1.." +
                              std::to_string(model_layers) + ", not " + std::to_string(o.layers) +
                              " (for a deeper model, give its config.json to --model)");
    }
    STRATA_TRY(check_scale_options(o.scale, o.layers));
    r.model = scale_model(r.model, o.scale, o.layers);
    // DeepSpeed's element-count knobs shrink with the model, as the benchmark shrinks them
    // (bench/finetune/finetune_options.cpp), so the scaled plan predicts the scaled run.
    r.deepspeed_knob_factor = static_cast<double>(parameter_count(r.model)) /
                              static_cast<double>(parameter_count(*model));
  }
  Result<FinetuneMethod> method = parse_method(o.method);
  if (!method) return std::move(method).take_status();
  r.method = *method;
  if (r.method == FinetuneMethod::kFull && o.lora_options_given) {
    return invalid_argument(
        "--lora-rank and --lora-targets apply to --method lora and qlora; "
        "--method full trains every weight");
  }
  r.lora_rank = o.lora_rank;
  STRATA_ASSIGN_OR_RETURN(LoraTargets targets, parse_lora_targets(o.lora_targets));
  r.lora_targets = targets;
  Result<DType> precision = parse_precision(o.precision);
  if (!precision) return std::move(precision).take_status();
  r.precision = *precision;
  r.seq_len = o.seq;
  r.micro_batch = o.batch;
  r.grad_accum = o.grad_accum;
  STRATA_ASSIGN_OR_RETURN(Checkpointing ckpt, parse_checkpointing(o.checkpointing));
  r.checkpointing = ckpt;
  for (const std::string& text : o.gpus) {
    STRATA_ASSIGN_OR_RETURN(GpuChoice gpu, parse_gpu_choice(text));
    for (const GpuChoice& earlier : r.gpus) {
      if (earlier.gpu.name == gpu.gpu.name && earlier.count == gpu.count &&
          earlier.auto_count == gpu.auto_count) {
        return invalid_argument("--gpu " + text + " is given twice: it would be the same row");
      }
    }
    r.gpus.push_back(gpu);
  }
  // A budget replayed from a run: unset when the option is absent.
  const auto budget = [](const std::string& text,
                         const char* option) -> Result<std::optional<uint64_t>> {
    if (text.empty()) return std::optional<uint64_t>();
    std::optional<uint64_t> bytes = parse_bytes(text);
    if (!bytes) {
      return invalid_argument(std::string(option) + " \"" + text +
                              "\" is not a byte size such as 1000M");
    }
    return bytes;
  };
  STRATA_ASSIGN_OR_RETURN(r.strata_pinned_budget_bytes, budget(o.pinned_budget, "--pinned-budget"));
  STRATA_ASSIGN_OR_RETURN(r.strata_device_budget_bytes, budget(o.device_budget, "--device-budget"));
  STRATA_ASSIGN_OR_RETURN(std::optional<uint64_t> chunk, budget(o.stream_chunk, "--stream-chunk"));
  STRATA_ASSIGN_OR_RETURN(std::optional<uint64_t> sub_group,
                          budget(o.sub_group_bytes, "--sub-group-bytes"));
  r.strata_pinned_given = {chunk.value_or(0), o.stream_buffers, sub_group.value_or(0)};
  r.simulated_warmup_steps = o.warmup_steps;
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
  if (!o.nvme_drive.empty()) {
    STRATA_ASSIGN_OR_RETURN(NvmeDrive drive, find_nvme_drive(o.nvme_drive));
    r.nvme_drive = drive;
    // A drive named alone is one such drive at its own generation's rates (a Gen5 drive had
    // Gen4's, the default --nvme, without a word). Named with --nvme, the rates are --nvme's:
    // a Gen5 drive in a Gen4 slot runs at Gen4's.
    if (!o.nvme_given) {
      STRATA_ASSIGN_OR_RETURN(r.nvme, parse_nvme("1:gen" + std::to_string(drive.generation)));
    }
  }
  if (o.nvme_tbw) {
    if (!(*o.nvme_tbw > 0)) return invalid_argument("--nvme-tbw must be positive (TB per drive)");
    // Without --nvme-drive the generation's default drive is filled in later (start_gpu_plans),
    // keeping this rating and that drive's capacity.
    r.nvme_drive.tbw_tb = *o.nvme_tbw;
  }
  Result<Attention> attention = parse_attention(o.attention);
  if (!attention) return std::move(attention).take_status();
  r.attention = *attention;
  STRATA_ASSIGN_OR_RETURN(r.activation_offload, parse_activation_offload(o.activation_offload));
  STRATA_ASSIGN_OR_RETURN(std::optional<double> tokens,
                          job_tokens(o.tokens, o.epochs, o.dataset_tokens));
  r.job_tokens = tokens;
  r.assume.host_headroom.fraction = o.host_headroom;
  std::optional<uint64_t> reserve = parse_bytes(o.host_reserve);
  if (!reserve) {
    return invalid_argument("--host-reserve \"" + o.host_reserve +
                            "\" is not a byte size such as 8G");
  }
  r.assume.host_headroom.reserve_bytes = *reserve;
  if (!o.offload.empty()) {
    Result<Offload> offload = parse_offload(o.offload);
    if (!offload) return std::move(offload).take_status();
    r.offload = *offload;
  }
  r.assume.mfu = o.mfu;
  r.assume.adam_params_per_s = o.adam_gparams * 1e9;
  r.assume.pcie_efficiency = o.pcie_efficiency;
  r.assume.optimizer_threads = o.optimizer_threads;
  r.assume.drive_queue_depth = o.drive_queue_depth;
  if (o.optimizer_threads == 0 || o.drive_queue_depth == 0) {
    return invalid_argument("--optimizer-threads and --drive-queue-depth must be at least 1");
  }
  STRATA_TRY(validate(r));
  return r;
}

std::string gpu_label(const GpuChoice& c) {
  return c.gpu.name + (c.count > 1 || c.auto_count ? ":" + std::to_string(c.count) : "");
}

std::string percent(double fraction) {
  return fixed(fraction * 100, fraction < 0.1 ? 2 : 1) + "%";
}

void print_host(const Plan& plan, const GpuPlan& p) {
  const PlanRequest& r = plan.request;
  const HostHeadroom& headroom = r.assume.host_headroom;
  const std::string margin = "+" + fixed(headroom.fraction * 100, 0) + "% + " +
                             format_bytes(headroom.reserve_bytes) + " for OS, framework, loader";
  std::printf("  host RAM       job %s, recommended %s (%s)\n",
              format_bytes(p.host.job_bytes).c_str(),
              format_bytes_up(p.host.recommended_bytes).c_str(), margin.c_str());
  if (r.host_ram_bytes) {
    std::printf("                 %s given: %s\n", format_bytes(*r.host_ram_bytes).c_str(),
                p.fits_host ? "fits within the recommended figure" : "too little");
  } else if (p.offload == Offload::kNvme && r.strata_pinned_budget_bytes) {
    std::printf(
        "                 no --host-ram given: the pinned budget --pinned-budget gives "
        "(pinned pool %s)\n",
        format_bytes(p.stages.pinned_budget_bytes).c_str());
  } else if (p.offload == Offload::kNvme) {
    const bool kept =
        p.activations_offloaded_bytes != 0 && r.activation_offload == ActivationOffload::kPinned;
    std::printf(
        "                 no --host-ram given: Strata's automatic pinned budget, the least that "
        "keeps the drives at full speed%s (pinned pool %s)\n",
        kept ? ", plus the offloaded activations kept there" : "",
        format_bytes(p.stages.pinned_budget_bytes).c_str());
  } else if (p.offload == Offload::kCpu) {
    std::printf(
        "                 no --host-ram given: CPU offload holds every state in RAM, so the job "
        "needs the recommended figure; give --host-ram to check it has it\n");
  }
  if (p.offload != Offload::kNvme && p.stages.activations_alone_step_seconds > 0) {
    std::printf(
        "                 with Strata's pinned pool the offloaded activations pass through to "
        "NVMe (%s: %s)\n",
        format_bytes(p.stages.pinned_budget_bytes).c_str(),
        r.strata_pinned_budget_bytes ? "--pinned-budget's"
        : p.stages.pinned_budget_from_ram
            ? "what the RAM given leaves beside the states: the pinned budget to set"
            : "its automatic budget, the drive's");
  }
  // NVMe offload, or activations to NVMe with the states elsewhere: the pool's derivation.
  for (const std::string& line : p.stages.pinned_derivation) {
    std::printf("  pinned         %s\n", line.c_str());
  }
  if (p.offload != Offload::kNone || p.host.full_speed_bytes != 0) {
    // What the figure holds: the states CPU offload keeps, the offloaded activations, or both.
    const uint64_t activations = activations_held_bytes(p);
    const bool states = p.host.full_speed_bytes > activations;
    // NVMe asked for (the states' offload, or activations sent there) where keeping everything
    // in RAM takes no more than this plan's own recommended RAM (its staging and optimizer pool
    // can outweigh what it spills): say so, and which flags do it, or "less means NVMe traffic"
    // reads as if this plan's RAM were short of full speed.
    const bool activations_to_nvme =
        r.activation_offload == ActivationOffload::kNvme && activations != 0;
    std::string keep;  // the flags that keep everything in RAM
    if (p.offload == Offload::kNvme) keep = states ? "--offload cpu" : "--offload none";
    if (activations_to_nvme)
      keep += std::string(keep.empty() ? "" : " ") + "--activation-offload pinned";
    const bool covered =
        !keep.empty() && p.host.full_speed_recommended_bytes <= p.host.recommended_bytes;
    if (p.host.full_speed_bytes == 0) {  // the GPU holds every state and no activation moves
      std::printf(
          "  full speed     the GPU holds every state: nothing needs RAM or NVMe "
          "(--offload none)\n");
    } else {
      std::printf(
          "  full speed     %s of %s in RAM, nothing on NVMe: recommended %s%s\n",
          format_bytes(p.host.full_speed_bytes).c_str(),
          states && activations != 0 ? "states and activations"
          : activations != 0         ? "activations"
                                     : "states",
          format_bytes_up(p.host.full_speed_recommended_bytes).c_str(),
          covered ? (", no more than this plan's: " + keep + " keeps them in it").c_str() : "");
    }
  }
  if (p.more_ram) {
    const RamUpgrade& m = *p.more_ram;
    // A row that does not fit has no price (the table's rule), here as there.
    std::printf("  with %s RAM: cpu offload, %s, %s tokens/s (x%s), %s/Mtok typical (now %s)\n",
                format_bytes_up(m.host_ram_bytes).c_str(), human_seconds(m.step_seconds).c_str(),
                fixed(m.tokens_per_s, 0).c_str(), fixed(m.tokens_per_s / p.tokens_per_s, 1).c_str(),
                money(m.usd_per_mtok[1]).c_str(),
                p.fits() ? money(p.usd_per_mtok[1]).c_str() : "it does not fit");
  }
}

void print_wear(const Plan& plan, const GpuPlan& p) {
  if (!p.nvme_wear.reported) return;
  const PlanRequest& r = plan.request;
  const NvmeWear& w = p.nvme_wear;
  if (w.write_bytes_per_step == 0) {
    // A frozen base streamed from NVMe is only read; activations the pool holds all of, neither.
    std::printf("  SSD wear       nothing written per step: %s\n",
                p.stages.nvme_read_bytes != 0 ? "the drives are only read"
                                              : "nothing reaches the drives (the pool holds it)");
    return;
  }
  std::printf(
      "  SSD wear       %s TB written per step; %u x %s (%s TBW each%s) rated for %s steps\n",
      fixed(static_cast<double>(w.write_bytes_per_step) / 1e12, 3).c_str(),
      std::max<uint32_t>(r.nvme.drives, 1), r.nvme_drive.name.c_str(),
      fixed(r.nvme_drive.tbw_tb, 0).c_str(),
      r.nvme.drives == 0 ? "; one drive assumed: --nvme COUNT:READ/WRITE counts them" : "",
      // Whole steps the rating covers: rounded down (to nearest it promised 12,600 of 12,599.87).
      grouped(static_cast<uint64_t>(std::floor(w.steps_to_endurance))).c_str());
  if (w.job_share) {
    std::printf(
        "                 job: %s TB, %s of the rated endurance%s\n",
        fixed(*w.job_write_bytes / 1e12, 1).c_str(), percent(*w.job_share).c_str(),
        w.warn
            ? ("  -- WARNING: above " + percent(r.assume.nvme_wear_warn_fraction) +
               "; more RAM, more drives (--nvme COUNT:...), drives rated for more (--nvme-drive), "
               "or more tokens per optimizer step (--grad-accum)")
                  .c_str()
            : "");
  }
}

void print_deepspeed_estimate(const OffloadComparison& c) {
  if (!c.deepspeed_estimate) return;
  std::printf(
      "DeepSpeed's own estimate_zero3_model_states_mem_needs (offload_param + offload_optimizer "
      "to CPU, zero_init): CPU %s, GPU %s per GPU.\n",
      format_bytes(c.deepspeed_estimate->cpu_bytes).c_str(),
      format_bytes(c.deepspeed_estimate->gpu_bytes).c_str());
}

void print_comparison(const Plan& plan, const GpuPlan& p) {
  const PlanRequest& r = plan.request;
  const OffloadComparison& c = plan.like_for_like;
  if (!c.strata_not_simulated.empty()) {
    std::printf("\nNVMe offload of this job on %s, Strata vs DeepSpeed ZeRO-3: not compared: %s.\n",
                p.choice.gpu.name.c_str(), c.strata_not_simulated.c_str());
    print_deepspeed_estimate(c);
    return;
  }
  std::printf(
      "\nNVMe offload of this job on %s, Strata (simulated step) vs DeepSpeed ZeRO-3's labelled "
      "configurations (its buffers and requests, analytic; docs/planner.md)%s:\n",
      p.choice.gpu.name.c_str(),
      r.activation_offload == ActivationOffload::kNone
          ? ""
          : ", the model states only (neither side offloads activations here)");
  std::vector<std::string> header = {"", "Strata least RAM"};
  std::vector<const OffloadEstimate*> columns = {&c.strata_least};
  if (r.host_ram_bytes) header.push_back("Strata given RAM"), columns.push_back(&plan.strata_nvme);
  for (const DeepSpeedComparison& d : c.deepspeed) {
    header.push_back(d.deepspeed.name);
    columns.push_back(&d.deepspeed.offload);
  }
  Table versus(header);
  auto row = [&](const std::string& name, auto cell) {
    std::vector<std::string> cells = {name};
    for (const OffloadEstimate* e : columns) cells.push_back(cell(*e));
    versus.add_row(cells);
  };
  row("peak host RAM", [](const OffloadEstimate& e) { return format_bytes(e.host_bytes); });
  // Strata's pool is sized by its budget (taken on demand, page by page, up to it); DeepSpeed's
  // buffers are pinned whole, so its peak is what it pins.
  row("pinned (Strata: budget)", [](const OffloadEstimate& e) {
    return format_bytes(e.model == "simulated" ? e.pinned_budget_bytes : e.peak_pinned_bytes);
  });
  row("step time", [](const OffloadEstimate& e) { return human_seconds(e.step_seconds); });
  row("GPU stalled", [](const OffloadEstimate& e) { return human_seconds(e.stall_seconds); });
  row("NVMe read / step", [](const OffloadEstimate& e) { return format_bytes(e.nvme_read_bytes); });
  row("NVMe written / step",
      [](const OffloadEstimate& e) { return format_bytes(e.nvme_write_bytes); });
  row("bound by", [](const OffloadEstimate& e) { return e.bottleneck; });
  if (r.host_ram_bytes) {
    const uint64_t ram = *r.host_ram_bytes;
    row("fits " + format_bytes(ram) + " RAM", [&](const OffloadEstimate& e) {
      return recommended_host_bytes(e.host_bytes, r.assume.host_headroom) <= ram ? "yes" : "no";
    });
  }
  std::fputs(versus.render().c_str(), stdout);
  auto ratio = [](double a, double b) { return b > 0 ? fixed(a / b, 2) : std::string("-"); };
  if (c.deepspeed.empty())
    std::printf("DeepSpeed: not modelled (%s).\n", c.deepspeed_why_not.c_str());
  if (r.deepspeed_knob_factor != 1.0 && !c.deepspeed.empty()) {
    std::printf("DeepSpeed's element-count knobs scaled by %s, as strata bench finetune does.\n",
                fixed(r.deepspeed_knob_factor, 5).c_str());
  }
  for (const DeepSpeedComparison& d : c.deepspeed) {
    const OffloadEstimate& ds = d.deepspeed.offload;
    std::printf(
        "Against %s: each side's least RAM: host %s, step %s; Strata given its %s: step %s.\n",
        d.deepspeed.name.c_str(),
        ratio(static_cast<double>(c.strata_least.host_bytes), static_cast<double>(ds.host_bytes))
            .c_str(),
        ratio(c.strata_least.step_seconds, ds.step_seconds).c_str(),
        format_bytes(ds.host_bytes).c_str(),
        ratio(d.strata_equal_ram.step_seconds, ds.step_seconds).c_str());
  }
  print_deepspeed_estimate(c);
}

void print_text(const Plan& plan) {
  const PlanRequest& r = plan.request;
  const ModelStates& s = plan.states;
  std::string method = to_string(r.method);
  if (r.method != FinetuneMethod::kFull) {
    method += " (rank " + std::to_string(r.lora_rank) + ", " + to_string(r.lora_targets) + ")";
  }
  std::printf(
      "strata plan: %s, %s, %s, seq %llu x batch %llu x accum %llu, %s checkpointing, %s "
      "attention%s\n\n",
      r.model.name.c_str(), method.c_str(), to_string(r.precision),
      static_cast<unsigned long long>(r.seq_len), static_cast<unsigned long long>(r.micro_batch),
      static_cast<unsigned long long>(r.grad_accum),
      r.checkpointing == Checkpointing::kNone ? "no" : to_string(r.checkpointing),
      to_string(r.attention),
      r.activation_offload == ActivationOffload::kNone ? ""
      : r.activation_offload == ActivationOffload::kNvme
          ? ", activations offloaded to NVMe"
          : ", activations offloaded to pinned memory");
  std::printf("  parameters     %s (trainable %s)\n", grouped(s.params).c_str(),
              grouped(s.trainable_params).c_str());
  // fp32 weights: torch's AdamW keeps no master, an offload engine its own (docs/planner.md).
  const bool own_master = r.precision == DType::kFloat32 && r.method == FinetuneMethod::kFull;
  std::printf("  model states   %s (%s B/param%s)\n", format_bytes(s.model_state_bytes).c_str(),
              fixed(static_cast<double>(s.model_state_bytes) / s.params, 2).c_str(),
              own_master ? " as torch's AdamW keeps them; 20 under CPU or NVMe offload, whose "
                           "optimizer keeps an fp32 master of its own"
                         : "");
  std::printf(
      "  attention      %s GFLOP per token (12 x L x heads x head_dim x s%s)\n",
      fixed(attention_flops_per_token(r.model, r.seq_len, r.checkpointing) / 1e9, 2).c_str(),
      r.checkpointing == Checkpointing::kFull ? ", + 4 x ... recomputed" : "");

  const GpuPlan& p = plan.gpus[plan.primary];
  const GpuMemory& m = p.memory;
  std::printf("\nOn %s x%u%s: offload %s%s%s\n", p.choice.gpu.name.c_str(), p.choice.count,
              !p.choice.auto_count ? ""
              : p.fits()           ? " (smallest count that fits)"
                                   : " (no count fits; shown at the largest)",
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
  if (p.with_activation_offload) {
    const ActivationUpgrade& a = *p.with_activation_offload;
    const std::string count =
        p.choice.auto_count ? " on x" + std::to_string(a.gpu_count) : std::string();
    std::printf(
        "  activations    with --activation-offload pinned: offload %s%s, GPU %s, host %s "
        "recommended%s, %s, %s tokens/s, %s/Mtok typical\n",
        to_string(a.offload), count.c_str(), format_bytes(a.gpu_bytes).c_str(),
        format_bytes_up(a.host_recommended_bytes).c_str(),
        a.fits_host ? "" : " (more than the RAM given)", human_seconds(a.step_seconds).c_str(),
        fixed(a.tokens_per_s, 0).c_str(), money(a.usd_per_mtok[1]).c_str());
  }
  if (p.activations_offloaded_bytes != 0) {
    std::printf(
        "  activations    %s a micro-batch move off each GPU to %s and back (the GPU keeps %s: "
        "one layer's)\n",
        format_bytes(p.activations_offloaded_bytes).c_str(),
        r.activation_offload == ActivationOffload::kNvme ? "NVMe, through pinned memory"
                                                         : "pinned memory",
        format_bytes(m.activations).c_str());
  }
  print_host(plan, p);
  // Measured rates are their own label ("10/5 GB/s"); a preset's label names the drives.
  if (r.nvme.generation.empty()) {
    std::printf("  NVMe           %s (%s)\n", format_bytes(p.nvme_bytes).c_str(),
                r.nvme.label.c_str());
  } else {
    std::printf("  NVMe           %s (%s: %s / %s GB/s)\n", format_bytes(p.nvme_bytes).c_str(),
                r.nvme.label.c_str(), fixed(r.nvme.read_gbps, 1).c_str(),
                fixed(r.nvme.write_gbps, 1).c_str());
  }
  const OffloadEstimate& st = p.stages;
  const bool copies = st.activation_copy_seconds > 0;
  // Activation offload under NVMe offload: the step is at least the states' alone plus the copies
  // (simulate_strata_nvme_offload); say so where that floor, not the simulated step, decided it.
  const bool floored = st.states_only_step_seconds > 0 &&
                       p.step_seconds <= st.states_only_step_seconds + st.activation_copy_seconds;
  // Activations to NVMe with the states elsewhere: the closed form, unless the simulated step of
  // the activations alone is longer (add_simulated_activations).
  const bool alone =
      st.activations_alone_step_seconds > 0 && p.step_seconds <= st.activations_alone_step_seconds;
  const std::string simulated =
      floored ? " (simulated; the states' step alone, " +
                    human_seconds(st.states_only_step_seconds) + ", plus the copies)"
      : alone ? " (simulated: the activations' way to NVMe, the states outside the simulation)"
      : st.model == "simulated" ? " (simulated)"
                                : "";
  std::printf("  step           %s, %s tokens/s, bound by %s%s%s\n",
              human_seconds(p.step_seconds).c_str(), fixed(p.tokens_per_s, 0).c_str(),
              p.bottleneck.c_str(),
              copies && p.bottleneck == "compute" ? " and the activation copies on its stream" : "",
              simulated.c_str());
  std::printf("  busy           compute %s%s%s, PCIe %s, NVMe %s, CPU optimizer %s",
              human_seconds(st.compute_seconds).c_str(), copies ? " + activation copies " : "",
              copies ? human_seconds(st.activation_copy_seconds).c_str() : "",
              human_seconds(st.pcie_seconds).c_str(), human_seconds(st.nvme_seconds).c_str(),
              human_seconds(st.cpu_optimizer_seconds).c_str());
  if (st.has_simulation()) {
    std::printf(", GPU stalled %s", human_seconds(st.stall_seconds).c_str());
  }
  std::printf("\n");
  print_wear(plan, p);
  if (r.job_tokens) {
    if (p.job_cost) {
      const JobCost& j = *p.job_cost;
      std::printf("  job            %s tokens = %s %s: %s h, %s / %s / %s (low / typical / high)\n",
                  grouped(static_cast<uint64_t>(j.tokens)).c_str(), grouped(j.steps).c_str(),
                  j.steps == 1 ? "step" : "steps", fixed(j.hours, 1).c_str(),
                  money(j.usd[0]).c_str(), money(j.usd[1]).c_str(), money(j.usd[2]).c_str());
    } else {
      std::printf("  job            not priced: it does not fit\n");
    }
  }
  for (size_t k = 0; k < plan.advice.size(); ++k) {
    const Advice& a = plan.advice[k];
    std::printf("  %s %s: %s tokens/s (x%s), %s/Mtok typical; %s\n",
                k == 0 ? "advice        " : "              ", a.knob.c_str(),
                fixed(a.tokens_per_s, 0).c_str(), fixed(a.speedup, 2).c_str(),
                money(a.usd_per_mtok_typical).c_str(), a.reason.c_str());
  }

  print_comparison(plan, p);

  std::printf(
      "\nEvery GPU (prices: USD per GPU-hour, low / typical / high; rows that do not fit "
      "are not priced):\n");
  std::vector<std::string> header = {"gpu",   "fits",   "offload",    "GPU mem", "host", "step",
                                     "tok/s", "h/Mtok", "$/Mtok low", "typical", "high"};
  if (r.job_tokens) {
    header.insert(header.end(), {"job h", "job $ low", "typical", "high"});
  }
  Table table(header);
  std::vector<std::string> why_not;
  for (const GpuPlan& g : plan.gpus) {
    std::vector<std::string> row = {gpu_label(g.choice), g.fits() ? "yes" : "no",
                                    to_string(g.offload), format_bytes(g.memory.total()),
                                    format_bytes_up(g.host.recommended_bytes)};
    if (g.fits()) {
      row.insert(row.end(), {human_seconds(g.step_seconds), fixed(g.tokens_per_s, 0),
                             fixed(g.hours_per_mtok, 2), money(g.usd_per_mtok[0]),
                             money(g.usd_per_mtok[1]), money(g.usd_per_mtok[2])});
      if (g.job_cost) {
        row.insert(row.end(), {fixed(g.job_cost->hours, 1), money(g.job_cost->usd[0]),
                               money(g.job_cost->usd[1]), money(g.job_cost->usd[2])});
      }
    } else {
      row.resize(header.size(), "-");
      why_not.push_back(gpu_label(g.choice) + ": " + g.why_not);
    }
    table.add_row(row);
  }
  std::fputs(table.render().c_str(), stdout);
  for (const std::string& line : why_not) std::printf("  does not fit: %s\n", line.c_str());
  std::printf("\nCheapest that fits:");
  for (int tier = 0; tier < 3; ++tier) {
    const CheapestOption& c = plan.cheapest[tier];
    std::string text = "none";
    if (c.found) {
      text = c.gpu + (c.count > 1 ? ":" + std::to_string(c.count) : "") + " " +
             money(c.usd_per_mtok) + "/Mtok";
      if (c.job_usd) text += " (job " + money(*c.job_usd) + ")";
    }
    std::printf("%s %s %s", tier ? ";" : "", kPriceTierNames[tier], text.c_str());
  }
  // The warm-up steps are named because they move the figures: from one, NVMe bytes and wear
  // can be about 2% above the steady step's (docs/planner.md, "Steady state").
  const uint32_t warmup = r.simulated_warmup_steps;
  const std::string steady = warmup == 1 ? "; --warmup-steps 2 gives the steady step" : "";
  std::printf(
      "\nAssumed: MFU %s, CPU Adam %s Gparam/s, PCIe %s, NVMe %s. Host RAM and step time of\n"
      "NVMe offload come from a simulated step of the scheduler (sched::simulate), the one after\n"
      "%u warm-up step%s%s. \"host\" is the recommended RAM (job + headroom).\n",
      fixed(r.assume.mfu, 2).c_str(), fixed(r.assume.adam_params_per_s / 1e9, 1).c_str(),
      r.assume.pcie_efficiency > 0 ? (fixed(r.assume.pcie_efficiency, 2) + " x link rate").c_str()
                                   : "measured pinned-copy rate",
      r.nvme.label.c_str(), warmup, warmup == 1 ? "" : "s", steady.c_str());
}

int run_plan(const PlanOptions& options) {
  Result<PlanRequest> request = to_request(options);
  if (!request) {
    std::fprintf(stderr, "strata plan: %s\n", request.status().message().c_str());
    return 2;
  }
  if (!options.trace.empty()) {
    if (Status ok = storage::check_output_path(options.trace, "--trace"); !ok.is_ok()) {
      std::fprintf(stderr, "strata plan: %s\n", ok.message().c_str());
      return 2;
    }
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
  if (!options.trace.empty()) {
    Result<telemetry::TraceStats> traced = write_strata_nvme_trace(*plan, options.trace);
    if (!traced) {
      std::fprintf(stderr, "strata plan: --trace: %s\n", traced.status().message().c_str());
      return 2;
    }
    const uint32_t steps = request->simulated_warmup_steps + 1;
    std::fprintf(stderr, "strata plan: %s: %s events of %u simulated step%s", options.trace.c_str(),
                 grouped(traced->recorded).c_str(), steps, steps == 1 ? "" : "s");
    if (traced->dropped > 0) {
      std::fprintf(stderr, "; %s more did not fit and are missing",
                   grouped(traced->dropped).c_str());
    }
    std::fprintf(stderr, "\n");
  }
  if (!plan->any_fits()) {
    std::fprintf(stderr, "strata plan: the job fits none of the GPUs planned\n");
    return 3;
  }
  return 0;
}

}  // namespace

// An option given with an empty value (--host-ram "") is refused rather than read as absent.
const CLI::Validator kNotEmpty(
    [](const std::string& value) { return value.empty() ? std::string("must not be empty") : ""; },
    "", "not empty");

void add_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Memory, host RAM, NVMe, step time and cost of a fine-tuning job on each GPU");
  cmd->add_option("--model", options->model, "Preset name (e.g. llama-2-70b) or HF config.json")
      ->required();
  cmd->add_option("--scale", options->scale,
                  "Narrow the model by this factor, as strata bench finetune --scale does")
      ->capture_default_str();
  cmd->add_option("--layers", options->layers, "Keep this many layers (-1: all)")
      ->capture_default_str();
  cmd->add_option("--method", options->method, "full | lora | qlora")->capture_default_str();
  CLI::Option* lora_rank =
      cmd->add_option("--lora-rank", options->lora_rank, "LoRA rank r")->capture_default_str();
  CLI::Option* lora_targets = cmd->add_option("--lora-targets", options->lora_targets,
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
  cmd->add_option("--gpu", options->gpus,
                  "GPU preset NAME[:COUNT|:auto]; repeatable (default: all); auto: the smallest "
                  "count that fits");
  cmd->add_option("--host-ram", options->host_ram, "Host RAM available, e.g. 256G");
  cmd->add_option("--pinned-budget", options->pinned_budget,
                  "Strata's pinned pool exactly, as strata bench finetune --pinned-budget sets it "
                  "(NVMe offload; default: what the headroom leaves of --host-ram, or the least)");
  cmd->add_option("--stream-chunk", options->stream_chunk,
                  "With --pinned-budget: the run's stream chunk (strata_config.stream_chunk_bytes; "
                  "default: the rule for a budget set exactly)");
  cmd->add_option("--stream-buffers", options->stream_buffers,
                  "With --pinned-budget: the run's staging buffers per direction "
                  "(strata_config.stream_buffers; 0: the rule)")
      ->check(CLI::Range(0, 64));
  cmd->add_option(
      "--sub-group-bytes", options->sub_group_bytes,
      "With --pinned-budget: the run's optimizer sub-group per state tensor "
      "(strata_optimizer_options.sub_group_bytes; 0 or default: a sixteenth of what the "
      "staging leaves of the pool, within 64 KiB to 64 MiB)");
  cmd->add_option("--warmup-steps", options->warmup_steps,
                  "Steps each NVMe-offload simulation plays before the one it measures; 2 gives "
                  "the steady state of a job whose pools keep tensors across steps, at up to 1.5x "
                  "the plan time")
      ->capture_default_str()
      ->check(CLI::Range(1u, kMaxSimulatedWarmupSteps));
  cmd->add_option("--device-budget", options->device_budget,
                  "The simulated NVMe offload's device pool per GPU exactly, as strata bench "
                  "finetune --device-budget sets it (default: the weights or two streamed units, "
                  "and two units of gradients)");
  cmd->add_option("--host-headroom", options->host_headroom,
                  "RAM kept free beside the job, as a fraction of the job's host bytes")
      ->capture_default_str();
  cmd->add_option("--host-reserve", options->host_reserve,
                  "RAM kept free for the OS, framework and data loader")
      ->capture_default_str();
  cmd->add_option("--attention", options->attention,
                  "flash (scores never stored) | eager (scores stored unless recomputed)")
      ->capture_default_str();
  cmd->add_option("--activation-offload", options->activation_offload,
                  "none | pinned | nvme: the tensors saved for backward leave the GPU in forward "
                  "(strata.torch.offload's activations=)")
      ->capture_default_str();
  cmd->add_option("--tokens", options->tokens, "Training tokens of the whole job");
  cmd->add_option("--epochs", options->epochs,
                  "Epochs over --dataset-tokens (instead of --tokens)");
  cmd->add_option("--dataset-tokens", options->dataset_tokens, "Tokens in one epoch");
  cmd->add_option("--nvme-drive", options->nvme_drive,
                  "Drive model for SSD wear and capacity (default: the generation's preset drive)");
  cmd->add_option("--nvme-tbw", options->nvme_tbw,
                  "Rated endurance per drive, TB written (overrides the drive's rating)");
  cmd->add_option("--nvme", options->nvme,
                  "COUNT:gen4|gen5, or READ_GBPS/WRITE_GBPS measured, COUNT: first for an array")
      ->capture_default_str();
  cmd->add_option("--offload", options->offload,
                  "none | cpu | nvme (default: the first that fits, per GPU)");
  cmd->add_option("--mfu", options->mfu, "Achieved fraction of dense peak FLOPS")
      ->capture_default_str();
  cmd->add_option("--optimizer-threads", options->optimizer_threads,
                  "The training machine's CPU optimizer threads, for Strata's automatic pinned "
                  "budget (docs/tuning.md)")
      ->default_val(kPlanOptimizerThreads);
  cmd->add_option("--drive-queue-depth", options->drive_queue_depth,
                  "1 MiB requests in flight that keep each drive at full speed, for Strata's "
                  "automatic pinned budget")
      ->default_val(kPlanDriveQueueDepth);
  cmd->add_option("--adam-rate", options->adam_gparams, "CPU Adam, billions of parameters/s")
      ->capture_default_str();
  cmd->add_option("--pcie-efficiency", options->pcie_efficiency,
                  "Fraction of the PCIe link rate (0: measured pinned-copy rate of the preset)")
      ->capture_default_str();
  cmd->add_flag("--json", options->json, "Print JSON instead of tables");
  cmd->add_option("--trace", options->trace,
                  "Write the headline GPU's simulated NVMe-offload steps (warm-up included) to "
                  "FILE as a Chrome trace, to compare with strata bench finetune --trace");
  // Every option that takes text refuses an empty value.
  for (CLI::Option* option : cmd->get_options()) {
    if (option->get_type_size() != 0 && option->get_name() != "--help") option->check(kNotEmpty);
  }
  cmd->callback([options, lora_rank, lora_targets, cmd] {
    options->lora_options_given = lora_rank->count() > 0 || lora_targets->count() > 0;
    options->nvme_given = cmd->count("--nvme") > 0;
    const int rc = run_plan(*options);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace strata::cli
