#include "finetune/finetune_options.h"

#include <strata/strata.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "common/align.h"
#include "common/units.h"
#include "model/plan_offload.h"

namespace strata::bench::finetune {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kBudgetGranule = kMiB;
constexpr uint32_t kMaxSteps = 1000;
constexpr uint64_t kMaxTokens = uint64_t{1} << 24;
// --compute cpu runs every FLOP for real on this machine's cores: beyond this per step a run
// would take hours, which is a typo rather than a plan.
constexpr double kMaxCpuFlopsPerStep = 2e12;

std::string exact(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

Result<uint64_t> budget_option(const std::string& text, const char* flag) {
  const std::optional<uint64_t> bytes = parse_bytes(text);
  if (!bytes || *bytes < kPageSize) {
    return invalid_argument(std::string(flag) + " '" + text +
                            "' is not a size of at least 4K (e.g. 512M, 2G)");
  }
  return align_up(*bytes, kPageSize);
}

// LoRA's inventory: every parameter of the model, frozen (NF4 for QLoRA's layer linear
// weights), and after each adapted weight its two adapters and their gradients, trained. The
// adapters are in the weights' dtype, as peft makes them for a bf16 model.
Status build_lora_inventory(FinetunePlan& plan, const LoraTargets& targets) {
  InventoryOptions options;  // the scaling is already applied to plan.model
  options.include_gradients = false;
  options.include_optimizer = false;
  const uint64_t rank = plan.options.lora_rank;
  auto add = [&plan](TensorSpec spec, TensorRole role) {
    plan.inventory.push_back(std::move(spec));
    plan.roles.push_back(role);
  };
  for (const TensorSpec& weight : build_inventory(plan.model, options)) {
    const bool nf4 = plan.method == FinetuneMethod::kQLora && qlora_quantizes(weight);
    add(weight, nf4 ? TensorRole::kFrozenNf4 : TensorRole::kFrozen);
    plan.frozen_stored_bytes += stored_bytes(plan, plan.inventory.size() - 1);
    if (!lora_adapts(weight, targets)) continue;
    const std::string stem = weight.name.substr(0, weight.name.rfind('.'));
    const uint64_t out = weight.shape[0], in = weight.shape[1];
    for (const auto& [name, shape] : {std::pair{".lora_A", std::vector<uint64_t>{rank, in}},
                                      std::pair{".lora_B", std::vector<uint64_t>{out, rank}}}) {
      TensorSpec adapter{stem + name, shape, weight.dtype, TensorKind::kParameter, weight.layer};
      TensorSpec grad = adapter;
      grad.name += "#grad";
      grad.kind = TensorKind::kGradient;
      plan.adapter_parameters += adapter.elements();
      add(std::move(adapter), TensorRole::kTrained);
      add(std::move(grad), TensorRole::kTrained);
    }
  }
  if (plan.adapter_parameters == 0) {
    return invalid_argument("--lora-targets '" + plan.options.lora_targets +
                            "' adapts no weight of " + plan.model.name);
  }
  return Status::ok();
}

}  // namespace

uint64_t stored_bytes(const FinetunePlan& plan, size_t tensor) {
  const TensorSpec& spec = plan.inventory[tensor];
  return plan.roles[tensor] == TensorRole::kFrozenNf4 ? strata_nf4_packed_bytes(spec.elements())
                                                      : spec.bytes();
}

const char* to_string(ComputeMode mode) {
  switch (mode) {
    case ComputeMode::kModeled:
      return "modeled";
    case ComputeMode::kCpu:
      return "cpu";
    case ComputeMode::kGpu:
      return "gpu";
  }
  return "?";
}

Result<ComputeMode> parse_compute_mode(const std::string& name) {
  if (name == "modeled") return ComputeMode::kModeled;
  if (name == "cpu") return ComputeMode::kCpu;
  if (name == "gpu") return ComputeMode::kGpu;
  return invalid_argument("--compute '" + name + "' is not modeled, cpu or gpu");
}

Result<FinetunePlan> make_plan(const FinetuneOptions& options) {
  FinetunePlan plan;
  plan.options = options;
  Result<FinetuneMethod> method = parse_method(options.method);
  if (!method) return std::move(method).take_status().with_context("--method");
  plan.method = *method;
  const bool lora = plan.method != FinetuneMethod::kFull;
  // "zero-infinity" is the name these baselines had before they were DeepSpeed's own
  // configurations; it still selects them.
  const std::string strategy =
      !options.strategy.empty() ? options.strategy : (lora ? "strata" : "both");
  plan.options.strategy = strategy;
  const bool run_strata = strategy == "both" || strategy == "strata";
  const bool run_deepspeed =
      strategy == "both" || strategy == "deepspeed" || strategy == "zero-infinity";
  if (!run_strata && !run_deepspeed) {
    return invalid_argument("--strategy '" + strategy + "' is not strata, deepspeed or both");
  }
  if (lora && run_deepspeed) {
    return unsupported("--method " + options.method + " runs Strata alone (--strategy strata): " +
                       "the DeepSpeed baselines model ZeRO-3 full fine-tuning, and a frozen "
                       "base under ZeRO-Infinity is not modelled");
  }
  if (options.lora_rank < 1 || options.lora_rank > kMaxLoraRank) {
    return invalid_argument("--lora-rank " + std::to_string(options.lora_rank) + " is outside 1.." +
                            std::to_string(kMaxLoraRank));
  }
  Result<LoraTargets> targets = parse_lora_targets(options.lora_targets);
  if (!targets) return std::move(targets).take_status().with_context("--lora-targets");
  if (options.optimizer_overlap != "on" && options.optimizer_overlap != "off" &&
      options.optimizer_overlap != "both") {
    return invalid_argument("--optimizer-overlap '" + options.optimizer_overlap +
                            "' is not on, off or both");
  }
  Result<Precision> precision = parse_precision(options.precision);
  if (!precision) return std::move(precision).take_status();
  plan.precision = *precision;
  if (!(options.max_grad_norm >= 0.0) || !std::isfinite(options.max_grad_norm)) {
    return invalid_argument("--max-grad-norm " + exact(options.max_grad_norm) +
                            " is not a finite value >= 0 (0: no clipping)");
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> baselines, parse_baselines(options.baselines));
  Result<ComputeMode> compute = parse_compute_mode(options.compute);
  if (!compute) return std::move(compute).take_status();
  plan.compute = *compute;
#if !defined(STRATA_HAVE_CUDA)
  if (plan.compute == ComputeMode::kGpu) {
    return unsupported(
        "--compute gpu needs cuBLAS: this strata was built without CUDA (rebuild with "
        "-DSTRATA_CUDA=ON on a machine with the CUDA toolkit), or use --compute modeled|cpu");
  }
#endif
  Result<GpuPreset> gpu = find_gpu(options.gpu);
  if (!gpu) return std::move(gpu).take_status().with_context("--gpu");
  plan.gpu = *gpu;
  if (!(options.mfu > 0.0 && options.mfu <= 1.0)) {
    return invalid_argument("--mfu " + exact(options.mfu) + " is outside (0, 1]");
  }
  if (!options.project_gpu.empty()) {
    STRATA_ASSIGN_OR_RETURN(GpuPreset project, find_gpu(options.project_gpu),
                            "--project-full-scale");
  }
  if (options.steps < 1 || options.steps > kMaxSteps) {
    return invalid_argument("--steps " + std::to_string(options.steps) + " is outside 1.." +
                            std::to_string(kMaxSteps));
  }
  if (options.seq < 1 || options.batch < 1 || uint64_t{options.seq} * options.batch > kMaxTokens) {
    return invalid_argument("--seq and --batch must be >= 1 with seq x batch <= " +
                            std::to_string(kMaxTokens) + " tokens");
  }
  plan.tokens = uint64_t{options.seq} * options.batch;
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    return invalid_argument("--metrics-port " + std::to_string(options.metrics_port) +
                            " is outside 0..65535");
  }
  STRATA_TRY(check_scale_options(options.scale, options.layers));

  Result<ModelConfig> model = load_model(options.model);
  if (!model) return std::move(model).take_status().with_context("--model");
  plan.full_model = *model;
  if (options.layers > static_cast<int>(model->num_hidden_layers)) {
    return invalid_argument("--layers " + std::to_string(options.layers) + ": " + model->name +
                            " has " + std::to_string(model->num_hidden_layers) + " layers");
  }
  plan.model = scale_model(*model, options.scale, options.layers);
  if (lora) {
    if (!options.project_gpu.empty()) {
      return unsupported("--project-full-scale simulates full fine-tuning; for --method " +
                         options.method + " at full scale run `strata plan --method " +
                         options.method + " --offload nvme`");
    }
    STRATA_TRY(build_lora_inventory(plan, *targets));
  } else {
    InventoryOptions inventory_options;  // the scaling is already applied to plan.model
    plan.inventory = build_inventory(plan.model, inventory_options);
    plan.roles.assign(plan.inventory.size(), TensorRole::kTrained);
  }
  plan.totals = summarize(plan.inventory);
  plan.parameters = parameter_count(plan.model);
  plan.parameter_factor =
      static_cast<double>(plan.parameters) / static_cast<double>(parameter_count(*model));

  if (plan.compute == ComputeMode::kCpu) {
    const double flops =
        6.0 * static_cast<double>(plan.parameters) * static_cast<double>(plan.tokens);
    if (flops > kMaxCpuFlopsPerStep) {
      char text[256];
      std::snprintf(text, sizeof text,
                    "--compute cpu would run %.3g FLOPs per step on this CPU; use fewer "
                    "tokens (e.g. --seq 64 --batch 1) or a smaller --scale",
                    flops);
      return invalid_argument(text);
    }
  }

  // NVMe directory: one swap file per worker, removed when the worker ends.
  std::error_code ec;
  const std::filesystem::path dir = options.nvme_dir.empty()
                                        ? std::filesystem::temp_directory_path(ec)
                                        : std::filesystem::path(options.nvme_dir);
  if (!std::filesystem::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0) {
    return invalid_argument("--nvme '" + dir.string() + "' is not a writable directory");
  }
  plan.options.nvme_dir = dir.string();

  // Budgets: Strata's pinned one automatic unless --pinned-budget sets it.
  uint64_t largest_param = 0, largest_layer_params = 0;
  std::vector<uint64_t> layer_params(plan.model.num_hidden_layers + 1, 0);
  std::vector<uint64_t> param_elements;
  for (const TensorSpec& t : plan.inventory) {
    if (t.kind != TensorKind::kParameter) continue;
    largest_param = std::max(largest_param, t.elements());
    param_elements.push_back(t.elements());
    if (t.layer >= 0) layer_params[static_cast<size_t>(t.layer)] += t.elements();
  }
  for (uint64_t p : layer_params) largest_layer_params = std::max(largest_layer_params, p);
  if (options.pinned_budget.empty() || options.pinned_budget == "auto") {
    plan.strata_pinned_budget = 0;  // automatic: the runtime sizes it from the drive
  } else {
    STRATA_ASSIGN_OR_RETURN(uint64_t b, budget_option(options.pinned_budget, "--pinned-budget"));
    plan.strata_pinned_budget = b;
  }
  // Device budget (the same for both strategies): weights and gradients (4 bytes per element)
  // of four layers, so that forward and backward can run a few layers ahead on the device. That
  // is more of the model than an H100 holds of the full-size job (about 23 of llama-2-70b's 80
  // layers), for both strategies alike; budgets of one or two layers run into the device arena's
  // fragmentation (a large gradient finds no contiguous range although the pool has room).
  //
  // LoRA: the base as stored (no gradients) of four layers, or twice the largest base tensor (the
  // embedding or LM head) where that is more, so that the base streams through a device smaller
  // than it, as it does through a 24 GB GPU at full size; and the adapters with their gradients,
  // resting there, four times over (they may take a quarter of it: Worker::register_tensors).
  if (options.device_budget.empty() && lora) {
    std::vector<uint64_t> layer_stored(plan.model.num_hidden_layers + 1, 0);
    uint64_t largest_stored = 0, resting = 0;
    for (size_t i = 0; i < plan.inventory.size(); ++i) {
      const TensorSpec& t = plan.inventory[i];
      if (plan.roles[i] == TensorRole::kTrained) {
        resting += t.bytes();
        continue;
      }
      largest_stored = std::max(largest_stored, stored_bytes(plan, i));
      if (t.layer >= 0) layer_stored[static_cast<size_t>(t.layer)] += stored_bytes(plan, i);
    }
    const uint64_t largest_layer = *std::max_element(layer_stored.begin(), layer_stored.end());
    plan.device_budget =
        align_up(std::max(uint64_t{4} * largest_layer, uint64_t{2} * largest_stored) + 4 * resting,
                 kBudgetGranule);
  } else if (options.device_budget.empty()) {
    plan.device_budget =
        align_up(std::max(uint64_t{16} * largest_layer_params, uint64_t{16} * largest_param),
                 kBudgetGranule);
  } else {
    STRATA_ASSIGN_OR_RETURN(uint64_t b, budget_option(options.device_budget, "--device-budget"));
    plan.device_budget = b;
  }
  // Out-of-place write-back keeps the old extent until the new one is written: twice the
  // states, plus slack for the extent allocator's alignment.
  plan.nvme_capacity = align_up(2 * plan.totals.bytes + 256 * kMiB, kMiB);
  const std::filesystem::space_info space = std::filesystem::space(dir, ec);
  if (!ec && space.available < plan.nvme_capacity) {
    return invalid_argument("--nvme '" + dir.string() + "' has " + format_bytes(space.available) +
                            " free; this model needs " + format_bytes(plan.nvme_capacity) +
                            " (lower --scale or --layers, or point --nvme elsewhere)");
  }

  // Who runs: Strata without overlap first (the headline's Strata), then with it, then each
  // DeepSpeed configuration at this scale (deepspeed_config.h scales its element-count knobs).
  auto add = [&plan](Contender c) {
    c.index = plan.contenders.size();
    plan.contenders.push_back(std::move(c));
  };
  if (run_strata) {
    if (options.optimizer_overlap != "on")
      add({0, kStrataName, ContenderKind::kStrata, false, {}, {}, {}});
    if (options.optimizer_overlap != "off") {
      add({0, kStrataOverlapName, ContenderKind::kStrata, true, {}, {}, {}});
    }
  }
  if (run_deepspeed) {
    if (plan.compute != ComputeMode::kModeled) {
      return unsupported(
          "the DeepSpeed baselines run with --compute modeled only (their GPU "
          "work is DeepSpeed's, not this benchmark's); use --strategy strata");
    }
    for (const std::string& name : baselines) {
      Contender c;
      c.name = name;
      c.kind = ContenderKind::kDeepSpeed;
      STRATA_ASSIGN_OR_RETURN(DeepSpeedConfig config,
                              labelled_config(name, plan.inventory, plan.parameter_factor), name);
      config.gradient_clipping = options.max_grad_norm;
      Result<DeepSpeedLayout> layout = deepspeed_layout(config, plan.inventory);
      if (!layout) return std::move(layout).take_status().with_context(name);
      c.deepspeed = std::move(config);
      c.layout = std::move(*layout);
      c.buffers = deepspeed_buffers(c.deepspeed, c.layout, plan.inventory, plan.precision);
      add(std::move(c));
    }
  }
  return plan;
}

const Contender* find_contender(const FinetunePlan& plan, const std::string& name) {
  for (const Contender& c : plan.contenders) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::vector<std::string> worker_arguments(const FinetuneOptions& o, const Contender& contender,
                                          int fd, const std::string& trace_path) {
  std::vector<std::string> args = {
      "bench",          "finetune",
      "--model",        o.model,
      "--method",       o.method,
      "--lora-rank",    std::to_string(o.lora_rank),
      "--lora-targets", o.lora_targets,
      "--scale",        exact(o.scale),
      "--layers",       std::to_string(o.layers),
      "--seq",          std::to_string(o.seq),
      "--batch",        std::to_string(o.batch),
      "--steps",        std::to_string(o.steps),
      "--nvme",         o.nvme_dir,
      "--compute",      o.compute,
      "--gpu",          o.gpu,
      "--mfu",          exact(o.mfu),
      "--strategy",     contender.kind == ContenderKind::kStrata ? "strata" : "deepspeed",
      "--worker",       contender.name,
      "--worker-fd",    std::to_string(fd)};
  if (!o.pinned_budget.empty()) args.insert(args.end(), {"--pinned-budget", o.pinned_budget});
  if (!o.device_budget.empty()) args.insert(args.end(), {"--device-budget", o.device_budget});
  args.insert(args.end(), {"--optimizer-overlap", contender.optimizer_overlap ? "on" : "off",
                           "--precision", o.precision, "--max-grad-norm", exact(o.max_grad_norm)});
  if (contender.kind == ContenderKind::kDeepSpeed) {
    args.insert(args.end(), {"--baseline", contender.name});
  }
  if (!trace_path.empty()) args.insert(args.end(), {"--worker-trace", trace_path});
  return args;
}

double modeled_seconds(const FinetunePlan& plan, double flops) {
  return flops / (plan.gpu.bf16_dense_tflops * 1e12 * plan.options.mfu);
}

}  // namespace strata::bench::finetune
