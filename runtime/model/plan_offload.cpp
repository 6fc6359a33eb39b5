#include "model/plan_offload.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <utility>

#include "common/align.h"
#include "common/units.h"
#include "model/simulation_pool.h"
#include "sched/memory_plan.h"
#include "sched/simulator.h"

namespace strata {
namespace {

constexpr double kGB = 1e9;  // rates are decimal GB/s, as datasheets give them

double seconds(uint64_t bytes, double gbps) {
  return bytes == 0 ? 0.0 : static_cast<double>(bytes) / (gbps * kGB);
}

// Names the slowest of overlapped stages; the first listed wins ties.
std::pair<double, std::string> slowest(
    std::initializer_list<std::pair<double, const char*>> stages) {
  std::pair<double, std::string> best{-1.0, ""};
  for (const auto& [s, name] : stages) {
    if (s > best.first) best = {s, name};
  }
  return best;
}

// fp32 master, Adam m and v: an offload engine keeps its own master of fp32 weights too
// (model/inventory.cpp says where each does).
constexpr uint64_t kOptimizerStateBytesPerParam = 12;

// The planner's names for the simulator's resources ("nvme_read" -> "nvme-read"), so that every
// offload choice names its bottleneck in one vocabulary.
std::string planner_name(sched::Resource resource) {
  switch (resource) {
    case sched::Resource::kNvmeRead:
      return "nvme-read";
    case sched::Resource::kNvmeWrite:
      return "nvme-write";
    case sched::Resource::kHostToDevice:
    case sched::Resource::kDeviceToHost:
      return "pcie";
    case sched::Resource::kCompute:
      return "compute";
    case sched::Resource::kCpuOptimizer:
      return "cpu-optimizer";
  }
  return "?";
}

// Transformer-layer equivalents of one forward pass as the simulator counts them
// (training_step.h): 1 per layer, the tensors after the layers (final norm, LM head) by their
// elements relative to a layer's, the embedding lookup 0.
double compute_units(const std::vector<TensorSpec>& inventory) {
  int32_t layers = 0;
  uint64_t layered = 0;
  uint64_t after = 0;
  bool seen_layer = false;
  for (const TensorSpec& spec : inventory) {
    if (spec.kind != TensorKind::kParameter) continue;
    if (spec.layer >= 0) {
      layers = std::max(layers, spec.layer + 1);
      layered += spec.elements();
      seen_layer = true;
    } else if (seen_layer) {
      after += spec.elements();
    }
  }
  if (layers == 0) return 1.0;
  const double per_layer = static_cast<double>(layered) / layers;
  return layers + static_cast<double>(after) / per_layer;
}

uint64_t nvme_home_bytes(const std::vector<TensorSpec>& inventory, uint32_t pinned_home_kinds) {
  uint64_t total = 0;
  for (const TensorSpec& spec : inventory) {
    if ((pinned_home_kinds & sched::kind_bit(spec.kind)) == 0) total += spec.bytes();
  }
  return total;
}

// Strata's side of a simulation: the inventory as its optimizer registers it (states in
// sub-groups, the pinned pieces) and what the step holds on the device.
struct StrataLayout {
  std::vector<TensorSpec> inventory;
  uint64_t optimizer_device_bytes = 0;
  uint64_t stream_chunk_bytes = 0;
};

// strata.torch's chunk of a saved activation (activations.py): an eighth of the pinned budget in
// 4 KiB multiples, 64 KiB to 16 MiB.
uint64_t activation_chunk_bytes(uint64_t pinned_budget) {
  constexpr uint64_t kMin = uint64_t{64} << 10, kMax = uint64_t{16} << 20;
  return std::max(kMin, std::min(kMax, align_down(pinned_budget / 8, kPageSize)));
}

// The offloaded activations as the simulated step plays them (training_step.h's packs and
// unpacks): each layer but the last one's, all GPUs' together (the simulated node moves them at
// every link's rate), in chunks of `chunk` bytes; the chunks' pinned footprint, page-rounded.
uint64_t add_activation_chunks(const OffloadJob& job, uint64_t chunk,
                               std::vector<TensorSpec>& out) {
  int32_t layers = 0;
  for (const TensorSpec& spec : job.inventory) {
    if (spec.kind == TensorKind::kParameter) layers = std::max(layers, spec.layer + 1);
  }
  if (job.offloaded_activation_bytes == 0 || layers < 2) return 0;
  const uint64_t moved_layers = static_cast<uint64_t>(layers) - 1;
  const uint64_t node = job.offloaded_activation_bytes * job.gpus;
  uint64_t footprint = 0;
  for (uint64_t l = 0; l < moved_layers; ++l) {
    // The node's bytes spread over the moved layers, the remainder on the first ones.
    const uint64_t layer_bytes = node / moved_layers + (l < node % moved_layers ? 1 : 0);
    for (uint64_t first = 0, k = 0; first < layer_bytes; first += chunk, ++k) {
      const uint64_t bytes = std::min(chunk, layer_bytes - first);
      out.push_back({"layers." + std::to_string(l) + "#activations." + std::to_string(k),
                     {bytes},
                     DType::kUInt8,
                     TensorKind::kActivationCheckpoint,
                     static_cast<int32_t>(l)});
      footprint += align_up(bytes, kPageSize);
    }
  }
  return footprint;
}

// One simulation of `micro_batches` passes per step: the job's warm-up steps, then one measured.
// The extension's shorter step (run_simulation) is not traced: trace, not job.trace, decides.
Result<sched::SimulationResult> simulate_step(const OffloadJob& job, const StrataLayout& layout,
                                              const sched::MemoryPlan& memory,
                                              uint32_t micro_batches,
                                              telemetry::TraceRecorder* trace = nullptr) {
  sched::SimulationConfig config;
  config.device = offload_device_model(job);
  if (layout.stream_chunk_bytes != 0) {
    config.device.stream_chunk_bytes = static_cast<double>(layout.stream_chunk_bytes);
  }
  config.memory = memory;
  config.micro_batches = micro_batches;
  config.warmup_steps = job.warmup_steps;
  config.measured_steps = 1;
  config.step.optimizer_device_bytes = layout.optimizer_device_bytes;
  // Strata's optimizer runs after backward, with the global clipping that measures every
  // gradient as backward finishes it (ZeRO-Infinity's layout has no pieces: no such groups).
  config.step.measure_gradients = true;
  config.trace = trace;
  return sched::simulate(layout.inventory, config);
}

Result<OffloadEstimate> run_simulation(const OffloadJob& job, const StrataLayout& layout,
                                       const sched::MemoryPlan& memory, uint64_t pinned_budget,
                                       SimulationPool* pool) {
  const std::string& policy = memory.policy;
  // A budget the plan was given is the option to change, whatever the runtime's message names
  // (its config fields).
  auto failed = [&](Status status) {
    std::string context = "simulating " + policy + " NVMe offload";
    if (status.code() == STRATA_E_DEVICE_BUDGET && job.device_budget_given) {
      context += " in the device pool --device-budget gives (" +
                 format_bytes(job.device_budget_bytes) + " per GPU: raise it)";
    } else if (status.code() == STRATA_E_PINNED_BUDGET && job.strata_pinned_bytes) {
      context += " in the pinned budget --pinned-budget gives (" +
                 format_bytes(*job.strata_pinned_bytes) + ": raise it)";
    } else if (status.code() == STRATA_E_LIMIT && job.strata_pinned_bytes) {
      // A tiny budget makes tiny optimizer sub-groups, each an access of the schedule.
      context += " in the pinned budget --pinned-budget gives (" +
                 format_bytes(*job.strata_pinned_bytes) +
                 ": its sub-groups are too small for the step's explicit limits; raise it)";
    }
    return std::move(status).with_context(context);
  };
  const uint32_t simulated_passes = std::min(job.grad_accum, kMaxSimulatedMicroBatches);
  // Past the first few micro-batches each one repeats the ones before: the step is extended at
  // the mean rate micro-batches half-way to the limit and beyond added (time, busy time, bytes);
  // peaks stay. A mean over several, because Strata's caching makes single steps uneven. The
  // shorter step is simulated on the pool beside this one, when there is a pool.
  const bool extended = job.grad_accum > simulated_passes;
  const uint32_t half = simulated_passes / 2;
  std::optional<Result<sched::SimulationResult>> shorter;
  SimulationPool::Ticket shorter_ticket;
  if (extended && pool != nullptr) {
    shorter_ticket = pool->post([&] { shorter.emplace(simulate_step(job, layout, memory, half)); });
  }
  Result<sched::SimulationResult> simulated =
      simulate_step(job, layout, memory, simulated_passes, job.trace);
  if (shorter_ticket) pool->join(shorter_ticket);
  if (!simulated) return failed(std::move(simulated).take_status());
  if (extended) {
    if (!shorter) shorter.emplace(simulate_step(job, layout, memory, half));
    if (!*shorter) return failed(std::move(*shorter).take_status());
    const double more =
        static_cast<double>(job.grad_accum - simulated_passes) / (simulated_passes - half);
    sched::SimulationResult& r = *simulated;
    const sched::SimulationResult& q = **shorter;
    r.step_seconds += more * (r.step_seconds - q.step_seconds);
    r.stall_seconds += more * std::max(0.0, r.stall_seconds - q.stall_seconds);
    r.activation_seconds += more * std::max(0.0, r.activation_seconds - q.activation_seconds);
    for (int i = 0; i < sched::kResourceCount; ++i) {
      r.busy_seconds[i] += more * std::max(0.0, r.busy_seconds[i] - q.busy_seconds[i]);
    }
    // Byte counts: per link, and per tensor kind.
    const auto extend = [&](auto& bytes, const auto& fewer) {
      for (size_t i = 0; i < bytes.size(); ++i) {
        bytes[i] += static_cast<uint64_t>(
            more * static_cast<double>(bytes[i] - std::min(bytes[i], fewer[i])));
      }
    };
    extend(r.link_bytes, q.link_bytes);
    extend(r.nvme_read_by_kind, q.nvme_read_by_kind);
    extend(r.nvme_written_by_kind, q.nvme_written_by_kind);
  }
  const sched::SimulationResult& r = *simulated;
  const auto busy = [&](sched::Resource res) { return r.busy_seconds[static_cast<int>(res)]; };
  const auto moved = [&](sched::Link link) { return r.link_bytes[static_cast<int>(link)]; };

  OffloadEstimate e;
  e.policy = policy;
  e.model = "simulated";
  e.host_bytes = r.peak_host_bytes;
  e.host_breakdown.push_back({"pinned pools (simulated peak)", r.peak_pinned_bytes});
  if (r.peak_host_bytes > r.peak_pinned_bytes) {
    // ZeRO-Infinity: the overflow check's temporaries beside its pinned blocks, or the startup
    // copy of its largest block, whichever is larger.
    e.host_breakdown.push_back({"unpinned host memory (overflow-check temporaries or startup copy)",
                                r.peak_host_bytes - r.peak_pinned_bytes});
  }
  e.nvme_bytes = nvme_home_bytes(job.inventory, memory.pinned_home_kinds);
  e.pcie_h2d_bytes = moved(sched::Link::kHostToDevice) / job.gpus;
  e.pcie_d2h_bytes = moved(sched::Link::kDeviceToHost) / job.gpus;
  // NVMe bytes as the runtime counts them (strata_stats, which strata bench finetune reports per
  // step): each transfer in the step it completes in, kind by kind, so that the total is the
  // sum of its kinds. The links count a transfer when it starts; a window cut between steps
  // differs by the transfers in flight at its ends (69 MB of 95 GB written in the default 7B
  // plan, whose one warm-up step is not yet steady), which made the total disagree with its own
  // breakdown and with --trace until 2026-12-05.
  e.nvme_read_by_kind = r.nvme_read_by_kind;
  e.nvme_write_by_kind = r.nvme_written_by_kind;
  e.nvme_read_bytes =
      std::accumulate(e.nvme_read_by_kind.begin(), e.nvme_read_by_kind.end(), uint64_t{0});
  e.nvme_write_bytes =
      std::accumulate(e.nvme_write_by_kind.begin(), e.nvme_write_by_kind.end(), uint64_t{0});
  e.compute_seconds = busy(sched::Resource::kCompute);
  e.pcie_seconds =
      std::max(busy(sched::Resource::kHostToDevice), busy(sched::Resource::kDeviceToHost));
  e.nvme_seconds = busy(sched::Resource::kNvmeRead) + busy(sched::Resource::kNvmeWrite);
  e.cpu_optimizer_seconds = busy(sched::Resource::kCpuOptimizer);
  e.stall_seconds = r.stall_seconds;
  e.activation_copy_seconds = r.activation_seconds;
  e.step_seconds = r.step_seconds;
  // The busiest resource, as the simulator names it (the drive is one resource for both
  // directions); recomputed here because the busy times may have been extended above.
  const sched::Resource nvme_direction =
      busy(sched::Resource::kNvmeWrite) > busy(sched::Resource::kNvmeRead)
          ? sched::Resource::kNvmeWrite
          : sched::Resource::kNvmeRead;
  std::pair<double, sched::Resource> top{e.nvme_seconds, nvme_direction};
  // The compute stream is busy computing and copying activations (add_activation_offload's rule).
  for (auto [seconds, resource] :
       {std::pair{e.pcie_seconds, sched::Resource::kHostToDevice},
        std::pair{e.compute_seconds + e.activation_copy_seconds, sched::Resource::kCompute},
        std::pair{e.cpu_optimizer_seconds, sched::Resource::kCpuOptimizer}}) {
    if (seconds > top.first) top = {seconds, resource};
  }
  e.bottleneck = planner_name(top.second);
  // A step lasts at least as long as its busiest resource. The simulated step hides part of each
  // added micro-batch's drive time behind its fixed part (the optimizer phase); extended, the
  // drive's time outgrew the step (qwen2.5-0.5b at --grad-accum 64: the drive busy 16.90 s in a
  // 14.12 s step, an independent client's finding of 2026-12-05). Where an extended resource
  // outlasts the extended step, it is the step, the GPU waiting the rest.
  if (extended && top.first > e.step_seconds) {
    e.stall_seconds += top.first - e.step_seconds;
    e.step_seconds = top.first;
  }
  e.pinned_budget_bytes = pinned_budget;
  e.device_budget_bytes = job.device_budget_bytes * job.gpus;
  e.peak_pinned_bytes = r.peak_pinned_bytes;
  e.peak_device_bytes = r.peak_device_bytes;
  e.transfers = r.transfers;
  return e;
}

}  // namespace

OffloadEstimate estimate_cpu_offload(const OffloadJob& job) {
  OffloadEstimate e;
  e.policy = "cpu";
  e.compute_seconds = job.compute_seconds;
  // Weights fetched twice per micro-batch (forward, then backward, whose recomputation under
  // checkpointing reuses the same fetch); resident weights only receive the optimizer's update.
  // Gradients go to the host once per micro-batch. ZeRO-style partitioning: each GPU moves its
  // share over its own link, and the two directions overlap (PCIe is full duplex).
  const uint64_t trainable_grad_bytes = job.trainable_params * job.param_bytes;
  uint64_t h2d = 0;
  if (job.params_resident_on_gpu) {
    if (job.optimizer_on_host) h2d = trainable_grad_bytes;
  } else {
    h2d = 2 * uint64_t{job.grad_accum} * job.weight_bytes;
  }
  const uint64_t d2h = job.optimizer_on_host ? job.grad_accum * trainable_grad_bytes : 0;
  e.pcie_h2d_bytes = h2d / job.gpus;
  e.pcie_d2h_bytes = d2h / job.gpus;
  e.pcie_seconds =
      std::max(seconds(e.pcie_h2d_bytes, job.pcie_gbps), seconds(e.pcie_d2h_bytes, job.pcie_gbps));
  auto add = [&](const char* what, uint64_t bytes) {
    if (bytes == 0) return;
    bytes = align_up(bytes, kPageSize);
    e.host_breakdown.push_back({what, bytes});
    e.host_bytes += bytes;
  };
  if (!job.params_resident_on_gpu) add("weights", job.weight_bytes);
  if (job.optimizer_on_host) {
    add("gradients", trainable_grad_bytes);
    add("optimizer states", job.trainable_params * kOptimizerStateBytesPerParam);
    // Adam, and before it the optimizer's measurement of each gradient (the overflow check and
    // the norm global clipping needs, strata_optimizer_grad_ready: one host pass over it, once a
    // step), as the simulated step counts the CPU (sched::TrainingStepOptions::measure_gradients).
    const double trainable = static_cast<double>(job.trainable_params);
    e.cpu_optimizer_seconds = trainable / job.adam_params_per_s;
    if (job.host_scan_gbps > 0) {
      e.cpu_optimizer_seconds += trainable * job.param_bytes / (job.host_scan_gbps * kGB);
    }
  }
  auto [step, name] = slowest({{e.compute_seconds, "compute"},
                               {e.pcie_seconds, "pcie"},
                               {e.cpu_optimizer_seconds, "cpu-optimizer"}});
  e.step_seconds = step;
  e.bottleneck = name;
  return e;
}

namespace {

constexpr const char* kActivationPoolItem = "pinned pool the activations pass through to NVMe";
// The share of a simulated step spent waiting for activation chunks from which the drive, not
// compute, is named as what bounds it (add_simulated_activations).
constexpr double kDriveBoundStallShare = 0.05;

// The pool strata.torch's runtime has for activations on their way to NVMe when nothing else is
// in it: the budget given (whole pages), else the automatic one, sized from the drive.
uint64_t activation_pool_budget(const OffloadJob& job) {
  if (job.strata_pinned_bytes) {
    return std::max(align_down(*job.strata_pinned_bytes, kPageSize), kPageSize);
  }
  return strata_pinned_sizing(job.nvme_read_gbps, job.nvme_write_gbps, job.optimizer_threads,
                              job.drive_queue_depth)
      .budget_bytes;
}

// Whether the drives spend longer writing than reading e's bytes.
bool writes_longer(const OffloadJob& job, const OffloadEstimate& e) {
  return seconds(e.nvme_write_bytes, job.nvme_write_gbps) >
         seconds(e.nvme_read_bytes, job.nvme_read_gbps);
}

// A closed form's step with activation offload: the slowest of compute with the copies on its
// stream, PCIe, the CPU optimizer and the drives (one resource, named by its busier direction).
void set_closed_form_step(const OffloadJob& job, OffloadEstimate& e) {
  auto [step, name] =
      slowest({{e.compute_seconds + e.activation_copy_seconds, "compute"},
               {e.pcie_seconds, "pcie"},
               {e.cpu_optimizer_seconds, "cpu-optimizer"},
               {e.nvme_seconds, writes_longer(job, e) ? "nvme-write" : "nvme-read"}});
  e.step_seconds = step;
  e.bottleneck = name;
}

}  // namespace

void add_activation_offload(const OffloadJob& job, uint64_t bytes_per_micro_batch, bool to_nvme,
                            OffloadEstimate& e) {
  if (bytes_per_micro_batch == 0) return;
  // Each GPU moves its own micro-batches' saved activations out over its link in forward and
  // back in backward; the node holds one micro-batch's of every GPU at the end of a forward.
  const uint64_t per_gpu = uint64_t{job.grad_accum} * bytes_per_micro_batch;
  const uint64_t held = align_up(bytes_per_micro_batch * job.gpus, kPageSize);
  e.pcie_h2d_bytes += per_gpu;
  e.pcie_d2h_bytes += per_gpu;
  e.pcie_seconds =
      std::max(seconds(e.pcie_h2d_bytes, job.pcie_gbps), seconds(e.pcie_d2h_bytes, job.pcie_gbps));
  if (to_nvme) {
    // At most: the runtime keeps in its pinned pool what the pool holds and spills the rest, so
    // every byte written once and read once is the most a micro-batch costs the drives.
    const uint64_t node = per_gpu * job.gpus;
    const auto kind = static_cast<size_t>(TensorKind::kActivationCheckpoint);
    e.nvme_write_bytes += node;
    e.nvme_read_bytes += node;
    e.nvme_write_by_kind[kind] += node;
    e.nvme_read_by_kind[kind] += node;
    e.nvme_bytes += held;
    e.nvme_seconds = seconds(e.nvme_read_bytes, job.nvme_read_gbps) +
                     seconds(e.nvme_write_bytes, job.nvme_write_gbps);
    // The pinned pool they pass through, at its budget (add_simulated_activations puts the
    // simulated peak in its place).
    const uint64_t pool = activation_pool_budget(job);
    e.host_breakdown.push_back({kActivationPoolItem, pool});
    e.host_bytes += pool;
    e.pinned_budget_bytes = pool;
    e.peak_pinned_bytes = pool;
  } else {
    e.host_breakdown.push_back({"activations", held});
    e.host_bytes += held;
  }
  // strata.torch's pack and unpack copy each saved tensor with a plain copy_ (activations.py):
  // blocking, on the stream the layers compute on, as torch's own save_on_cpu copies. The GPU
  // computes nothing while one crosses, so the copies add to compute's time; they also occupy the
  // link, where the states' transfers overlap them.
  e.activation_copy_seconds = 2 * seconds(per_gpu, job.pcie_gbps);
  set_closed_form_step(job, e);
}

sched::PinnedSizing strata_pinned_sizing(double read_gbps, double write_gbps,
                                         uint32_t optimizer_threads, uint32_t drive_queue_depth) {
  sched::DriveFigures drive;
  drive.read_bytes_per_s = read_gbps * kGB;
  drive.write_bytes_per_s = write_gbps * kGB;
  drive.queue_depth = drive_queue_depth;
  drive.source = "modelled: the plan's drives";
  return sched::size_pinned_budget(drive, optimizer_threads);
}

sched::DeviceModel offload_device_model(const OffloadJob& job) {
  sched::DeviceModel d;
  d.nvme_read_bytes_per_s = job.nvme_read_gbps * kGB;
  d.nvme_write_bytes_per_s = job.nvme_write_gbps * kGB;
  d.nvme_full_duplex = false;
  // Each GPU has its own link; the node moves gpus x the per-link rate.
  d.host_to_device_bytes_per_s = job.pcie_gbps * kGB * job.gpus;
  d.device_to_host_bytes_per_s = d.host_to_device_bytes_per_s;
  // All GPUs run their micro-batches at once: a layer takes one GPU's time for it.
  const double passes = std::max<uint32_t>(job.grad_accum, 1);
  const double units = compute_units(job.inventory);
  const double forward = job.compute_seconds * job.forward_fraction / passes / units;
  const double backward = job.compute_seconds * (1 - job.forward_fraction) / passes / units;
  d.forward_seconds_per_layer = forward;
  d.backward_seconds_per_layer = backward;
  d.cpu_optimizer_params_per_s = job.adam_params_per_s;
  d.host_overflow_check_elements_per_s = job.host_scan_gbps * kGB / (job.param_bytes + 1);
  // The TieredOptimizer's measurement reads each gradient element once (one pass, no temporary).
  d.host_gradient_scan_elements_per_s =
      job.host_scan_gbps * kGB / std::max<uint32_t>(job.param_bytes, 1);
  return d;
}

namespace {

// Strata's NVMe-offload step of `job` as the runtime would run it (simulate_strata_nvme_offload).
Result<OffloadEstimate> simulate_strata_step(const OffloadJob& job, SimulationPool* pool) {
  // The automatic budget, as the runtime sizes it from the drive: the least that keeps it busy.
  const sched::PinnedSizing sizing = strata_pinned_sizing(
      job.nvme_read_gbps, job.nvme_write_gbps, job.optimizer_threads, job.drive_queue_depth);
  // The RAM given to the pool, when more than that: more states cached across steps. Either
  // budget set exactly is spent by the runtime's rules for one (sched/pinned_sizing.h).
  uint64_t exact = job.strata_pinned_bytes.value_or(0);
  // (Activations alone take what the RAM leaves however little: they need no drive-sized pool,
  // and a pool the RAM cannot hold would not fit.)
  const bool from_ram = exact == 0 && job.host_budget_bytes &&
                        (*job.host_budget_bytes > sizing.budget_bytes || job.params_home_on_device);
  if (from_ram) exact = *job.host_budget_bytes;
  if (exact != 0) exact = std::max(align_down(exact, kPageSize), kPageSize);
  const sched::PinnedSplitGiven given =
      job.strata_pinned_bytes ? job.strata_pinned_given : sched::PinnedSplitGiven{};
  sched::PinnedSplit split = sched::split_pinned_budget(
      sizing, exact, given,
      !from_ram                   ? "as given"
      : job.params_home_on_device ? "from the host RAM the job may use beside the states"
                                  : "from the host RAM the job may use");
  // Offloaded activations go through the pinned pool in strata.torch's chunks of it. Kept there
  // (activations="pinned"), they rest beside the states. Unless the plan was given a pinned
  // budget, the pool is the least that holds them beside the drive's figure where the automatic
  // budget or the RAM given is less: the runtime's own sizing knows the drive, not the
  // activations, so the sum is a budget to set, spent by the rules for one set exactly.
  const bool kept = job.offloaded_activation_bytes != 0 && !job.activations_to_nvme;
  const bool sized_here = kept && !job.strata_pinned_bytes;
  const uint64_t least_with_them = sizing.budget_bytes + job.offloaded_activation_bytes * job.gpus;
  const uint64_t chunk = activation_chunk_bytes(
      sized_here ? std::max(split.budget_bytes, least_with_them) : split.budget_bytes);
  std::vector<TensorSpec> chunks;
  const uint64_t activation_footprint = add_activation_chunks(job, chunk, chunks);
  if (sized_here && split.budget_bytes < sizing.budget_bytes + activation_footprint) {
    std::vector<std::string> lines = sizing.derivation;
    split = sched::split_pinned_budget(sizing, sizing.budget_bytes + activation_footprint, given,
                                       "to set (the drive's figure and the activations')");
    lines.push_back("+ " + format_bytes(activation_footprint) +
                    " for the offloaded activations kept there (one micro-batch's, in " +
                    format_bytes(chunk) + " chunks)");
    lines.insert(lines.end(), split.derivation.begin(), split.derivation.end());
    split.derivation = std::move(lines);
  }
  StrataLayout layout;
  layout.inventory = job.optimizer_on_host
                         ? sched::split_optimizer_states(job.inventory, split.sub_group_bytes)
                         : job.inventory;
  layout.inventory.insert(layout.inventory.end(), chunks.begin(), chunks.end());
  layout.optimizer_device_bytes = job.device_budget_bytes * job.gpus;
  layout.stream_chunk_bytes = split.chunk_bytes;
  sched::MemoryPlan memory = sched::strata_memory_plan(
      split.budget_bytes, job.device_budget_bytes * job.gpus, split.staging_bytes);
  if (kept) memory.pinned_home_kinds |= sched::kind_bit(TensorKind::kActivationCheckpoint);
  if (job.params_home_on_device)
    memory.device_home_kinds |= sched::kind_bit(TensorKind::kParameter);
  Result<OffloadEstimate> simulated = run_simulation(job, layout, memory, split.budget_bytes, pool);
  if (!simulated) {
    Status status = std::move(simulated).take_status();
    if (kept && status.code() == STRATA_E_PINNED_BUDGET) {
      status =
          std::move(status).with_context("the offloaded activations kept in pinned memory take " +
                                         format_bytes(activation_footprint) + " of the pool");
    }
    return status;
  }
  OffloadEstimate& e = *simulated;
  e.pinned_budget_from_ram = from_ram;
  if (job.activations_to_nvme) {
    // Space for one micro-batch's, at most (what the pool keeps is not written).
    e.nvme_bytes += activation_footprint;
  }
  e.pinned_derivation = split.derivation;
  return simulated;
}

}  // namespace

Result<OffloadEstimate> simulate_strata_nvme_offload(const OffloadJob& job, SimulationPool* pool) {
  if (job.offloaded_activation_bytes == 0) return simulate_strata_step(job, pool);
  // With offloaded activations, the same step without them too: adding them adds work on the
  // drives, the links and the compute stream, so the step is at least that one plus the copies
  // the stream waits for; the scheduler's choices, moved by the extra traffic, can otherwise come
  // out a few percent faster (a 7B full fine-tune at 4K: 37.83 s against 39.10 s without them).
  OffloadJob states_only = job;
  states_only.offloaded_activation_bytes = 0;
  states_only.trace = nullptr;
  std::optional<Result<OffloadEstimate>> alone;
  SimulationPool::Ticket ticket;
  if (pool != nullptr) {
    ticket = pool->post([&] { alone.emplace(simulate_strata_step(states_only, nullptr)); });
  }
  Result<OffloadEstimate> with = simulate_strata_step(job, pool);
  if (ticket) pool->join(ticket);
  if (!with) return with;
  if (!alone) alone.emplace(simulate_strata_step(states_only, nullptr));
  if (!*alone) return std::move(*alone).take_status().with_context("the step without activations");
  OffloadEstimate& e = *with;
  e.states_only_step_seconds = (*alone)->step_seconds;
  e.step_seconds = std::max(e.step_seconds, e.states_only_step_seconds + e.activation_copy_seconds);
  return with;
}

OffloadJob activations_alone_job(const OffloadJob& job, const std::vector<TensorSpec>& inventory,
                                 uint64_t activation_bytes, uint64_t states_host_bytes) {
  OffloadJob alone = job;
  alone.inventory.clear();
  // The weights give the step its layers, their compute (compute_units) and its schedule; they
  // rest in the device pool, whole.
  uint64_t weights = 0;
  for (const TensorSpec& spec : inventory) {
    if (spec.kind != TensorKind::kParameter) continue;
    alone.inventory.push_back(spec);
    weights += align_up(spec.bytes(), 256);  // the device pool's rounding
  }
  alone.params_home_on_device = true;
  alone.optimizer_on_host = false;
  alone.fp16_loss_scaling = false;
  alone.params_resident_on_gpu = true;
  alone.device_budget_bytes = (weights + job.gpus - 1) / job.gpus;
  alone.device_budget_given = false;
  // The RAM left beside the states, which simulate_strata_step gives the pool however little (a
  // budget to set: the runtime's automatic one knows the drive only).
  alone.host_budget_bytes.reset();
  if (job.host_budget_bytes && *job.host_budget_bytes > states_host_bytes) {
    alone.host_budget_bytes = *job.host_budget_bytes - states_host_bytes;
  }
  alone.offloaded_activation_bytes = activation_bytes;
  alone.activations_to_nvme = true;
  alone.trace = nullptr;
  return alone;
}

void add_simulated_activations(const OffloadJob& job, const OffloadEstimate& alone,
                               OffloadEstimate& e) {
  // The drives carry the activations only: the simulated bytes (what the pool could not keep is
  // written and read back) in place of the closed form's most.
  e.nvme_read_bytes = alone.nvme_read_bytes;
  e.nvme_write_bytes = alone.nvme_write_bytes;
  e.nvme_read_by_kind = alone.nvme_read_by_kind;
  e.nvme_write_by_kind = alone.nvme_write_by_kind;
  e.nvme_seconds = alone.nvme_seconds;
  for (ByteItem& item : e.host_breakdown) {
    if (item.what != kActivationPoolItem) continue;
    e.host_bytes = e.host_bytes - item.bytes + alone.peak_pinned_bytes;
    item.what += " (simulated peak)";
    item.bytes = alone.peak_pinned_bytes;
  }
  e.pinned_budget_bytes = alone.pinned_budget_bytes;
  e.peak_pinned_bytes = alone.peak_pinned_bytes;
  e.pinned_derivation = alone.pinned_derivation;
  e.pinned_budget_from_ram = alone.pinned_budget_from_ram;
  e.stall_seconds = alone.stall_seconds;
  e.transfers = alone.transfers;
  e.activations_alone_step_seconds = alone.step_seconds;
  e.model = "analytic, activations simulated";
  set_closed_form_step(job, e);
  if (alone.step_seconds > e.step_seconds) {
    e.step_seconds = alone.step_seconds;
    // The GPU waits only for chunks there (read back, or room made by writing others out): where
    // that waiting is a twentieth of the step or more, the drive bounds it, though compute and
    // the copies kept their stream busier (the simulation's busiest resource).
    const bool drive_bound = alone.stall_seconds >= kDriveBoundStallShare * alone.step_seconds;
    e.bottleneck =
        drive_bound ? (writes_longer(job, e) ? "nvme-write" : "nvme-read") : alone.bottleneck;
  }
}

}  // namespace strata
