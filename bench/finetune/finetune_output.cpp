#include "finetune/finetune_output.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "common/align.h"
#include "common/report.h"
#include "common/units.h"
#include "optim/thread_pool.h"
#include "sched/pinned_sizing.h"
#include "sched/simulator.h"

#ifndef STRATA_PLOT_SCRIPT
#define STRATA_PLOT_SCRIPT "bench/plot_memory.py"
#endif

namespace strata::bench::finetune {
namespace {

using json = nlohmann::ordered_json;

// Room left on the GPU for activations, workspaces and the CUDA context in the projection.
constexpr uint64_t kProjectionDeviceReserve = uint64_t{8} << 30;

const json* find(const std::vector<StrategyResult>& results, const std::string& name) {
  for (const StrategyResult& r : results) {
    if (r.name == name) return &r.result;
  }
  return nullptr;
}

Result<json> read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return errno_status(STRATA_E_IO, "opening " + path, errno);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error(STRATA_E_CORRUPT, path + " is not valid JSON");
  return j;
}

Status write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return errno_status(STRATA_E_IO, "creating " + path, errno);
  out << text;
  out.flush();
  if (!out) return errno_status(STRATA_E_IO, "writing " + path, errno);
  return Status::ok();
}

json strategy_summary(const json& r) {
  json out = json::object();
  for (const auto& [key, value] : r.items()) {
    if (key == "event" || key == "memory_series") continue;
    out[key] = value;
  }
  return out;
}

// 1 - strata / baseline peak host, and strata / baseline step time.
std::pair<json, json> ratios(const json* strata, const json* baseline) {
  if (strata == nullptr || baseline == nullptr) return {nullptr, nullptr};
  const double sh = (*strata)["peak_host_bytes"].get<double>();
  const double zh = (*baseline)["peak_host_bytes"].get<double>();
  const double ss = (*strata)["step_seconds"].get<double>();
  const double zs = (*baseline)["step_seconds"].get<double>();
  return {zh > 0 ? json(1.0 - sh / zh) : json(nullptr), zs > 0 ? json(ss / zs) : json(nullptr)};
}

// The headline's Strata: the one with the baselines' semantics (optimizer after backward).
const json* headline_strata(const std::vector<StrategyResult>& results) {
  return find(results, kStrataName);
}

}  // namespace

Result<json> project_full_scale(const FinetunePlan& plan) {
  STRATA_ASSIGN_OR_RETURN(GpuPreset gpu, find_gpu(plan.options.project_gpu));
  STRATA_ASSIGN_OR_RETURN(NvmePreset nvme, find_nvme("gen4"));
  const ModelConfig& full = plan.full_model;
  const std::vector<TensorSpec> inventory = build_inventory(full, InventoryOptions{});
  sched::SimulationConfig config;
  sched::DeviceModel& d = config.device;
  d.nvme_read_bytes_per_s = nvme.read_gbps * 1e9;
  d.nvme_write_bytes_per_s = nvme.write_gbps * 1e9;
  d.host_to_device_bytes_per_s = gpu.pinned_copy_gbps * 1e9;
  d.device_to_host_bytes_per_s = gpu.pinned_copy_gbps * 1e9;
  const double flops_per_s = gpu.bf16_dense_tflops * 1e12 * plan.options.mfu;
  const double layer = static_cast<double>(layer_parameter_count(full));
  d.forward_seconds_per_layer = 2.0 * layer * static_cast<double>(plan.tokens) / flops_per_s;
  d.backward_seconds_per_layer = 2.0 * d.forward_seconds_per_layer;
  const uint64_t device_budget = std::max<uint64_t>(
      gpu.memory_bytes() > kProjectionDeviceReserve ? gpu.memory_bytes() - kProjectionDeviceReserve
                                                    : 0,
      uint64_t{1} << 30);
  // Strata's pinned budget follows the same rule as the measured run: automatic, from the
  // modelled drive (the engine's default queue depth of 1 MiB requests in flight), and the
  // simulated step streams device transfers through that staging.
  sched::DriveFigures drive;
  drive.read_bytes_per_s = d.nvme_read_bytes_per_s;
  drive.write_bytes_per_s = d.nvme_write_bytes_per_s;
  drive.source = "modelled: " + nvme.name;
  // The optimizer threads of this machine, as the measured run had them.
  const sched::PinnedSizing sizing =
      sched::size_pinned_budget(drive, static_cast<uint32_t>(optim::affinity_cpu_count()));
  // A budget given exactly is split as the runtime splits it: its automatic staging, and
  // sub-groups of a sixteenth of the pool left.
  const sched::PinnedSplit split = sched::split_pinned_budget(sizing, plan.strata_pinned_budget);
  if (split.chunk_bytes != 0) d.stream_chunk_bytes = static_cast<double>(split.chunk_bytes);

  // Strata through the simulator, with the measured run's order of updates and its optimizer's
  // layout: states in sub-groups of the sizing's size, each parameter and gradient held on the
  // device for its update and reached through the pinned pieces.
  sched::SimulationConfig c = config;
  c.memory = sched::strata_memory_plan(split.budget_bytes, device_budget, split.staging_bytes);
  c.step.optimizer_overlap = plan.options.optimizer_overlap == "on";
  c.step.optimizer_device_bytes = device_budget;
  c.step.measure_gradients = !c.step.optimizer_overlap;  // the run's grad_ready, for its clipping
  const std::vector<TensorSpec> sub_grouped =
      sched::split_optimizer_states(inventory, split.sub_group_bytes);
  STRATA_ASSIGN_OR_RETURN(sched::SimulationResult r, sched::simulate(sub_grouped, c),
                          "simulating strata");
  json strata = {{"name", c.step.optimizer_overlap ? kStrataOverlapName : kStrataName},
                 {"peak_host_bytes", r.peak_host_bytes},
                 {"peak_pinned_bytes", r.peak_pinned_bytes},
                 {"peak_device_bytes", r.peak_device_bytes},
                 {"step_seconds", r.step_seconds},
                 {"stall_seconds", r.stall_seconds},
                 {"bottleneck", r.bottleneck_label}};
  // DeepSpeed at full size: each labelled configuration with its knobs as they are (factor 1),
  // its host memory from the same buffer rules as the measured workers (deepspeed_buffers.h).
  json baselines = json::array();
  json reduction = json::object();
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> names, parse_baselines(plan.options.baselines));
  for (const std::string& name : names) {
    STRATA_ASSIGN_OR_RETURN(DeepSpeedConfig config_ds, labelled_config(name, inventory, 1.0));
    config_ds.gradient_clipping = plan.options.max_grad_norm;
    STRATA_ASSIGN_OR_RETURN(DeepSpeedLayout layout, deepspeed_layout(config_ds, inventory));
    const std::vector<BufferSpec> buffers =
        deepspeed_buffers(config_ds, layout, inventory, plan.precision);
    const BufferPeaks peaks = buffer_peaks(buffers);
    json table = json::array();
    for (const BufferSpec& b : buffers) {
      table.push_back({{"name", b.name},
                       {"held_bytes", b.held_bytes()},
                       {"pinned", b.pinned},
                       {"life", to_string(b.life)},
                       {"deepspeed_source", b.source}});
    }
    baselines.push_back({{"name", name},
                         {"peak_host_bytes", peaks.run},
                         {"peak_host_moment", peaks.run_moment},
                         {"peak_host_bytes_steps", peaks.steps},
                         {"peak_pinned_bytes", peaks.pinned},
                         {"largest_sub_group", layout.largest_sub_group},
                         {"buffers", std::move(table)}});
    reduction[name] = peaks.run > 0 ? 1.0 - static_cast<double>(r.peak_host_bytes) /
                                                static_cast<double>(peaks.run)
                                    : 0.0;
  }
  return json{{"gpu", gpu.name},
              {"model", full.name},
              {"parameters", parameter_count(full)},
              {"nvme", nvme.name},
              {"tokens_per_step", plan.tokens},
              {"device_budget_bytes", device_budget},
              {"strata_pinned_budget_bytes", split.budget_bytes},
              {"strata_pinned_budget_derivation", split.derivation},
              {"strata_sub_group_bytes", split.sub_group_bytes},
              {"strategies", json::array({std::move(strata)})},
              {"baselines", std::move(baselines)},
              {"host_reduction", std::move(reduction)},
              {"note",
               "DeepSpeed's full-size host bytes come from its buffer rules (the ones the measured "
               "workers allocate); its full-size step time is not simulated"}};
}

json results_json(const FinetunePlan& plan, const std::vector<StrategyResult>& results,
                  const json* projection) {
  json strategies = json::array();
  json baselines = json::array();
  json host_reduction = json::object();
  json step_ratio = json::object();
  const json* strata = headline_strata(results);
  for (const StrategyResult& r : results) {
    if (r.kind == ContenderKind::kStrata) {
      strategies.push_back(strategy_summary(r.result));
      continue;
    }
    baselines.push_back(strategy_summary(r.result));
    const auto [h, t] = ratios(strata, &r.result);
    host_reduction[r.name] = h;
    step_ratio[r.name] = t;
  }
  json overlap = nullptr;
  if (const json* o = find(results, kStrataOverlapName); o != nullptr && strata != nullptr) {
    const auto [h, t] = ratios(o, strata);
    overlap = {{"step_time_ratio_vs_strata", t},
               {"semantic_cost",
                "no global gradient clipping; a non-finite gradient skips its unit and the units "
                "after it, not the whole step"}};
  }
  const FinetuneOptions& o = plan.options;
  json out = {{"model", plan.full_model.name},
              {"precision", to_string(plan.precision)},
              {"semantics",
               {{"headline",
                 "optimizer after the whole backward, sub-group order as DeepSpeed, "
                 "global gradient clipping"},
                {"max_grad_norm", o.max_grad_norm}}},
              {"scaled",
               {{"scale", o.scale},
                {"layers", plan.model.num_hidden_layers},
                {"full_layers", plan.full_model.num_hidden_layers},
                {"hidden_size", plan.model.hidden_size},
                {"intermediate_size", plan.model.intermediate_size},
                {"parameters", plan.parameters},
                {"full_parameters", parameter_count(plan.full_model)},
                {"parameter_factor", plan.parameter_factor},
                {"tensors", plan.totals.tensors},
                {"state_bytes", plan.totals.bytes}}},
              {"config",
               {{"steps", o.steps},
                {"seq", o.seq},
                {"batch", o.batch},
                {"compute", o.compute},
                {"gpu", plan.gpu.name},
                {"mfu", o.mfu},
                {"nvme_dir", o.nvme_dir},
                {"strata_pinned_budget_bytes", plan.strata_pinned_budget},
                {"device_budget_bytes", plan.device_budget}}},
              {"strategies", std::move(strategies)},
              {"baselines", std::move(baselines)},
              {"host_reduction", host_reduction.empty() ? json(nullptr) : host_reduction},
              {"step_time_ratio", step_ratio.empty() ? json(nullptr) : step_ratio},
              {"optimizer_overlap", overlap}};
  if (plan.method != FinetuneMethod::kFull) {
    out["method"] = plan.options.method;
    out["lora"] = {{"rank", o.lora_rank},
                   {"targets", o.lora_targets},
                   {"adapter_parameters", plan.adapter_parameters},
                   {"base_bytes_stored", plan.frozen_stored_bytes}};
  }
  if (projection != nullptr) out["projection"] = *projection;
  return out;
}

namespace {

// --method lora|qlora: each Strata worker's figures against issue 22's targets.
void lora_lines(std::ostringstream& s, const FinetunePlan& plan,
                const std::vector<StrategyResult>& results) {
  s << "\n"
    << plan.options.method << ": rank " << plan.options.lora_rank << " on "
    << plan.options.lora_targets << ", "
    << fixed(static_cast<double>(plan.adapter_parameters) / 1e6, 2)
    << "M adapter parameters; the base frozen, read-only on NVMe, "
    << format_bytes(plan.frozen_stored_bytes) << " as stored"
    << (plan.method == FinetuneMethod::kQLora ? " (layer linear weights in NF4)" : "") << "\n";
  for (const StrategyResult& r : results) {
    if (!r.result.contains("lora")) continue;
    const json& l = r.result["lora"];
    s << "  " << r.name << ": adapters at home on " << l["adapter_home"].get<std::string>() << " ("
      << l["adapter_home_why"].get<std::string>() << ")\n"
      << "    NVMe written per step (max) "
      << format_bytes(l["nvme_written_per_step_max"].get<uint64_t>()) << " = "
      << fixed(l["written_over_adapter_state"].get<double>(), 3)
      << "x the adapters' state (parameters written: "
      << format_bytes(l["parameters_written_per_step_max"].get<uint64_t>()) << ")\n"
      << "    base read per step (min) "
      << format_bytes(l["parameters_read_per_step_min"].get<uint64_t>()) << " = "
      << fixed(static_cast<double>(l["parameters_read_per_step_min"].get<uint64_t>()) /
                   static_cast<double>(std::max<uint64_t>(1, plan.frozen_stored_bytes)),
               2)
      << "x the base\n"
      << "    step / max(read the base twice at "
      << (l["base_read_rate_bytes_per_s"].get<double>() > 0
              ? fixed(l["base_read_rate_bytes_per_s"].get<double>() / 1e9, 2) +
                    " GB/s = " + fixed(l["read_base_twice_seconds"].get<double>(), 2) + " s"
              : std::string("(not measured: the base never left memory)"))
      << ", compute " << fixed(l["compute_seconds_median"].get<double>(), 2) << " s): median "
      << fixed(l["step_over_bound_median"].get<double>(), 3);
    if (l["step_over_bound_range"].is_array()) {
      s << " (" << fixed(l["step_over_bound_range"][0].get<double>(), 3) << " to "
        << fixed(l["step_over_bound_range"][1].get<double>(), 3) << ")";
    }
    s << "\n";
  }
}

}  // namespace

std::string results_table(const FinetunePlan& plan, const std::vector<StrategyResult>& results,
                          const json* projection) {
  const FinetuneOptions& o = plan.options;
  std::ostringstream s;
  s << "strata bench finetune: " << plan.full_model.name << " x" << fixed(o.scale, 3) << " width, "
    << plan.model.num_hidden_layers << " of " << plan.full_model.num_hidden_layers
    << " layers: " << fixed(static_cast<double>(plan.parameters) / 1e6, 1) << "M parameters, "
    << format_bytes(plan.totals.bytes) << " of "
    << (plan.method == FinetuneMethod::kFull ? "model states" : "weights and adapters")
    << " on NVMe (" << o.nvme_dir << ")\n";
  s << o.steps << " steps (step time: median after the first), seq " << o.seq << " x batch "
    << o.batch << ", " << to_string(plan.precision) << ", clipping " << fixed(o.max_grad_norm, 1)
    << ", compute " << o.compute << " (" << plan.gpu.name << ", MFU " << fixed(o.mfu, 2)
    << "); pinned budget "
    << (plan.strata_pinned_budget == 0 ? std::string("auto")
                                       : format_bytes(plan.strata_pinned_budget))
    << " (strata), device budget " << format_bytes(plan.device_budget) << "\n\n";
  Table table({"who", "peak host", "steps only", "peak pinned", "step (s)", "NVMe rd/step",
               "NVMe wr/step", "stall", "host peak set by"});
  for (const StrategyResult& r : results) {
    const json& j = r.result;
    const double steps = std::max(1.0, j.value("measured_steps", 1.0));
    table.add_row({r.name, format_bytes(j["peak_host_bytes"].get<uint64_t>()),
                   format_bytes(j["peak_host_bytes_during_steps"].get<uint64_t>()),
                   format_bytes(j["peak_pinned_bytes"].get<uint64_t>()),
                   fixed(j["step_seconds"].get<double>(), 2),
                   format_bytes(static_cast<uint64_t>(j["nvme_read_bytes"].get<double>() / steps)),
                   format_bytes(static_cast<uint64_t>(j["nvme_write_bytes"].get<double>() / steps)),
                   fixed(100.0 * j["stall_fraction"].get<double>(), 1) + "%",
                   j.value("peak_host_moment", std::string("?"))});
  }
  s << table.render();
  const json* strata = headline_strata(results);
  const bool any_deepspeed =
      std::any_of(results.begin(), results.end(),
                  [](const StrategyResult& r) { return r.kind == ContenderKind::kDeepSpeed; });
  if (strata != nullptr && any_deepspeed) {
    s << "\nstrata against each DeepSpeed configuration (same semantics: optimizer after "
         "backward, global clipping):\n";
  }
  for (const StrategyResult& r : results) {
    if (r.kind != ContenderKind::kDeepSpeed || strata == nullptr) continue;
    const auto [h, t] = ratios(strata, &r.result);
    if (h.is_null() || t.is_null()) continue;
    s << "  vs " << r.name << ": peak host " << signed_percent(-h.get<double>())
      << " (host_reduction " << fixed(h.get<double>(), 3) << "), step time x"
      << fixed(t.get<double>(), 3) << " (step_time_ratio)\n";
  }
  if (const json* ov = find(results, kStrataOverlapName); ov != nullptr && strata != nullptr) {
    const auto [h, t] = ratios(ov, strata);
    if (!t.is_null()) {
      s << "strata-overlap (optimizer during backward; its cost: no global clipping, a "
           "non-finite gradient skips only the units after it): step time x"
        << fixed(t.get<double>(), 3) << " of strata's\n";
    }
  }
  for (const StrategyResult& r : results) {
    if (r.kind != ContenderKind::kDeepSpeed) continue;
    const json& j = r.result;
    s << "\n" << r.name << " host buffers (" << j.value("deepspeed_version_modelled", "") << "):\n";
    Table b({"buffer", "held", "pinned", "life", "DeepSpeed source"});
    for (const json& buf : j["buffers"]) {
      b.add_row({buf["name"].get<std::string>(), format_bytes(buf["held_bytes"].get<uint64_t>()),
                 buf["pinned"].get<bool>() ? "pinned" : "pageable", buf["life"].get<std::string>(),
                 buf["deepspeed_source"].get<std::string>()});
    }
    s << b.render();
  }
  if (plan.method != FinetuneMethod::kFull) lora_lines(s, plan, results);
  s << "peak host = RSS less the emulated device; steps only = the peak over the training steps, "
       "start-up left out\n";
  if (projection != nullptr) {
    const json& p = *projection;
    s << "\nFull-scale projection: " << p["model"].get<std::string>() << ", "
      << p["gpu"].get<std::string>() << ", one " << p["nvme"].get<std::string>() << " drive, "
      << p["tokens_per_step"].get<uint64_t>() << " tokens per step\n";
    Table t({"who", "peak host", "steps only", "peak pinned", "step (s)"});
    for (const json& r : p["strategies"]) {
      t.add_row({r["name"].get<std::string>() + " (simulated)",
                 format_bytes(r["peak_host_bytes"].get<uint64_t>()),
                 format_bytes(r["peak_host_bytes"].get<uint64_t>()),
                 format_bytes(r["peak_pinned_bytes"].get<uint64_t>()),
                 fixed(r["step_seconds"].get<double>(), 2)});
    }
    for (const json& r : p["baselines"]) {
      t.add_row({r["name"].get<std::string>() + " (buffer rules)",
                 format_bytes(r["peak_host_bytes"].get<uint64_t>()),
                 format_bytes(r["peak_host_bytes_steps"].get<uint64_t>()),
                 format_bytes(r["peak_pinned_bytes"].get<uint64_t>()), "-"});
    }
    s << t.render();
    for (const auto& [name, value] : p["host_reduction"].items()) {
      s << "projected host_reduction vs " << name << " " << fixed(value.get<double>(), 3) << "\n";
    }
  }
  return s.str();
}

Status merge_traces(const std::vector<StrategyResult>& results, const std::string& path) {
  json events = json::array();
  // Per worker, its runtime recorder's own otherData (capacity, exported and dropped events):
  // whether that part of the trace was cut short.
  json workers = json::array();
  int pid = 0;
  for (const StrategyResult& r : results) {
    ++pid;
    STRATA_ASSIGN_OR_RETURN(json worker, read_json_file(r.trace_path));
    const std::string name = r.name;
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", 0},
                      {"args", {{"name", name}}}});
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", 0},
                      {"args", {{"sort_index", pid}}}});
    // The runtime's spans: "nvme read", "nvme write", "h2d copy", "d2h copy" tracks, on the
    // runtime's clock, moved onto the worker's.
    // (The DeepSpeed workers have no runtime: their aio handles' spans are their own tracks.)
    const std::string runtime_path = (worker).value("runtime_trace", std::string());
    if (!runtime_path.empty()) {
      const int64_t offset = (worker)["runtime_epoch_us"].get<int64_t>();
      STRATA_ASSIGN_OR_RETURN(json runtime, read_json_file(runtime_path));
      workers.push_back(
          {{"name", name}, {"pid", pid}, {"runtime", runtime.value("otherData", json::object())}});
      for (json& e : (runtime)["traceEvents"]) {
        if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") continue;
        e["pid"] = pid;
        if (e.contains("ts")) e["ts"] = e["ts"].get<int64_t>() + offset;
        events.push_back(std::move(e));
      }
      std::remove(runtime_path.c_str());
    }
    // The worker's own tracks (compute, optimizer, ...), each its own row after the runtime's.
    std::map<std::string, int> tids;
    for (const json& span : (worker)["spans"]) {
      const std::string track = span["track"].get<std::string>();
      auto [it, added] = tids.emplace(track, 100 + static_cast<int>(tids.size()));
      if (added) {
        events.push_back({{"name", "thread_name"},
                          {"ph", "M"},
                          {"pid", pid},
                          {"tid", it->second},
                          {"args", {{"name", track}}}});
        events.push_back({{"name", "thread_sort_index"},
                          {"ph", "M"},
                          {"pid", pid},
                          {"tid", it->second},
                          {"args", {{"sort_index", it->second}}}});
      }
      json e = {{"name", span["name"]}, {"cat", track}, {"ph", "X"},        {"ts", span["ts"]},
                {"dur", span["dur"]},   {"pid", pid},   {"tid", it->second}};
      if (span.contains("bytes")) e["args"] = {{"bytes", span["bytes"]}};
      events.push_back(std::move(e));
    }
    std::remove(r.trace_path.c_str());
  }
  const json out = {{"displayTimeUnit", "ms"},
                    {"otherData", {{"producer", "strata bench finetune"}, {"workers", workers}}},
                    {"traceEvents", std::move(events)}};
  return write_text_file(path, out.dump());
}

namespace {

std::string plot_python() {
  const char* python = std::getenv("STRATA_PYTHON");
  return python != nullptr ? python : "/usr/bin/python3";
}

std::string plot_script() {
  const char* script = std::getenv("STRATA_PLOT_SCRIPT");
  return script != nullptr ? script : STRATA_PLOT_SCRIPT;
}

// Runs argv[0] with its output on stderr (never into --json on stdout); its exit status, or -1.
int run_quietly(std::vector<std::string> argv) {
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) {
    ::dup2(2, 1);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

Status plot_memory(const FinetunePlan& plan, const std::vector<StrategyResult>& results,
                   const std::string& path) {
  json strategies = json::array();
  for (const StrategyResult& r : results) {
    strategies.push_back({{"name", r.name},
                          {"peak_host_bytes", r.result["peak_host_bytes"]},
                          {"series", r.result["memory_series"]}});
  }
  const json data = {{"title", "strata bench finetune: " + plan.full_model.name + " x" +
                                   fixed(plan.options.scale, 3) + ", " +
                                   std::to_string(plan.model.num_hidden_layers) + " layers, " +
                                   std::to_string(plan.options.steps) + " steps"},
                     {"columns", {"seconds", "host_bytes", "pinned_bytes", "device_bytes"}},
                     {"strategies", std::move(strategies)}};
  const std::string data_path = path + ".json";
  STRATA_TRY(write_text_file(data_path, data.dump()));
  const std::string py = plot_python();
  const std::string sc = plot_script();
  if (run_quietly({py, sc, data_path, path}) != 0) {
    return unsupported("rendering " + path + " with " + py + " " + sc +
                       " failed (it needs matplotlib); the data is in " + data_path);
  }
  return Status::ok();
}

Status check_plot_renderer() {
  const std::string py = plot_python();
  const std::string sc = plot_script();
  if (::access(sc.c_str(), R_OK) != 0) {
    return errno_status(STRATA_E_UNSUPPORTED, "--plot: the plot script " + sc, errno);
  }
  if (run_quietly({py, "-c", "import matplotlib"}) != 0) {
    return unsupported("--plot needs " + py +
                       " with matplotlib (Debian: apt-get install "
                       "python3-matplotlib; STRATA_PYTHON names another interpreter)");
  }
  return Status::ok();
}

}  // namespace strata::bench::finetune
