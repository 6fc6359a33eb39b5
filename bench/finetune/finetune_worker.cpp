#include "finetune/finetune_worker.h"

#include <fcntl.h>
#include <signal.h>
#include <strata/strata.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "finetune/layer_compute.h"
#include "finetune/memory_sampler.h"
#include "finetune/worker_common.h"
#include "memory/host_memory.h"
#include "optim/cpu_adam.h"
#include "optim/half_convert.h"

namespace strata::bench::finetune {
namespace {

using Clock = std::chrono::steady_clock;

// The most bytes a trace's NVMe requests had in flight at one moment, and when.
struct InFlightPeak {
  uint64_t bytes = 0;
  int64_t at_us = 0;
};
Result<InFlightPeak> peak_nvme_bytes_in_flight(const std::string& runtime_trace);

// One step's NVMe bytes (strata_stats' per-kind slots) as {kind name: bytes}; kinds that moved
// nothing are left out unless `zeros`.
json bytes_by_kind(const uint64_t (&bytes)[STRATA_STATS_KIND_SLOTS], bool zeros) {
  json out = json::object();
  for (int kind = 0; kind < kTensorKindCount; ++kind) {
    if (zeros || bytes[kind] != 0) out[to_string(static_cast<TensorKind>(kind))] = bytes[kind];
  }
  return out;
}

class Worker {
 public:
  // The runtime's own accounting (strata_get_stats, any thread): none before the runtime exists
  // or when it cannot be had.
  std::optional<strata_stats> runtime_stats_if_any() const {
    strata_runtime* rt = live_runtime_.load(std::memory_order_acquire);
    strata_stats st{};
    st.struct_size = sizeof st;
    if (rt == nullptr || strata_get_stats(rt, &st) != STRATA_OK) return std::nullopt;
    return st;
  }
  // The same, zeroed when it cannot be had.
  strata_stats runtime_stats() const {
    strata_stats zeroed{};
    zeroed.struct_size = sizeof zeroed;
    return runtime_stats_if_any().value_or(zeroed);
  }

  Worker(const FinetunePlan& plan, const Contender& contender, int fd, std::string trace_path)
      : plan_(plan),
        contender_(contender),
        channel_(fd),
        trace_path_(std::move(trace_path)),
        units_(build_units(plan.inventory, plan.model.num_hidden_layers)),
        log_(!trace_path_.empty()) {}
  ~Worker() {
    if (sampler_) sampler_->stop();
    if (rt_ != nullptr) (void)strata_runtime_destroy(rt_);
  }

  Status run();
  void send_error(const Status& status) { channel_.send(error_event(contender_.name, status)); }

 private:
  uint64_t now_us() const { return log_.now_us(); }
  Status check(int rc, const char* what) {
    if (rc == STRATA_OK) return Status::ok();
    return Status::error(rc, std::string(what) + ": " + strata_last_error(rt_));
  }
  void span(const char* track, std::string name, uint64_t begin, uint64_t end, int64_t bytes = -1) {
    log_.add(track, std::move(name), begin, end, bytes);
  }

  Status create_runtime();
  Status register_tensors();
  Status initialize_tensors();
  Status write_frozen(size_t tensor);
  Status measure_frozen_read_rate();
  json lora_result() const;
  bool frozen(size_t tensor) const { return plan_.roles[tensor] != TensorRole::kTrained; }
  Status step(uint32_t index);
  Status forward(const Unit& unit);
  Status backward(const Unit& unit);
  Status configure_optimizer();
  Status optimizer_step();
  Result<strata_acquired> acquire(size_t tensor, strata_tier tier, uint32_t flags);
  Status release(size_t tensor, bool dirty, void* stream = nullptr);
  void progress(const char* phase, uint32_t step, int32_t layer);
  Status write_trace(const std::string& runtime_trace);
  void send_result();

  const FinetunePlan& plan_;
  const Contender& contender_;
  Channel channel_;
  const std::string trace_path_;
  const std::vector<Unit> units_;
  SpanLog log_;

  std::unique_ptr<MemorySampler> sampler_;
  strata_runtime* rt_ = nullptr;
  // rt_ for the sampler's thread once it exists (strata_get_stats may run on any thread; the
  // destructor stops the sampler before it destroys the runtime).
  std::atomic<strata_runtime*> live_runtime_{nullptr};
  std::vector<strata_tensor_desc> descs_;
  std::vector<strata_tensor> handles_;
  std::unique_ptr<LayerCompute> compute_;
  uint32_t group_ = 0;      // the optimizer's one parameter group
  InFlightPeak in_flight_;  // from the runtime's trace, with --trace
  uint64_t runtime_epoch_lo_us_ = 0, runtime_epoch_hi_us_ = 0;

  // Per step.
  double stall_seconds_ = 0;  // inside strata_acquire
  std::atomic<uint64_t> stall_us_total_{0};
  bool skipped_ = false;  // the optimizer found a non-finite gradient and skipped the step
  double overflow_seconds_ = 0;
  double optimizer_seconds_ = 0;
  double compute_seconds_ = 0;
  std::vector<StepRecord> steps_;
  double startup_seconds_ = 0;
  uint64_t process_base_bytes_ = 0;  // host memory before the runtime exists
  double final_sync_seconds_ = 0;
  uint64_t startup_written_ = 0;
  double load_start_ = -1;
  double last_grad_norm_ = 0;
  float last_clip_scale_ = 1.0f;
  double done_units_ = 0;

  // LoRA: where the adapters and their gradients rest (their optimizer states follow: pinned
  // memory when not NVMe), and why.
  strata_tier adapter_home_ = STRATA_TIER_NVME;
  std::string adapter_home_why_;
  double frozen_read_rate_ = 0;  // bytes/s: the base read once through Strata, cold
  // The runtime's traffic in each step (strata_stats after it less before): NVMe bytes by kind
  // (LoRA's adapter check and the JSON's), the drive's busy time and the device copies.
  struct StepTraffic {
    uint64_t read[STRATA_STATS_KIND_SLOTS] = {}, written[STRATA_STATS_KIND_SLOTS] = {};
    // How long the step's NVMe transfers kept the drive busy (strata_stats' *_busy_us).
    uint64_t read_busy_us = 0, write_busy_us = 0, busy_us = 0;
    // The copies between pinned memory and the device: bytes and busy time per direction.
    uint64_t to_device_bytes = 0, to_host_bytes = 0, to_device_busy_us = 0, to_host_busy_us = 0;
  };
  std::vector<StepTraffic> step_traffic_;
};

Status Worker::create_runtime() {
  strata_config c{};
  STRATA_TRY(check(strata_config_init(&c), "strata_config_init"));
  c.nvme_path = plan_.options.nvme_dir.c_str();
  c.nvme_capacity_bytes = plan_.nvme_capacity;
  c.device_budget_bytes = plan_.device_budget;
  // Host code touches the acquired "device" buffers in modeled and cpu mode, so those run on
  // the emulated device even where a GPU exists; gpu mode needs the real one.
  c.device_backend =
      plan_.compute == ComputeMode::kGpu ? STRATA_DEVICE_CUDA : STRATA_DEVICE_EMULATED;
  if (!trace_path_.empty()) {
    // Roughly a dozen transfers per parameter per step, with room to spare; 96 bytes each.
    const uint64_t params = units_.empty() ? 0 : plan_.totals.tensors / 5 + 1;
    c.trace_events = static_cast<uint32_t>(
        std::min<uint64_t>(uint64_t{1} << 22, 32 * params * (plan_.options.steps + 2) + 65536));
  }
  c.policy = STRATA_POLICY_STRATA;
  c.pinned_budget_bytes = plan_.strata_pinned_budget;
  const uint64_t before = now_us();
  const int rc = strata_runtime_create(&c, &rt_);
  const uint64_t after = now_us();
  if (rc != STRATA_OK) {
    return Status::error(rc, std::string("strata_runtime_create: ") + strata_last_error(nullptr));
  }
  live_runtime_.store(rt_, std::memory_order_release);
  // The runtime's trace clock starts while it is being created; its spans are placed on this
  // worker's clock with the creation's end as their zero (the recorder is among the last things
  // built, so the error is the creation's tail, well under a millisecond).
  runtime_epoch_lo_us_ = before;
  runtime_epoch_hi_us_ = after;
  sampler_->set_device_fd(find_emulated_device_fd());
  return Status::ok();
}

// The framework's tensors: parameters and gradients. The fp32 master weights and Adam moments
// of the inventory are Strata's optimizer's own (strata_optimizer_add_param registers them, in
// sub-groups), as they are for strata.torch's AdamW.
//
// LoRA: the base is registered read-only (never written back: its NVMe writes stay at what
// loading wrote). The adapters and their gradients rest on the compute tier when they take at
// most a quarter of the device budget and their optimizer states (12 bytes per element, kept in
// pinned memory for a parameter resting in memory) at most a quarter of the pinned budget, as
// strata.torch's trainable_home does; otherwise on NVMe, as the base.
Status Worker::register_tensors() {
  if (plan_.method != FinetuneMethod::kFull) {
    const uint64_t element = dtype_size(plan_.inventory.front().dtype);
    const uint64_t resting = 2 * element * plan_.adapter_parameters;
    const uint64_t states = 12 * plan_.adapter_parameters;
    const uint64_t pinned = runtime_stats().pinned_budget_bytes;
    const bool fits = 4 * resting <= plan_.device_budget && 4 * states <= pinned;
    adapter_home_ = fits ? STRATA_TIER_DEVICE : STRATA_TIER_NVME;
    adapter_home_why_ = std::to_string(resting) + " bytes of adapters and gradients, " +
                        std::to_string(states) + " of optimizer states: " +
                        (fits ? "within a quarter of the device and pinned budgets"
                              : "more than a quarter of the device or pinned budget");
    for (size_t i = 0; i < plan_.inventory.size(); ++i) {
      if (!frozen(i)) descs_[i].home_tier = adapter_home_;
    }
  }
  handles_.assign(plan_.inventory.size(), STRATA_TENSOR_NONE);
  for (size_t i = 0; i < plan_.inventory.size(); ++i) {
    const TensorKind kind = plan_.inventory[i].kind;
    if (kind != TensorKind::kParameter && kind != TensorKind::kGradient) continue;
    STRATA_TRY(
        check(strata_tensor_register(rt_, &descs_[i], &handles_[i]), "strata_tensor_register"));
  }
  return Status::ok();
}

// Strata's optimizer as the training loop configures it: AdamW (lr 1e-5, weight decay 0.01, the
// betas and eps of torch.optim.AdamW), global clipping at max_grad_norm and a step skipped on a
// non-finite gradient after backward; overlapped, each unit's update starts as its backward ends,
// with nothing global to wait for (no clipping, no overflow check).
Status Worker::configure_optimizer() {
  strata_optimizer_group group{};
  STRATA_TRY(check(strata_optimizer_group_init(&group), "strata_optimizer_group_init"));
  group.lr = 1e-5;
  group.weight_decay = 0.01;
  STRATA_TRY(check(strata_optimizer_add_group(rt_, &group, &group_), "strata_optimizer_add_group"));
  strata_optimizer_options options{};
  STRATA_TRY(check(strata_optimizer_options_init(&options), "strata_optimizer_options_init"));
  const bool overlap = contender_.optimizer_overlap;
  options.max_grad_norm = overlap ? 0.0 : plan_.options.max_grad_norm;
  options.check_overflow = overlap ? 0 : 1;
  options.overlap_backward = overlap ? 1 : 0;
  return check(strata_optimizer_configure(rt_, &options), "strata_optimizer_configure");
}

Result<strata_acquired> Worker::acquire(size_t tensor, strata_tier tier, uint32_t flags) {
  strata_acquired a{};
  a.struct_size = sizeof a;
  const uint64_t begin = now_us();
  const int rc = strata_acquire(rt_, handles_[tensor], tier, flags, &a);
  const uint64_t end = now_us();
  stall_seconds_ += static_cast<double>(end - begin) / 1e6;
  stall_us_total_.fetch_add(end - begin, std::memory_order_relaxed);
  if (end - begin >= kMinWaitSpanUs) {
    span("acquire wait", plan_.inventory[tensor].name, begin, end);
  }
  if (rc != STRATA_OK) {
    return Status::error(
        rc, "strata_acquire '" + plan_.inventory[tensor].name + "': " + strata_last_error(rt_));
  }
  return a;
}

Status Worker::release(size_t tensor, bool dirty, void* stream) {
  return check(strata_release(rt_, handles_[tensor], dirty ? STRATA_RELEASE_DIRTY : 0, stream),
               "strata_release");
}

// The initial model: small bf16 weights, written in place through pinned acquires with DISCARD,
// as a framework loading a checkpoint shard by shard would, so no copy of the model ever sits in
// host memory; then each goes under the optimizer, which makes its fp32 master from it (as
// DeepSpeed makes its fp32 partitions from the 16-bit ones) and zero moments.
Status Worker::initialize_tensors() {
  STRATA_TRY(configure_optimizer());
  for (const Unit& unit : units_) {
    for (const ParamEntry& e : unit.params) {
      if (frozen(e.param)) {
        STRATA_TRY(write_frozen(e.param));
        done_units_ += 1.0 / static_cast<double>(unit.params.size());
        progress("startup", 0, unit.layer);
        continue;
      }
      const uint64_t n = plan_.inventory[e.param].elements();
      STRATA_ASSIGN_OR_RETURN(strata_acquired p,
                              acquire(e.param, STRATA_TIER_PINNED, STRATA_ACQUIRE_DISCARD));
      auto* bf = static_cast<uint16_t*>(p.data);
      for (uint64_t i = 0; i < n; ++i) bf[i] = optim::float_to_bf16(initial_weight(e.param, i));
      STRATA_TRY(release(e.param, true));
      if (e.grad == SIZE_MAX) {
        return invalid_argument("parameter '" + plan_.inventory[e.param].name +
                                "' has no gradient in the inventory");
      }
      STRATA_TRY(check(strata_optimizer_add_param(rt_, group_, handles_[e.param], handles_[e.grad]),
                       "strata_optimizer_add_param"));
      done_units_ += 1.0 / static_cast<double>(unit.params.size());
      progress("startup", 0, unit.layer);
    }
  }
  return check(strata_sync(rt_), "strata_sync");
}

// A frozen weight's initial values, through strata_tensor_write (a read-only tensor takes its
// contents from nowhere else): bf16 in pieces of a bounded host buffer, or (QLoRA) the whole
// weight quantized to NF4 first, as loading a 4-bit checkpoint would store it.
Status Worker::write_frozen(size_t tensor) {
  const TensorSpec& spec = plan_.inventory[tensor];
  const uint64_t n = spec.elements();
  if (plan_.roles[tensor] == TensorRole::kFrozenNf4) {
    std::vector<float> values(n);
    for (uint64_t i = 0; i < n; ++i) values[i] = initial_weight(tensor, i);
    std::vector<unsigned char> packed(stored_bytes(plan_, tensor));
    STRATA_TRY(
        check(strata_nf4_quantize(values.data(), STRATA_DTYPE_F32, n, packed.data(), packed.size()),
              "strata_nf4_quantize"));
    return check(strata_tensor_write(rt_, handles_[tensor], packed.data(), 0, packed.size()),
                 "strata_tensor_write");
  }
  constexpr uint64_t kPieceElements = uint64_t{1} << 21;  // 4 MiB of bf16
  std::vector<uint16_t> piece(std::min(n, kPieceElements));
  for (uint64_t first = 0; first < n; first += piece.size()) {
    const uint64_t count = std::min<uint64_t>(piece.size(), n - first);
    for (uint64_t i = 0; i < count; ++i) {
      piece[i] = optim::float_to_bf16(initial_weight(tensor, first + i));
    }
    STRATA_TRY(check(strata_tensor_write(rt_, handles_[tensor], piece.data(),
                                         first * sizeof(uint16_t), count * sizeof(uint16_t)),
                     "strata_tensor_write"));
  }
  return Status::ok();
}

// The rate at which this drive gives the base through Strata (LoRA's step-time yardstick is
// reading it twice at this rate): each frozen weight read into pinned memory once, one at a time
// (as strata_tensor_read would, without its copy out); timed only over the acquires that read
// NVMe (a weight the pinned pool still held reads nothing).
Status Worker::measure_frozen_read_rate() {
  double seconds = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < plan_.inventory.size(); ++i) {
    if (plan_.inventory[i].kind != TensorKind::kParameter || !frozen(i)) continue;
    const uint64_t before = runtime_stats().nvme_bytes_read;
    const auto start = Clock::now();
    STRATA_ASSIGN_OR_RETURN(strata_acquired a, acquire(i, STRATA_TIER_PINNED, 0));
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    (void)a;
    STRATA_TRY(release(i, false));
    const uint64_t read = runtime_stats().nvme_bytes_read - before;
    if (read == 0) continue;
    bytes += read;
    seconds += took;
  }
  frozen_read_rate_ = seconds > 0 ? static_cast<double>(bytes) / seconds : 0;
  stall_seconds_ = 0;  // the acquires above are not a step's
  stall_us_total_ = 0;
  return Status::ok();
}

Status Worker::forward(const Unit& unit) {
  STRATA_TRY(
      check(strata_layer_begin(rt_, STRATA_PHASE_FORWARD, unit.layer), "strata_layer_begin"));
  std::vector<ComputeTensor> tensors;
  for (const ParamEntry& e : unit.params) {
    STRATA_ASSIGN_OR_RETURN(strata_acquired a, acquire(e.param, STRATA_TIER_DEVICE, 0));
    tensors.push_back({&plan_.inventory[e.param], a.data, nullptr, a.ready_event,
                       plan_.roles[e.param] == TensorRole::kFrozenNf4});
  }
  const uint64_t begin = now_us();
  Status computed = compute_->forward(tensors);
  const uint64_t end = now_us();
  compute_seconds_ += static_cast<double>(end - begin) / 1e6;
  span("compute", "forward " + std::to_string(unit.layer), begin, end);
  for (const ParamEntry& e : unit.params) {
    Status released = release(e.param, false, compute_->stream());
    if (computed) computed = std::move(released);
  }
  STRATA_TRY(std::move(computed));
  return check(strata_layer_end(rt_, STRATA_PHASE_FORWARD, unit.layer), "strata_layer_end");
}

Status Worker::backward(const Unit& unit) {
  STRATA_TRY(
      check(strata_layer_begin(rt_, STRATA_PHASE_BACKWARD, unit.layer), "strata_layer_begin"));
  std::vector<ComputeTensor> tensors;
  for (const ParamEntry& e : unit.params) {
    STRATA_ASSIGN_OR_RETURN(strata_acquired a, acquire(e.param, STRATA_TIER_DEVICE, 0));
    const bool nf4 = plan_.roles[e.param] == TensorRole::kFrozenNf4;
    if (frozen(e.param)) {  // LoRA's base: read again, no gradient
      tensors.push_back({&plan_.inventory[e.param], a.data, nullptr, a.ready_event, nf4});
      continue;
    }
    // Gradients are produced, not read: DISCARD skips loading stale contents.
    STRATA_ASSIGN_OR_RETURN(strata_acquired g,
                            acquire(e.grad, STRATA_TIER_DEVICE, STRATA_ACQUIRE_DISCARD));
    tensors.push_back({&plan_.inventory[e.param], a.data, g.data, a.ready_event, nf4});
  }
  const uint64_t begin = now_us();
  Status computed = compute_->backward(tensors);
  const uint64_t end = now_us();
  compute_seconds_ += static_cast<double>(end - begin) / 1e6;
  span("compute", "backward " + std::to_string(unit.layer), begin, end);
  for (const ParamEntry& e : unit.params) {
    Status released = release(e.param, false, compute_->stream());
    if (computed) computed = std::move(released);
    if (frozen(e.param)) continue;
    released = release(e.grad, true, compute_->stream());
    if (computed) computed = std::move(released);
  }
  STRATA_TRY(std::move(computed));
  // The unit's gradients are final: the optimizer measures them where they are (the overflow
  // check and the norm, one read-only pass over the device copy through two pinned pieces, as
  // from a GPU) or, overlapped, updates the unit. Announced last parameter first, the order
  // autograd makes a layer's gradients in (and the order the simulated step plays them), which
  // is the order strata_optimizer_step then updates them in.
  const uint64_t ready_begin = now_us();
  for (auto it = unit.params.rbegin(); it != unit.params.rend(); ++it) {
    const ParamEntry& e = *it;
    if (frozen(e.param)) continue;
    STRATA_TRY(
        check(strata_optimizer_grad_ready(rt_, handles_[e.param]), "strata_optimizer_grad_ready"));
  }
  const uint64_t ready_end = now_us();
  overflow_seconds_ += static_cast<double>(ready_end - ready_begin) / 1e6;
  span(contender_.optimizer_overlap ? "optimizer" : "overflow check",
       "grad ready " + std::to_string(unit.layer), ready_begin, ready_end);
  return check(strata_layer_end(rt_, STRATA_PHASE_BACKWARD, unit.layer), "strata_layer_end");
}

// One strata_optimizer_step: every sub-group of every parameter not updated yet streams through
// pinned memory (read i+1, update i, write back i-1), the new bf16 weights written in the same
// pass, the gradients discarded once applied. Its waits for NVMe count as the loop's stall.
Status Worker::optimizer_step() {
  STRATA_TRY(check(strata_layer_begin(rt_, STRATA_PHASE_OPTIMIZER, 0), "strata_layer_begin"));
  strata_optimizer_result result{};
  result.struct_size = sizeof result;
  const uint64_t begin = now_us();
  STRATA_TRY(check(strata_optimizer_step(rt_, 1.0, &result), "strata_optimizer_step"));
  span("optimizer", "strata_optimizer_step", begin, now_us());
  optimizer_seconds_ += result.update_seconds;
  const double waited = result.read_wait_seconds + result.write_wait_seconds;
  stall_seconds_ += waited;
  stall_us_total_.fetch_add(static_cast<uint64_t>(waited * 1e6), std::memory_order_relaxed);
  skipped_ = result.found_nonfinite != 0;
  last_grad_norm_ = result.grad_norm;
  // What the clip did (torch.nn.utils.clip_grad_norm_'s coefficient, at most 1).
  const double max_norm = contender_.optimizer_overlap ? 0.0 : plan_.options.max_grad_norm;
  last_clip_scale_ =
      max_norm > 0 ? static_cast<float>(std::min(1.0, max_norm / (result.grad_norm + 1e-6))) : 1.0f;
  return check(strata_layer_end(rt_, STRATA_PHASE_OPTIMIZER, 0), "strata_layer_end");
}

void Worker::progress(const char* phase, uint32_t step, int32_t layer) {
  const double per_step = 3.0 * static_cast<double>(units_.size());
  const double total = static_cast<double>(units_.size()) + per_step * plan_.options.steps;
  channel_.send({{"event", "progress"},
                 {"strategy", contender_.name},
                 {"phase", phase},
                 {"step", step},
                 {"steps", plan_.options.steps},
                 {"layer", layer},
                 {"fraction", std::min(1.0, done_units_ / total)}});
}

Status Worker::step(uint32_t index) {
  stall_seconds_ = 0;
  overflow_seconds_ = 0;
  optimizer_seconds_ = 0;
  compute_seconds_ = 0;
  skipped_ = false;
  const ProcIo io_before = read_proc_io();
  const strata_stats stats_before = runtime_stats();
  const auto start = Clock::now();
  const uint64_t begin_us = now_us();
  STRATA_TRY(check(strata_step_begin(rt_), "strata_step_begin"));
  sampler_->set_moment("step: forward");
  for (const Unit& unit : units_) {
    STRATA_TRY(forward(unit));
    done_units_ += 1;
    progress("forward", index, unit.layer);
  }
  // Overlapped: each unit's update starts as its backward ends (strata_optimizer_grad_ready),
  // so its gradients are consumed while still resident and need not wait in memory or go to
  // NVMe; otherwise the whole step's updates follow backward, which global clipping needs.
  const bool overlap = contender_.optimizer_overlap;
  sampler_->set_moment(overlap ? "step: backward and optimizer" : "step: backward");
  for (auto it = units_.rbegin(); it != units_.rend(); ++it) {
    STRATA_TRY(backward(*it));
    done_units_ += 1;
    progress("backward", index, it->layer);
  }
  if (!overlap) sampler_->set_moment("step: optimizer");
  STRATA_TRY(optimizer_step());
  done_units_ += static_cast<double>(units_.size());
  progress("optimizer", index, units_.front().layer);
  STRATA_TRY(check(strata_step_end(rt_), "strata_step_end"));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  span("step", "step " + std::to_string(index), begin_us, now_us());
  const ProcIo io_after = read_proc_io();
  const strata_stats stats_after = runtime_stats();
  StepRecord r;
  r.runtime_read = stats_after.nvme_bytes_read - stats_before.nvme_bytes_read;
  r.runtime_written = stats_after.nvme_bytes_written - stats_before.nvme_bytes_written;
  r.seconds = seconds;
  r.stall = stall_seconds_;
  r.overflow_check = overflow_seconds_;
  r.optimizer = optimizer_seconds_;
  r.compute = compute_seconds_;
  r.read = io_after.read - io_before.read;
  r.written = io_after.written - io_before.written;
  r.skipped = skipped_;
  steps_.push_back(r);
  StepTraffic traffic;
  for (int k = 0; k < STRATA_STATS_KIND_SLOTS; ++k) {
    traffic.read[k] =
        stats_after.nvme_bytes_read_by_kind[k] - stats_before.nvme_bytes_read_by_kind[k];
    traffic.written[k] =
        stats_after.nvme_bytes_written_by_kind[k] - stats_before.nvme_bytes_written_by_kind[k];
  }
  traffic.read_busy_us = stats_after.nvme_read_busy_us - stats_before.nvme_read_busy_us;
  traffic.write_busy_us = stats_after.nvme_write_busy_us - stats_before.nvme_write_busy_us;
  traffic.busy_us = stats_after.nvme_busy_us - stats_before.nvme_busy_us;
  traffic.to_device_bytes = stats_after.host_to_device_bytes - stats_before.host_to_device_bytes;
  traffic.to_host_bytes = stats_after.device_to_host_bytes - stats_before.device_to_host_bytes;
  traffic.to_device_busy_us =
      stats_after.host_to_device_busy_us - stats_before.host_to_device_busy_us;
  traffic.to_host_busy_us =
      stats_after.device_to_host_busy_us - stats_before.device_to_host_busy_us;
  step_traffic_.push_back(traffic);
  return Status::ok();
}

Result<InFlightPeak> peak_nvme_bytes_in_flight(const std::string& runtime_trace) {
  std::ifstream in(runtime_trace);
  json trace;
  try {
    trace = json::parse(in);
  } catch (const json::exception& e) {
    return Status::error(STRATA_E_IO, runtime_trace + ": " + e.what());
  }
  // Every NVMe request (a whole-tensor read or write, or one chunk of a stream) as +bytes at its
  // start and -bytes at its end; the running sum's peak is what the drive had in flight.
  std::vector<std::pair<int64_t, int64_t>> edges;
  for (const json& e : trace.value("traceEvents", json::array())) {
    if (e.value("ph", "") != "X") continue;
    const std::string track = e.value("cat", "");
    if (track != "nvme read" && track != "nvme write") continue;
    const int64_t bytes = e.contains("args") ? e["args"].value("bytes", int64_t{0}) : 0;
    const auto ts = e.value("ts", int64_t{0});
    edges.emplace_back(ts, bytes);
    edges.emplace_back(ts + e.value("dur", int64_t{0}), -bytes);
  }
  // Ends before starts at the same time: a request that ended is not beside the next one.
  std::sort(edges.begin(), edges.end());
  InFlightPeak peak;
  int64_t now = 0;
  for (const auto& [ts, delta] : edges) {
    now += delta;
    if (now > static_cast<int64_t>(peak.bytes)) {
      peak.bytes = static_cast<uint64_t>(now);
      peak.at_us = ts;
    }
  }
  return peak;
}

Status Worker::write_trace(const std::string& runtime_trace) {
  return write_worker_trace(trace_path_,
                            {{"strategy", contender_.name},
                             {"runtime_trace", runtime_trace},
                             {"runtime_epoch_us", runtime_epoch_hi_us_},
                             {"runtime_epoch_lo_us", runtime_epoch_lo_us_}},
                            log_.spans());
}

// LoRA's figures (issue 22's targets): NVMe bytes written per step against the adapters' state,
// the base read per step, and the step against max(reading the base twice at the rate this run
// measured, the step's compute), over the measured steps (every one but the first).
json Worker::lora_result() const {
  const double element = static_cast<double>(dtype_size(plan_.inventory.front().dtype));
  // Weight, gradient (the parameter's dtype), fp32 master, m and v.
  const double adapter_state = static_cast<double>(plan_.adapter_parameters) * (2 * element + 12);
  uint64_t frozen_logical = 0;
  for (size_t i = 0; i < plan_.inventory.size(); ++i) {
    if (frozen(i)) frozen_logical += plan_.inventory[i].bytes();
  }
  const double read_twice =
      frozen_read_rate_ > 0
          ? 2.0 * static_cast<double>(plan_.frozen_stored_bytes) / frozen_read_rate_
          : 0.0;
  const size_t first = steps_.size() > 1 ? 1 : 0;
  uint64_t written_max = 0, parameter_written_max = 0, parameter_read_min = UINT64_MAX;
  std::vector<double> ratios, computes;
  json per_step = json::array();
  for (size_t i = 0; i < steps_.size(); ++i) {
    const StepTraffic& k = step_traffic_[i];
    uint64_t total = 0;
    for (int kind = 0; kind < kTensorKindCount; ++kind) total += k.written[kind];
    per_step.push_back({{"nvme_written_by_kind", bytes_by_kind(k.written, false)},
                        {"nvme_read_by_kind", bytes_by_kind(k.read, false)}});
    if (i < first) continue;
    const uint64_t parameter = static_cast<uint64_t>(TensorKind::kParameter);
    written_max = std::max(written_max, total);
    parameter_written_max = std::max(parameter_written_max, k.written[parameter]);
    parameter_read_min = std::min(parameter_read_min, k.read[parameter]);
    ratios.push_back(steps_[i].seconds / std::max(read_twice, steps_[i].compute));
    computes.push_back(steps_[i].compute);
  }
  const auto [low, high] = std::minmax_element(ratios.begin(), ratios.end());
  return {
      {"method", plan_.options.method},
      {"rank", plan_.options.lora_rank},
      {"targets", plan_.options.lora_targets},
      {"adapter_parameters", plan_.adapter_parameters},
      {"adapter_state_bytes", adapter_state},
      {"adapter_home", adapter_home_ == STRATA_TIER_DEVICE ? "device" : "nvme"},
      {"adapter_home_why", adapter_home_why_},
      {"base_bytes_stored", plan_.frozen_stored_bytes},
      {"base_bytes_unquantized", frozen_logical},
      {"base_read_rate_bytes_per_s", frozen_read_rate_},
      {"nvme_written_per_step_max", written_max},
      {"written_over_adapter_state", static_cast<double>(written_max) / adapter_state},
      {"parameters_written_per_step_max", parameter_written_max},
      {"parameters_read_per_step_min", parameter_read_min == UINT64_MAX ? 0 : parameter_read_min},
      {"read_base_twice_seconds", read_twice},
      {"compute_seconds_median", median(computes)},
      {"step_over_bound_median", median(ratios)},
      {"step_over_bound_range", ratios.empty() ? json(nullptr) : json::array({*low, *high})},
      {"steps", std::move(per_step)}};
}

void Worker::send_result() {
  const MemoryPeaks peaks = sampler_->peaks();
  const MemoryPeaks during_steps = sampler_->window_peaks();
  StepTotals totals = summarize_steps(steps_);
  // What each step moved per tensor kind (the runtime's count), as `strata plan` reports its
  // simulated step's: bench/planner_vs_measured.sh compares the two kind by kind.
  for (size_t i = 0; i < step_traffic_.size() && i < totals.steps.size(); ++i) {
    const StepTraffic& k = step_traffic_[i];
    totals.steps[i]["nvme_written_by_kind"] = bytes_by_kind(k.written, true);
    totals.steps[i]["nvme_read_by_kind"] = bytes_by_kind(k.read, true);
    // The drive's busy time over the step: the rate it delivered to the runtime while busy is
    // the by-kind bytes over these (planner_vs_measured.sh replays the run with that drive).
    totals.steps[i]["nvme_busy_seconds"] = {{"read", static_cast<double>(k.read_busy_us) / 1e6},
                                            {"write", static_cast<double>(k.write_busy_us) / 1e6},
                                            {"either", static_cast<double>(k.busy_us) / 1e6}};
    // And the device copies' (the emulated device's run at memcpy speed beside everything else).
    totals.steps[i]["device_copies"] = {
        {"host_to_device_bytes", k.to_device_bytes},
        {"device_to_host_bytes", k.to_host_bytes},
        {"host_to_device_busy_seconds", static_cast<double>(k.to_device_busy_us) / 1e6},
        {"device_to_host_busy_seconds", static_cast<double>(k.to_host_busy_us) / 1e6}};
  }
  const std::vector<double>& measured = totals.measured;
  const uint64_t read = totals.read, written = totals.written;
  const double seconds = totals.seconds, stall = totals.stall;
  Result<memory::ProcMemory> proc = memory::read_proc_memory();
  const strata_stats st = runtime_stats();
  // Strata's own accounting beside the OS figures: what the runtime itself held (its pinned
  // arena, its device arena, its unpinned scratch) and what its sampler saw.
  const json accounting = {{"pinned_budget_bytes", st.pinned_budget_bytes},
                           {"pinned_peak_reserved_bytes", st.pinned.peak_reserved_bytes},
                           {"pinned_peak_in_use_bytes", st.pinned.peak_in_use_bytes},
                           {"device_peak_reserved_bytes", st.device.peak_reserved_bytes},
                           {"host_peak_reserved_bytes", st.host.peak_reserved_bytes},
                           {"nvme_bytes_read", st.nvme_bytes_read},
                           {"nvme_bytes_written", st.nvme_bytes_written},
                           {"os_peak_host_bytes_excluding_emulated_device",
                            st.os_peak_host_bytes_excluding_emulated_device},
                           {"os_peak_rss_bytes", st.os_peak_rss_bytes}};
  json result = {
      {"event", "result"},
      {"name", contender_.name},
      {"semantics", contender_.optimizer_overlap
                        ? "optimizer overlapped with backward: no global clipping, no overflow "
                          "check"
                        : "optimizer after backward: global clipping, a non-finite gradient "
                          "skips the step"},
      {"last_grad_norm", last_grad_norm_},
      {"last_clip_scale", last_clip_scale_},
      {"pid", static_cast<int64_t>(::getpid())},
      {"pinned_budget_bytes", st.pinned_budget_bytes},
      // How that budget was spent, which `strata plan` replays beside it (--stream-chunk,
      // --stream-buffers, --sub-group-bytes).
      {"pinned_split",
       {{"staging_bytes", st.pinned_staging_bytes},
        {"stream_chunk_bytes", st.stream_chunk_bytes},
        {"stream_buffers", st.stream_buffers},
        {"optimizer_sub_group_bytes", st.optimizer_sub_group_bytes}}},
      {"peak_host_bytes", peaks.host},
      {"peak_pinned_bytes", peaks.pinned},
      {"peak_device_bytes", peaks.device},
      {"step_seconds", median(measured)},
      {"nvme_read_gbps", seconds > 0 ? static_cast<double>(read) / seconds / 1e9 : 0.0},
      {"nvme_write_gbps", seconds > 0 ? static_cast<double>(written) / seconds / 1e9 : 0.0},
      {"stall_fraction", seconds > 0 ? stall / seconds : 0.0},
      {"peak_host_bytes_during_steps", during_steps.host},
      {"process_base_bytes", process_base_bytes_},
      {"peak_pinned_bytes_during_steps", during_steps.pinned},
      {"os_vmhwm_bytes", proc ? proc->vm_hwm : 0},
      {"strata_accounting", accounting},
      {"peak_host_moment", peaks.host_moment},
      {"peak_host_moment_during_steps", during_steps.host_moment},
      {"startup_seconds", startup_seconds_},
      {"startup_nvme_write_bytes", startup_written_},
      {"load_average_start", load_start_},
      {"load_average_end", load_average()},
      {"cpus", static_cast<int64_t>(::sysconf(_SC_NPROCESSORS_ONLN))},
      {"final_sync_seconds", final_sync_seconds_},
      {"measured_steps", measured.size()},
      {"nvme_read_bytes", read},
      {"nvme_write_bytes", written},
      {"steps", std::move(totals.steps)},
      // With --trace: the most bytes the runtime's NVMe requests had in flight at one moment,
      // from its own trace, and peak host memory over it (issue 16's "<= 3x" target).
      {"trace_peak_nvme_bytes_in_flight", in_flight_.bytes},
      {"trace_peak_in_flight_at_us", in_flight_.at_us},
      {"peak_host_over_in_flight",
       in_flight_.bytes > 0
           ? json(static_cast<double>(peaks.host) / static_cast<double>(in_flight_.bytes))
           : json(nullptr)},
      {"memory_series", memory_series_json(*sampler_)}};
  if (plan_.method != FinetuneMethod::kFull) result["lora"] = lora_result();
  channel_.send(result);
}

Status Worker::run() {
  // The live metrics also carry the runtime's busy times and device copies so far (the parent
  // serves them as counters; docs/telemetry.md).
  sampler_ = start_sampler(channel_, contender_.name, stall_us_total_, [this](json& event) {
    const std::optional<strata_stats> stats = runtime_stats_if_any();
    if (!stats) return;
    const strata_stats& st = *stats;
    event["nvme_busy_us"] = {{"read", st.nvme_read_busy_us},
                             {"write", st.nvme_write_busy_us},
                             {"either", st.nvme_busy_us}};
    event["device_copies"] = {{"host_to_device_bytes", st.host_to_device_bytes},
                              {"device_to_host_bytes", st.device_to_host_bytes},
                              {"host_to_device_busy_us", st.host_to_device_busy_us},
                              {"device_to_host_busy_us", st.device_to_host_busy_us}};
  });
  // Descriptors: every tensor's home is NVMe.
  for (const TensorSpec& t : plan_.inventory) {
    strata_tensor_desc d{};
    d.struct_size = sizeof d;
    d.name = t.name.c_str();
    d.bytes = t.bytes();
    d.dtype = static_cast<strata_dtype>(t.dtype);
    d.kind = static_cast<strata_tensor_kind>(t.kind);
    d.layer = t.layer;
    d.home_tier = STRATA_TIER_NVME;
    if (plan_.roles[descs_.size()] != TensorRole::kTrained) {
      d.flags = STRATA_TENSOR_READ_ONLY;  // LoRA's base
      d.bytes = stored_bytes(plan_, descs_.size());
      if (plan_.roles[descs_.size()] == TensorRole::kFrozenNf4) d.dtype = STRATA_DTYPE_U8;
    }
    descs_.push_back(d);
  }
  STRATA_ASSIGN_OR_RETURN(compute_, make_layer_compute(plan_));
  // The process before the runtime exists (code, libraries, the benchmark's own compute
  // buffers): what a plan leaves to --host-reserve, and what the DeepSpeed worker also reads
  // before its engine exists.
  sampler_->sample_now();
  process_base_bytes_ = sampler_->last().host;

  load_start_ = load_average();
  const auto startup = Clock::now();
  const ProcIo io_start = read_proc_io();
  sampler_->set_moment("start-up: runtime, initial weights and states");
  STRATA_TRY(create_runtime());
  STRATA_TRY(register_tensors());
  const uint64_t init_begin = now_us();
  STRATA_TRY(initialize_tensors());
  if (plan_.method != FinetuneMethod::kFull) STRATA_TRY(measure_frozen_read_rate());
  span("startup", "initial weights and states", init_begin, now_us());
  startup_seconds_ = std::chrono::duration<double>(Clock::now() - startup).count();
  startup_written_ = read_proc_io().written - io_start.written;

  // Peaks over the training steps alone, beside the whole run's: start-up (DeepSpeed's double
  // copy of its buffers, loading the weights) has its own spike.
  sampler_->start_window();
  for (uint32_t s = 0; s < plan_.options.steps; ++s) STRATA_TRY(step(s));
  const auto sync_start = Clock::now();
  STRATA_TRY(check(strata_sync(rt_), "strata_sync"));
  final_sync_seconds_ = std::chrono::duration<double>(Clock::now() - sync_start).count();
  sampler_->sample_now(/*report=*/true);  // the live metrics end at the run's totals
  sampler_->stop();

  if (!trace_path_.empty()) {
    const std::string runtime_trace = trace_path_ + ".runtime.json";
    STRATA_TRY(check(strata_export_trace(rt_, runtime_trace.c_str()), "strata_export_trace"));
    STRATA_ASSIGN_OR_RETURN(in_flight_, peak_nvme_bytes_in_flight(runtime_trace),
                            "reading the runtime's trace");
    STRATA_TRY(write_trace(runtime_trace));
  }
  send_result();
  return Status::ok();
}

}  // namespace

int run_strata_worker(const FinetunePlan& plan, const Contender& contender, int fd,
                      const std::string& trace_path) {
  Worker worker(plan, contender, fd, trace_path);
  return run_worker_process(worker);
}

}  // namespace strata::bench::finetune
