#include "optim/tiered_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "common/align.h"
#include "optim/checkpoint_file.h"
#include "optim/half_convert.h"
#include "sched/pinned_sizing.h"
#include "sched/policy.h"

namespace strata::optim {
namespace {

using Clock = std::chrono::steady_clock;
using sched::AccessMode;
using strata::Tier;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool is_float_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16;
}

TensorKind state_kind(int state) {
  switch (state) {
    case 0:
      return TensorKind::kMasterWeight;
    case 1:
      return TensorKind::kAdamM;
    default:
      return TensorKind::kAdamV;
  }
}

const char* state_name(int state) {
  return optimizer_state_word(state_kind(state));
}

// Widens n parameter values to fp32 (exact for all three dtypes).
void widen(DType dtype, const void* src, float* dst, uint64_t n) {
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const auto* h = static_cast<const uint16_t*>(src);
  if (dtype == DType::kBFloat16) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(h[i]);
  } else {
    for (uint64_t i = 0; i < n; ++i) dst[i] = fp16_to_float(h[i]);
  }
}

Status state_error(const Status& status, const std::string& param, size_t sub_group) {
  return Status(status).with_context("parameter '" + param + "', sub-group " +
                                     std::to_string(sub_group));
}

}  // namespace

Status validate(const GroupSettings& g) {
  const bool finite = std::isfinite(g.lr) && std::isfinite(g.beta1) && std::isfinite(g.beta2) &&
                      std::isfinite(g.eps) && std::isfinite(g.weight_decay);
  if (!finite) return invalid_argument("optimizer group: every setting must be finite");
  if (g.lr < 0) return invalid_argument("optimizer group: lr must be >= 0");
  if (g.beta1 < 0 || g.beta1 >= 1)
    return invalid_argument("optimizer group: beta1 must be in [0, 1)");
  if (g.beta2 < 0 || g.beta2 >= 1)
    return invalid_argument("optimizer group: beta2 must be in [0, 1)");
  if (g.eps < 0) return invalid_argument("optimizer group: eps must be >= 0");
  if (g.weight_decay < 0) return invalid_argument("optimizer group: weight_decay must be >= 0");
  return Status::ok();
}

Result<std::unique_ptr<TieredOptimizer>> TieredOptimizer::create(
    sched::Scheduler& scheduler, const TieredOptimizerConfig& config) {
  if (config.pinned_budget_bytes < kPageSize) {
    return invalid_argument("optimizer: the pinned budget must be at least 4096 bytes");
  }
  STRATA_ASSIGN_OR_RETURN(auto adam, CpuAdam::create(config.adam), "optimizer threads");
  std::unique_ptr<TieredOptimizer> optimizer(
      new TieredOptimizer(scheduler, config, std::move(adam)));
  optimizer->worker_ = std::thread([raw = optimizer.get()] { raw->worker_loop(); });
  return optimizer;
}

TieredOptimizer::TieredOptimizer(sched::Scheduler& scheduler, const TieredOptimizerConfig& config,
                                 std::unique_ptr<CpuAdam> adam)
    : scheduler_(scheduler), config_(config), adam_(std::move(adam)) {}

TieredOptimizer::~TieredOptimizer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

// ---------------------------------------------------------------------------------------------
// Groups and options

Result<uint32_t> TieredOptimizer::add_group(const GroupSettings& group) {
  STRATA_TRY(validate(group));
  std::unique_lock lock(mu_);
  wait_idle_locked(lock);
  if (groups_.size() >= kMaxCheckpointGroups) {
    return Status::error(STRATA_E_LIMIT,
                         "optimizer: at most " + std::to_string(kMaxCheckpointGroups) + " groups");
  }
  groups_.push_back(group);
  return static_cast<uint32_t>(groups_.size() - 1);
}

Status TieredOptimizer::set_group(uint32_t index, const GroupSettings& group) {
  STRATA_TRY(validate(group));
  std::unique_lock lock(mu_);
  wait_idle_locked(lock);
  if (index >= groups_.size()) {
    return invalid_argument("optimizer group " + std::to_string(index) + " does not exist (" +
                            std::to_string(groups_.size()) + " groups)");
  }
  groups_[index] = group;
  return Status::ok();
}

Result<GroupSettings> TieredOptimizer::group(uint32_t index) {
  std::lock_guard lock(mu_);
  if (index >= groups_.size()) {
    return invalid_argument("optimizer group " + std::to_string(index) + " does not exist (" +
                            std::to_string(groups_.size()) + " groups)");
  }
  return groups_[index];
}

Status TieredOptimizer::configure(const TieredOptimizerOptions& options) {
  if (!std::isfinite(options.max_grad_norm) || options.max_grad_norm < 0) {
    return invalid_argument("max_grad_norm must be finite and >= 0");
  }
  if (options.overlap_backward && (options.max_grad_norm != 0 || options.check_overflow)) {
    return invalid_argument(
        "overlap_backward needs max_grad_norm == 0 and check_overflow == 0: clipping and the "
        "overflow check need every gradient before any update");
  }
  if (options.sub_group_bytes != 0 && !sched::valid_sub_group_bytes(options.sub_group_bytes)) {
    return invalid_argument("sub_group_bytes " + std::to_string(options.sub_group_bytes) +
                            " must be 0 or a multiple of 4 between 4096 and 2^40");
  }
  std::unique_lock lock(mu_);
  wait_idle_locked(lock);
  if (options.sub_group_bytes != options_.sub_group_bytes && !params_.empty()) {
    return Status::error(STRATA_E_STATE,
                         "sub_group_bytes is " + std::to_string(options_.sub_group_bytes) +
                             " since the first add_param and cannot change to " +
                             std::to_string(options.sub_group_bytes) +
                             "; pass the value in force (strata_optimizer_get_options) to "
                             "change the other options");
  }
  if (options.overlap_backward != options_.overlap_backward && overlapped_this_step_) {
    return Status::error(STRATA_E_STATE,
                         "overlap_backward cannot change while a step's updates are under way");
  }
  options_ = options;
  return Status::ok();
}

TieredOptimizerOptions TieredOptimizer::options() {
  std::lock_guard lock(mu_);
  return options_;
}

uint64_t TieredOptimizer::sub_group_bytes_for(const TieredOptimizerConfig& config) {
  if (config.sub_group_bytes != 0) return config.sub_group_bytes;
  // The automatic sizing did not set one: the rule for a budget given exactly.
  return sched::sub_group_bytes_for_pool(config.pinned_budget_bytes);
}

uint64_t TieredOptimizer::effective_sub_group_bytes() const {
  if (options_.sub_group_bytes != 0) return options_.sub_group_bytes;
  return sub_group_bytes_for(config_);
}

uint64_t TieredOptimizer::sub_group_elements() {
  std::lock_guard lock(mu_);
  return effective_sub_group_bytes() / sizeof(float);
}

size_t TieredOptimizer::sub_group_count() {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const Param& p : params_) n += p.sub_groups.size();
  return n;
}

size_t TieredOptimizer::param_count() {
  std::lock_guard lock(mu_);
  return params_.size();
}

uint64_t TieredOptimizer::largest_sub_group_bytes() const {
  uint64_t unit = 0;
  for (const Param& p : params_) {
    for (const SubGroup& s : p.sub_groups) unit = std::max(unit, s.elements * 4 * kStateKinds);
  }
  return unit;
}

uint32_t TieredOptimizer::lookahead(uint64_t held_pinned) const {
  return sched::optimizer_lookahead(config_.pinned_budget_bytes, held_pinned,
                                    largest_sub_group_bytes());
}

uint64_t TieredOptimizer::largest_held_pinned() const {
  // A parameter held on the device keeps its pieces in pinned memory (or the two whole where
  // that is less); one the device cannot hold, the two whole. (A gradient whose newest copy is
  // pinned is held there whole beside its parameter's pieces: run_units sets the window again
  // for each parameter from what it holds.)
  uint64_t largest = 0;
  const uint64_t pieces = pieces_bytes();
  for (const Param& p : params_) {
    largest =
        std::max(largest, holds_on_device(p) ? std::min(p.pair_bytes(), pieces) : p.pair_bytes());
  }
  return largest;
}

uint32_t TieredOptimizer::lookahead() const {
  return lookahead(largest_held_pinned());
}

AdamWParams TieredOptimizer::adam_params(uint32_t group, int64_t step, float grad_scale) const {
  const GroupSettings& g = groups_[group];
  AdamWParams a;
  a.lr = g.lr;
  a.beta1 = g.beta1;
  a.beta2 = g.beta2;
  a.eps = g.eps;
  a.weight_decay = g.weight_decay;
  a.decoupled = g.decoupled;
  a.step = step;
  a.grad_scale = grad_scale;
  return a;
}

// ---------------------------------------------------------------------------------------------
// Parameters

Result<uint32_t> TieredOptimizer::find_param(sched::TensorHandle param) {
  // An unknown or unregistered handle is STRATA_E_BAD_HANDLE before anything else, as for every
  // call that takes a tensor.
  STRATA_ASSIGN_OR_RETURN(auto info, scheduler_.describe(param));
  for (uint32_t i = 0; i < params_.size(); ++i) {
    if (params_[i].param == param) return i;
  }
  return Status::error(STRATA_E_STATE, "tensor '" + info.name +
                                           "' is not under the optimizer "
                                           "(strata_optimizer_add_param)");
}

Status TieredOptimizer::add_param(uint32_t group, sched::TensorHandle param,
                                  sched::TensorHandle grad) {
  std::unique_lock lock(mu_);
  wait_idle_locked(lock);
  if (group >= groups_.size()) {
    return invalid_argument("optimizer group " + std::to_string(group) +
                            " does not exist: strata_optimizer_add_group first");
  }
  STRATA_ASSIGN_OR_RETURN(auto pinfo, scheduler_.describe(param), "param");
  STRATA_ASSIGN_OR_RETURN(auto ginfo, scheduler_.describe(grad), "grad");
  const std::string& name = pinfo.name;
  if (param == grad) return invalid_argument("param and grad are the same tensor");
  if (pinfo.kind != TensorKind::kParameter) {
    return invalid_argument("tensor '" + name + "' is not of kind PARAMETER");
  }
  if (ginfo.kind != TensorKind::kGradient) {
    return invalid_argument("tensor '" + ginfo.name + "' is not of kind GRADIENT");
  }
  if (!is_float_dtype(pinfo.dtype) || !is_float_dtype(ginfo.dtype)) {
    return invalid_argument("parameter '" + name + "' (" + to_string(pinfo.dtype) +
                            ") and its gradient (" + to_string(ginfo.dtype) +
                            ") must be F32, BF16 or F16");
  }
  const uint32_t psize = dtype_size(pinfo.dtype), gsize = dtype_size(ginfo.dtype);
  if (pinfo.bytes % psize != 0 || ginfo.bytes % gsize != 0) {
    return invalid_argument("parameter '" + name +
                            "' or its gradient is not a whole number of "
                            "elements of its dtype");
  }
  const uint64_t elements = pinfo.bytes / psize;
  if (ginfo.bytes / gsize != elements) {
    return invalid_argument("parameter '" + name + "' has " + std::to_string(elements) +
                            " elements, its gradient '" + ginfo.name + "' " +
                            std::to_string(ginfo.bytes / gsize));
  }
  for (const Param& p : params_) {
    if (p.param == param) {
      return Status::error(STRATA_E_STATE,
                           "parameter '" + name + "' is already under the optimizer");
    }
    if (p.grad == grad || p.param == grad || p.grad == param) {
      return invalid_argument("tensor '" + ginfo.name + "' already belongs to parameter '" +
                              p.name + "'");
    }
  }
  if (pinfo.residency == sched::Residency::kUnwritten) {
    return Status::error(STRATA_E_STATE, "parameter '" + name + "' has no contents yet");
  }
  if (pinfo.uses != 0) return Status::error(STRATA_E_STATE, "parameter '" + name + "' is acquired");

  const uint64_t sub_elements = effective_sub_group_bytes() / sizeof(float);
  // While its sub-groups stream, the parameter and its gradient are held on the device and moved
  // through two pinned pieces each of a sub-group's bytes (holds_on_device), or else whole in
  // pinned memory; with two sub-groups' states that must fit the pinned pool.
  const uint64_t sub = std::min(sub_elements, elements);
  const uint64_t widest = std::max(dtype_size(pinfo.dtype), dtype_size(ginfo.dtype));
  const uint64_t both = pinfo.bytes + ginfo.bytes;
  const bool on_device = config_.device_streams && both <= config_.device_budget_bytes;
  const uint64_t held =
      on_device ? std::min(both, uint64_t{2} * Pieces::kSlots * sub * widest) : both;
  // A parameter that rests in memory (home PINNED or DEVICE: a LoRA adapter beside a streamed
  // base) keeps its states at home in pinned memory, whole: neither it nor they ever touch NVMe.
  // Only a parameter whose home is NVMe streams its states from there in sub-groups.
  const Tier state_home = pinfo.home == Tier::kNvme ? Tier::kNvme : Tier::kPinned;
  const uint64_t states_held =
      kStateKinds * sizeof(float) * (state_home == Tier::kPinned ? elements : uint64_t{2} * sub);
  const uint64_t need = held + states_held;
  if (need > config_.pinned_budget_bytes) {
    return Status::error(
        STRATA_E_PINNED_BUDGET,
        "parameter '" + name + "' needs " + std::to_string(need) + " pinned bytes to be updated (" +
            (state_home == Tier::kPinned
                 ? "itself and its gradient, and its states at home in pinned memory since the "
                   "parameter's home is not NVMe"
                 : "pieces of itself and its gradient, and two sub-groups of states") +
            "); the pinned pool has " + std::to_string(config_.pinned_budget_bytes) +
            " (pinned_budget_bytes less the streaming staging buffers)");
  }

  Param p;
  p.param = param;
  p.grad = grad;
  p.name = name;
  p.elements = elements;
  p.param_dtype = pinfo.dtype;
  p.grad_dtype = ginfo.dtype;
  p.group = group;
  // Registration first, then contents: on any failure every tensor made here is unregistered.
  std::vector<sched::TensorHandle> made;
  auto undo = [&](Status status) {
    for (const auto& h : made) (void)scheduler_.unregister_tensor(h);
    return std::move(status).with_context("adding parameter '" + name + "'");
  };
  for (uint64_t offset = 0; offset < elements; offset += sub_elements) {
    SubGroup s;
    s.offset = offset;
    s.elements = std::min(sub_elements, elements - offset);
    for (int k = 0; k < kStateKinds; ++k) {
      TensorSpec spec;
      spec.name = optimizer_state_name(name, state_kind(k), p.sub_groups.size());
      spec.dtype = DType::kFloat32;
      spec.kind = state_kind(k);
      spec.layer = pinfo.layer;
      spec.shape = {s.elements};
      sched::RegisterOptions options;
      options.home = state_home;
      options.bytes = s.elements * sizeof(float);
      auto handle = scheduler_.register_tensor(spec, options);
      if (!handle) return undo(std::move(handle).take_status());
      s.states[k] = handle.value();
      made.push_back(handle.value());
    }
    p.sub_groups.push_back(s);
  }
  auto source = scheduler_.acquire(param, Tier::kPinned, AccessMode::kRead, config_.timeout);
  if (!source) return undo(std::move(source).take_status());
  Status status;
  for (const SubGroup& s : p.sub_groups) {
    void* data[kStateKinds] = {};
    int acquired = 0;
    for (; acquired < kStateKinds; ++acquired) {
      auto a = scheduler_.acquire(s.states[acquired], Tier::kPinned, AccessMode::kOverwrite,
                                  config_.timeout);
      if (!a) {
        status = std::move(a).take_status();
        break;
      }
      data[acquired] = a->data;
    }
    if (status.is_ok()) {
      widen(p.param_dtype,
            static_cast<const unsigned char*>(source->data) + s.offset * dtype_size(p.param_dtype),
            static_cast<float*>(data[0]), s.elements);
      std::memset(data[1], 0, s.elements * sizeof(float));
      std::memset(data[2], 0, s.elements * sizeof(float));
    }
    Status released =
        release_states(s, acquired, /*dirty=*/true, /*done=*/true, /*write_through=*/false);
    if (status.is_ok()) status = std::move(released);
    if (!status.is_ok()) break;
  }
  Status released = scheduler_.release(param, /*dirty=*/false);
  if (status.is_ok()) status = std::move(released);
  if (!status.is_ok()) return undo(std::move(status));
  state_bytes_ += p.elements * sizeof(float) * kStateKinds;
  params_.push_back(std::move(p));
  return Status::ok();
}

Status TieredOptimizer::release_states(const SubGroup& s, int acquired, bool dirty, bool done,
                                       bool write_through) {
  using WriteBack = sched::Scheduler::WriteBack;
  const WriteBack when = dirty && write_through ? WriteBack::kNow : WriteBack::kWhenRoomIsNeeded;
  Status first;
  for (int k = 0; k < acquired; ++k) {
    Status status = scheduler_.release(s.states[k], dirty);
    // Updated (or read by a pass that reads no more): not needed again until the next step, so
    // it may be written back at once, making room for the sub-groups read ahead while the drive
    // writes (without the hint write-behind keeps data its current phase lists, and every read
    // waited for a write; with no schedule, the LRU order would push out the sub-groups read
    // ahead, last used a pass ago, before the one just released).
    if (status.is_ok() && done) status = scheduler_.write_behind(s.states[k], when);
    if (first.is_ok() && !status.is_ok()) first = std::move(status);
  }
  return first;
}

bool TieredOptimizer::writes_through() const {
  return sched::optimizer_writes_through(state_bytes_, config_.pinned_budget_bytes,
                                         largest_held_pinned(), largest_sub_group_bytes());
}

Status TieredOptimizer::check_gradient(const Param& p) {
  auto pinfo = scheduler_.describe(p.param);
  if (!pinfo) {
    return std::move(pinfo).take_status().with_context(
        "parameter '" + p.name + "' (unregistered while under the optimizer?)");
  }
  if (pinfo->uses != 0) {
    return Status::error(STRATA_E_STATE, "parameter '" + p.name +
                                             "' is acquired: release it "
                                             "before the optimizer updates it");
  }
  auto ginfo = scheduler_.describe(p.grad);
  if (!ginfo) {
    return std::move(ginfo).take_status().with_context("gradient of '" + p.name + "'");
  }
  if (ginfo->residency == sched::Residency::kUnwritten) {
    return Status::error(STRATA_E_STATE, "the gradient of '" + p.name +
                                             "' has no contents: backward has not written it "
                                             "since the last step");
  }
  if (ginfo->uses != 0) {
    return Status::error(STRATA_E_STATE, "the gradient of '" + p.name + "' is acquired");
  }
  return Status::ok();
}

Result<GradStats> TieredOptimizer::measure_gradient(const Param& p) {
  STRATA_ASSIGN_OR_RETURN(auto info, scheduler_.describe(p.grad));
  // On the device, or on NVMe alone where it can stream to the device: through pieces (below).
  // Only a gradient backward made on the device goes back there: one made in pinned memory (the
  // training computes on the CPU) and spilled since returns to pinned memory, because there the
  // device is host memory outside the pinned budget, and the step would hold the gradient and
  // its parameter in it (hold() follows the gradient's tier).
  const bool on_device = (info.valid & sched::kDeviceBit) != 0;
  const bool streams_in = (info.valid & sched::kNvmeBit) != 0 && config_.device_streams &&
                          info.use_tier == Tier::kDevice &&
                          info.bytes <= config_.device_budget_bytes;
  if ((info.valid & sched::kPinnedBit) != 0 || !(on_device || streams_in)) {
    // In pinned memory already, or to be read from NVMe without streaming: whole, where it is or
    // lands.
    STRATA_ASSIGN_OR_RETURN(
        auto g, scheduler_.acquire(p.grad, Tier::kPinned, AccessMode::kRead, config_.timeout),
        "gradient of '" + p.name + "'");
    const GradSlice slice{g.data, p.grad_dtype, p.elements};
    auto stats = adam_->grad_stats({&slice, 1});
    Status released = scheduler_.release(p.grad, /*dirty=*/false);
    if (!stats) return std::move(stats).take_status();
    if (!released.is_ok()) return released;
    return stats;
  }
  // On the device, where backward left it (or streamed back there): read once through two
  // pinned pieces of a sub-group, not copied to pinned memory whole (a buffer of its size and a
  // copy of all of it). The sums of the pieces add up in the pieces' order.
  STRATA_ASSIGN_OR_RETURN(
      auto held, scheduler_.acquire(p.grad, Tier::kDevice, AccessMode::kRead, config_.timeout),
      "gradient of '" + p.name + "'");
  (void)held;
  Pieces pieces;
  GradStats total;
  Status status = pieces.make(scheduler_, max_piece_bytes(), config_.timeout, /*with_param=*/false);
  const uint64_t gsize = dtype_size(p.grad_dtype);
  auto start = [&](size_t k) -> Status {
    const SubGroup& s = p.sub_groups[k];
    STRATA_ASSIGN_OR_RETURN(
        pieces.grad_ticket[k % Pieces::kSlots],
        scheduler_.start_copy_range(p.grad, Tier::kDevice, s.offset * gsize,
                                    pieces.grad[k % Pieces::kSlots], Tier::kPinned, 0,
                                    s.elements * gsize, config_.timeout));
    return Status::ok();
  };
  if (status.is_ok() && !p.sub_groups.empty()) status = start(0);
  for (size_t k = 0; status.is_ok() && k < p.sub_groups.size(); ++k) {
    const int slot = static_cast<int>(k % Pieces::kSlots);
    status = Pieces::wait(scheduler_, &pieces.grad_ticket[slot], config_.timeout);
    if (status.is_ok() && k + 1 < p.sub_groups.size()) status = start(k + 1);
    if (!status.is_ok()) break;
    const GradSlice slice{pieces.grad_data[slot], p.grad_dtype, p.sub_groups[k].elements};
    auto stats = adam_->grad_stats({&slice, 1});
    if (!stats) {
      status = std::move(stats).take_status();
      break;
    }
    total.found_nonfinite = total.found_nonfinite || stats->found_nonfinite;
    total.sum_squares += stats->sum_squares;
  }
  Status waited = pieces.wait_all(scheduler_, config_.timeout);
  Status freed = pieces.free(scheduler_);
  Status released = scheduler_.release(p.grad, /*dirty=*/false);
  for (Status* s : {&waited, &freed, &released}) {
    if (status.is_ok()) status = std::move(*s);
  }
  if (!status.is_ok())
    return std::move(status).with_context("measuring the gradient of '" + p.name + "'");
  return total;
}

// ---------------------------------------------------------------------------------------------
// The pipeline

Status TieredOptimizer::update_unit(const Param& p, const SubGroup& s,
                                    void* const states[kStateKinds], const void* grad,
                                    void* param_out, int64_t step, float grad_scale) {
  AdamWSlice slice;
  slice.param = static_cast<float*>(states[0]);
  slice.m = static_cast<float*>(states[1]);
  slice.v = static_cast<float*>(states[2]);
  slice.grad = grad;
  slice.grad_dtype = p.grad_dtype;
  auto* out = static_cast<unsigned char*>(param_out);
  // A 16-bit parameter is written by the update pass itself; an fp32 one is the master copy.
  if (p.param_dtype != DType::kFloat32) {
    slice.param_out = out;
    slice.param_out_dtype = p.param_dtype;
  }
  slice.n = s.elements;
  STRATA_TRY(adam_->step(adam_params(p.group, step, grad_scale), {&slice, 1}));
  if (p.param_dtype == DType::kFloat32) std::memcpy(out, states[0], s.elements * sizeof(float));
  return Status::ok();
}

// ---- Holding a parameter and its gradient ----

bool TieredOptimizer::holds_on_device(const Param& p) const {
  // Both held at once, and nothing else of the pass's on the device: room for the two can always
  // be made there by evictions that end by themselves (streamed out, never through pinned memory
  // the pass holds), so the acquires cannot wait on the pass itself.
  return config_.device_streams && p.pair_bytes() <= config_.device_budget_bytes;
}

Result<bool> TieredOptimizer::held_on_device(const Param& p) const {
  // Where backward produced the gradient is where the training computes: gradients made on the
  // device are consumed from there, and the parameter goes back there with them.
  STRATA_ASSIGN_OR_RETURN(sched::TensorInfo grad_info, scheduler_.describe(p.grad));
  return holds_on_device(p) && grad_info.use_tier == Tier::kDevice;
}

Tier TieredOptimizer::hold_tier(const sched::TensorInfo& info, bool on_device, HeldRole role) {
  // On the device (where backward left the gradient, and where the next forward wants the
  // parameter), read and written in sub-group pieces: no pinned buffer of its size.
  if (!on_device) return Tier::kPinned;
  // A gradient whose newest copy is pinned already is read there: taking it to the device only
  // to bring it back through the pieces would copy it twice.
  if (role == HeldRole::kGradient) {
    return (info.valid & sched::kPinnedBit) == 0 ? Tier::kDevice : Tier::kPinned;
  }
  // The parameter goes to the device wherever its newest copy is. Held in pinned memory because
  // loading left it there (the first step's update found it still in the pool), it would stay
  // there for good: updated in place it is the newest copy, the schedule recorded in that first
  // step names its pinned read, so the pool keeps it, dirty, step after step. That holds a whole
  // parameter of the pinned budget (the main job's 32.8 MB lm_head in a 146 MB pool) by where
  // loading left it, not by the policy, and gives each run its own steady state (docs/planner.md,
  // "Parameters and gradients exact").
  return Tier::kDevice;
}

Result<TieredOptimizer::HeldTensor> TieredOptimizer::hold(sched::TensorHandle tensor,
                                                          bool on_device, HeldRole role) {
  STRATA_ASSIGN_OR_RETURN(auto info, scheduler_.describe(tensor));
  const Tier tier = hold_tier(info, on_device, role);
  STRATA_ASSIGN_OR_RETURN(auto a,
                          scheduler_.acquire(tensor, tier, AccessMode::kRead, config_.timeout));
  return HeldTensor{true, tier, a.data};
}

uint64_t TieredOptimizer::max_piece_bytes() const {
  const uint64_t sub_elements = effective_sub_group_bytes() / sizeof(float);
  uint64_t bytes = 0;
  for (const Param& p : params_) {
    const uint64_t widest = std::max(dtype_size(p.param_dtype), dtype_size(p.grad_dtype));
    bytes = std::max(bytes, std::min(sub_elements, p.elements) * widest);
  }
  return bytes;
}

Status TieredOptimizer::Pieces::make(sched::Scheduler& scheduler, uint64_t bytes,
                                     std::chrono::nanoseconds timeout, bool with_param) {
  if (made) return Status::ok();
  sched::RegisterOptions options;
  options.home = Tier::kPinned;
  options.allocation = true;
  for (int k = 0; k < kSlots; ++k) {
    for (const bool is_grad : {true, false}) {
      if (!is_grad && !with_param) continue;
      TensorSpec spec;
      spec.name = std::string("optimizer.") + (is_grad ? "gradient" : "parameter") + "_piece[" +
                  std::to_string(k) + "]";
      spec.dtype = DType::kUInt8;
      spec.kind = is_grad ? TensorKind::kGradient : TensorKind::kParameter;
      spec.shape = {bytes};
      STRATA_ASSIGN_OR_RETURN(auto handle, scheduler.register_tensor(spec, options));
      (is_grad ? grad : param)[k] = handle;
      made = true;  // from the first one on, free() has something to undo
      STRATA_ASSIGN_OR_RETURN(
          auto a, scheduler.acquire(handle, Tier::kPinned, AccessMode::kOverwrite, timeout));
      (is_grad ? grad_data : param_data)[k] = a.data;
    }
  }
  return Status::ok();
}

Status TieredOptimizer::Pieces::wait(sched::Scheduler& scheduler, uint64_t* ticket,
                                     std::chrono::nanoseconds timeout) {
  if (*ticket == 0) return Status::ok();
  const uint64_t redeemed = *ticket;
  *ticket = 0;
  return scheduler.wait_copy_range(redeemed, timeout);
}

Status TieredOptimizer::Pieces::wait_all(sched::Scheduler& scheduler,
                                         std::chrono::nanoseconds timeout) {
  Status first;
  for (int k = 0; k < kSlots; ++k) {
    for (uint64_t* ticket : {&grad_ticket[k], &param_ticket[k]}) {
      Status s = wait(scheduler, ticket, timeout);
      if (first.is_ok()) first = std::move(s);
    }
  }
  return first;
}

Status TieredOptimizer::Pieces::free(sched::Scheduler& scheduler) {
  if (!made) return Status::ok();
  Status first;
  for (int k = 0; k < kSlots; ++k) {
    for (sched::TensorHandle* h : {&grad[k], &param[k]}) {
      if (h->generation == 0) continue;  // never registered (make() stopped before it)
      if ((h == &grad[k] ? grad_data[k] : param_data[k]) != nullptr) {
        Status released = scheduler.release(*h, /*dirty=*/false);
        if (first.is_ok()) first = std::move(released);
      }
      Status gone = scheduler.unregister_tensor(*h);
      if (first.is_ok()) first = std::move(gone);
    }
  }
  *this = Pieces{};
  return first;
}

Status TieredOptimizer::update_held(const Param& p, const Unit& u, const std::vector<Unit>& units,
                                    size_t i, const HeldTensor& grad, const HeldTensor& param,
                                    Pieces& pieces, void* const states[kStateKinds], int64_t step,
                                    float grad_scale) {
  const SubGroup& s = p.sub_groups[u.sub_group];
  const uint64_t gsize = dtype_size(p.grad_dtype), psize = dtype_size(p.param_dtype);
  const int k = static_cast<int>(u.sub_group % Pieces::kSlots);
  auto start_grad = [&](const SubGroup& g, int slot) -> Status {
    STRATA_ASSIGN_OR_RETURN(
        pieces.grad_ticket[slot],
        scheduler_.start_copy_range(p.grad, Tier::kDevice, g.offset * gsize, pieces.grad[slot],
                                    Tier::kPinned, 0, g.elements * gsize, config_.timeout));
    return Status::ok();
  };
  const void* grad_bytes = nullptr;
  if (grad.tier == Tier::kPinned) {
    grad_bytes = static_cast<const unsigned char*>(grad.data) + s.offset * gsize;
  } else {
    if (pieces.grad_ticket[k] == 0) STRATA_TRY(start_grad(s, k));
    STRATA_TRY(Pieces::wait(scheduler_, &pieces.grad_ticket[k], config_.timeout));
    grad_bytes = pieces.grad_data[k];
    // The next sub-group's gradient travels while this one is updated.
    if (i + 1 < units.size() && units[i + 1].param == u.param) {
      const int next = static_cast<int>(units[i + 1].sub_group % Pieces::kSlots);
      STRATA_TRY(start_grad(p.sub_groups[units[i + 1].sub_group], next));
    }
  }
  void* param_bytes = nullptr;
  if (param.tier == Tier::kPinned) {
    param_bytes = static_cast<unsigned char*>(param.data) + s.offset * psize;
  } else {
    // The piece's last bytes must have left before new ones are written into it.
    STRATA_TRY(Pieces::wait(scheduler_, &pieces.param_ticket[k], config_.timeout));
    param_bytes = pieces.param_data[k];
  }
  STRATA_TRY(update_unit(p, s, states, grad_bytes, param_bytes, step, grad_scale));
  if (param.tier == Tier::kDevice) {
    STRATA_ASSIGN_OR_RETURN(
        pieces.param_ticket[k],
        scheduler_.start_copy_range(pieces.param[k], Tier::kPinned, 0, p.param, Tier::kDevice,
                                    s.offset * psize, s.elements * psize, config_.timeout));
  }
  return Status::ok();
}

namespace {

// The loader's hand-over of one sub-group: its three states, acquired (pinned, so they cannot be
// evicted) or the error that stopped the loader.
struct Loaded {
  bool ready = false;
  int acquired = 0;
  void* data[kStateKinds] = {};
  Status status;
};

}  // namespace

Status TieredOptimizer::run_units(const std::vector<Unit>& units, const PassShape& shape,
                                  int64_t step, float grad_scale, StepReport* report) {
  const AccessMode state_mode = shape.read ? AccessMode::kRead : AccessMode::kOverwrite;
  // With overlap, a loader thread acquires up to `window` sub-groups ahead of the update: their
  // reads run while this thread updates, and because they are held, the only room the scheduler
  // can make for them is that of sub-groups already updated and released, which it writes back
  // first (write-behind). Hints alone would not do: the scheduler may evict a hinted sub-group
  // before it is used to make room for the next hint.
  // The window follows what the update holds: set before the first parameter is held, then
  // again each time one is (a gradient whose newest copy is pinned is held there whole, though
  // its parameter could be held on the device in pieces, so no one figure fits every
  // parameter). Read and written under loader_mu.
  uint32_t window = shape.overlap ? lookahead() : 0;
  // Each sub-group written back as soon as it is updated (sched::optimizer_writes_through).
  const bool write_through = shape.update && writes_through();
  std::vector<Loaded> loaded(units.size());
  std::mutex loader_mu;
  std::condition_variable loader_cv;
  size_t consumed = 0;  // units the update loop has taken
  bool stop = false;
  auto hint = [&](size_t j) {
    const SubGroup& s = params_[units[j].param].sub_groups[units[j].sub_group];
    for (const auto& state : s.states) (void)scheduler_.prefetch(state, Tier::kPinned);
  };
  // The next parameter's gradient and itself, read ahead where hold() will want them while this
  // one's last sub-group is updated: with no schedule to walk (which reads them ahead with the
  // rest of the step), nothing else starts their reads before the update stops for them. Only
  // where they fit beside what is held: on the device, beside the held pair; in pinned memory,
  // in the one sub-group of room that lookahead() keeps spare. A pair read ahead into room that
  // is not there pushes out what the update needs first and is read again.
  const bool hint_params = shape.update && !scheduler_.has_schedule();
  const uint64_t spare_pinned = largest_sub_group_bytes();  // lookahead()'s one of room
  auto hint_next_param = [&](size_t i) {
    if (!hint_params || i + 1 >= units.size() || units[i + 1].param == units[i].param) return;
    const Param& p = params_[units[i + 1].param];
    Result<bool> on_device = held_on_device(p);
    if (!on_device) return;  // hold() reports it
    if (*on_device ? 2 * p.pair_bytes() > config_.device_budget_bytes
                   : p.pair_bytes() > spare_pinned) {
      return;
    }
    const std::pair<sched::TensorHandle, HeldRole> held[] = {{p.grad, HeldRole::kGradient},
                                                             {p.param, HeldRole::kParameter}};
    for (const auto& [h, role] : held) {
      Result<sched::TensorInfo> info = scheduler_.describe(h);
      if (info) (void)scheduler_.prefetch(h, hold_tier(*info, *on_device, role));
    }
  };
  auto load = [&](size_t j, Loaded& out) {
    const SubGroup& s = params_[units[j].param].sub_groups[units[j].sub_group];
    for (; out.acquired < kStateKinds; ++out.acquired) {
      auto a =
          scheduler_.acquire(s.states[out.acquired], Tier::kPinned, state_mode, config_.timeout);
      if (!a) {
        out.status = std::move(a).take_status();
        return;
      }
      out.data[out.acquired] = a->data;
    }
  };
  std::thread loader;
  if (window > 0) {
    loader = std::thread([&] {
      // Every sub-group the window allows is hinted before the loader blocks on the first of
      // them, so their reads are in flight together: one sub-group's three states at a time
      // kept the drive at a depth of about two, where it delivers a fraction of its rate. The
      // window is what fits beside the held tensors, so the hints take free or cleaned room
      // and do not push each other out.
      size_t hinted = 0;
      for (size_t j = 0; j < units.size(); ++j) {
        size_t allowed = 0;
        {
          std::unique_lock lock(loader_mu);
          loader_cv.wait(lock, [&] { return stop || j < consumed + window; });
          if (stop) return;
          allowed = std::min(units.size(), consumed + window);
        }
        for (hinted = std::max(hinted, j); hinted < allowed; ++hinted) hint(hinted);
        Loaded result;
        load(j, result);
        const bool failed = !result.status.is_ok();
        {
          std::lock_guard lock(loader_mu);
          loaded[j] = result;
          loaded[j].ready = true;
        }
        loader_cv.notify_all();
        if (failed) return;
      }
    });
  }
  // Whatever happens, the loader stops and the sub-groups it holds beyond the last one taken are
  // released unchanged.
  auto stop_loader = [&] {
    if (!loader.joinable()) return;
    {
      std::lock_guard lock(loader_mu);
      stop = true;
    }
    loader_cv.notify_all();
    loader.join();
    for (size_t j = consumed; j < units.size(); ++j) {
      if (loaded[j].ready && loaded[j].acquired > 0) {
        (void)release_states(params_[units[j].param].sub_groups[units[j].sub_group],
                             loaded[j].acquired, /*dirty=*/false, /*done=*/false,
                             /*write_through=*/false);
      }
      loaded[j].acquired = 0;
    }
  };

  // The parameter whose tensors are held, and them: each in pinned memory whole (where its
  // newest copy already is, or where the device has no room for it), or held on the device and
  // moved through two pinned pieces of a sub-group each (range copies), so that no pinned buffer
  // of a tensor's size is needed.
  uint32_t held = UINT32_MAX;
  HeldTensor grad, param;
  Pieces pieces;
  auto release_held = [&](bool updated) {
    Status first = pieces.wait_all(scheduler_, config_.timeout);
    if (param.held) {
      Status s = scheduler_.release(params_[held].param, /*dirty=*/updated);
      if (first.is_ok()) first = std::move(s);
    }
    param = HeldTensor{};
    if (grad.held) {
      Status s = scheduler_.release(params_[held].grad, /*dirty=*/false);
      if (first.is_ok()) first = std::move(s);
      // The gradient is consumed: nothing of it needs to reach NVMe, and reading it before the
      // next backward writes it is an error rather than stale data.
      if (updated) {
        Status d = scheduler_.discard(params_[held].grad);
        if (first.is_ok()) first = std::move(d);
      }
    }
    grad = HeldTensor{};
    held = UINT32_MAX;
    return first;
  };
  auto fail = [&](Status status, bool updated) {
    stop_loader();
    (void)release_held(updated);
    (void)pieces.free(scheduler_);
    return status;
  };

  for (size_t i = 0; i < units.size(); ++i) {
    const Unit& u = units[i];
    const Param& p = params_[u.param];
    const SubGroup& s = p.sub_groups[u.sub_group];
    auto started = Clock::now();
    if (shape.update && held != u.param) {
      Status done = release_held(/*updated=*/true);
      if (!done.is_ok()) return fail(std::move(done), false);
      held = u.param;
      Result<bool> held_there = held_on_device(p);
      if (!held_there) return fail(std::move(held_there).take_status(), false);
      const bool on_device = *held_there;
      Result<HeldTensor> g = hold(p.grad, on_device, HeldRole::kGradient);
      if (!g) {
        return fail(std::move(g).take_status().with_context("gradient of '" + p.name + "'"), false);
      }
      grad = *g;
      Result<HeldTensor> a = hold(p.param, on_device, HeldRole::kParameter);
      if (!a) {
        return fail(std::move(a).take_status().with_context("parameter '" + p.name + "'"), false);
      }
      param = *a;
      if (grad.tier == Tier::kDevice || param.tier == Tier::kDevice) {
        Status made = pieces.make(scheduler_, max_piece_bytes(), config_.timeout);
        if (!made.is_ok()) return fail(std::move(made).with_context("optimizer pieces"), false);
      }
      if (window > 0) {
        const uint64_t held_pinned =
            (grad.tier == Tier::kPinned ? p.elements * dtype_size(p.grad_dtype) : 0) +
            (param.tier == Tier::kPinned ? p.elements * dtype_size(p.param_dtype) : 0) +
            (pieces.made ? pieces_bytes() : 0);
        std::lock_guard lock(loader_mu);
        window = lookahead(held_pinned);
      }
    }
    Loaded current;
    if (window > 0) {
      std::unique_lock lock(loader_mu);
      loader_cv.wait(lock, [&] { return loaded[i].ready; });
      current = loaded[i];
      loaded[i].acquired = 0;  // ours now
      consumed = i + 1;
    } else {
      hint(i);
      load(i, current);
    }
    loader_cv.notify_all();
    report->read_wait_seconds += seconds_since(started);
    hint_next_param(i);
    Status status = std::move(current.status);
    if (status.is_ok()) {
      started = Clock::now();
      if (!shape.read) {
        for (void* d : current.data) std::memset(d, 0, s.elements * sizeof(float));
      }
      if (shape.update)
        status = update_held(p, u, units, i, grad, param, pieces, current.data, step, grad_scale);
      report->update_seconds += seconds_since(started);
    }
    Status released = release_states(s, current.acquired, /*dirty=*/shape.write && status.is_ok(),
                                     /*done=*/status.is_ok(), write_through);
    if (status.is_ok()) status = std::move(released);
    if (!status.is_ok()) {
      // The sub-groups before this one are updated, this one and those after are not: the
      // parameter tensor holds that mix, which the message says.
      return fail(state_error(status, p.name, u.sub_group), /*updated=*/u.sub_group > 0);
    }
    if (!shape.overlap && shape.write) {
      // The baseline: this sub-group reaches NVMe before the next one is read.
      started = Clock::now();
      Status flushed = scheduler_.flush(config_.timeout);
      report->write_wait_seconds += seconds_since(started);
      if (!flushed.is_ok()) return fail(state_error(flushed, p.name, u.sub_group), true);
    }
  }
  stop_loader();
  Status released_last = release_held(/*updated=*/true);
  Status freed = pieces.free(scheduler_);
  STRATA_TRY(std::move(released_last));
  STRATA_TRY(std::move(freed));
  if (shape.write) {
    // Write-backs already started finish here; the rest stay dirty in pinned memory and are
    // written when their room is needed (or by strata_sync), overlapping what comes next.
    const auto started = Clock::now();
    Status synced = scheduler_.sync(config_.timeout);
    report->write_wait_seconds += seconds_since(started);
    STRATA_TRY(std::move(synced).with_context("optimizer write-back"));
  }
  return Status::ok();
}

Result<StepReport> TieredOptimizer::run_pass(const PassShape& shape, float grad_scale) {
  if (shape.update && (!shape.read || !shape.write)) {
    return invalid_argument("an update pass must read and write the states");
  }
  std::unique_lock lock(mu_);
  wait_idle_locked(lock);
  STRATA_TRY(take_worker_error_locked());
  std::vector<Unit> units;
  for (uint32_t i = 0; i < params_.size(); ++i) {
    if (shape.update) STRATA_TRY(check_gradient(params_[i]));
    for (uint32_t k = 0; k < params_[i].sub_groups.size(); ++k) units.push_back({i, k});
  }
  StepReport report;
  report.step = step_;
  STRATA_TRY(run_units(units, shape, step_ + 1, grad_scale, &report));
  return report;
}

Result<StepReport> TieredOptimizer::step(double loss_scale) {
  if (!std::isfinite(loss_scale) || loss_scale <= 0) {
    return invalid_argument("loss_scale must be finite and > 0 (1 = none)");
  }
  std::unique_lock lock(mu_);
  wait_idle_locked(lock);
  STRATA_TRY(take_worker_error_locked());
  if (overlapped_this_step_ && loss_scale != last_loss_scale_) {
    return invalid_argument(
        "with overlap_backward, updates already made this step divided the "
        "gradients by the previous step's loss_scale " +
        std::to_string(last_loss_scale_) + "; a loss scale must stay fixed while overlapping");
  }
  if (step_ == INT64_MAX) return Status::error(STRATA_E_STATE, "the step count is at its limit");
  // Every check before the first byte changes: a refused step leaves everything as it was.
  for (const Param& p : params_) {
    if (!p.updated) STRATA_TRY(check_gradient(p));
  }
  StepReport report;
  auto reset_step_flags = [this] {
    for (Param& p : params_) {
      p.stats_done = p.queued = p.updated = false;
      p.ready_order = 0;
    }
    announced_ = 0;
    overlapped_this_step_ = false;
  };
  GradStats total;
  const bool measure = options_.check_overflow || options_.max_grad_norm > 0;
  if (measure) {
    const auto started = Clock::now();
    // Summed in parameter order whatever order grad_ready came in: the norm, hence the clipping
    // coefficient, does not depend on the order backward finished layers.
    for (Param& p : params_) {
      if (!p.stats_done) {
        auto stats = measure_gradient(p);
        if (!stats) return std::move(stats).take_status();
        p.stats = stats.value();
        p.stats_done = true;
      }
      total.found_nonfinite = total.found_nonfinite || p.stats.found_nonfinite;
      total.sum_squares += p.stats.sum_squares;
    }
    report.read_wait_seconds += seconds_since(started);
    report.grad_norm = std::sqrt(total.sum_squares) / loss_scale;
  }
  if (options_.check_overflow && total.found_nonfinite) {
    reset_step_flags();
    report.found_nonfinite = true;
    report.step = step_;
    return report;
  }
  const float grad_scale = unscale_and_clip(total, loss_scale, options_.max_grad_norm);
  // In the order their gradients were announced (backward's order), those never announced after
  // them in the order they were added.
  std::vector<uint32_t> order(params_.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [this](uint32_t a, uint32_t b) {
    const uint64_t ka = params_[a].ready_order, kb = params_[b].ready_order;
    return (ka != 0 && kb == 0) || (ka != 0 && kb != 0 && ka < kb);
  });
  std::vector<Unit> units;
  for (uint32_t i : order) {
    if (params_[i].updated) continue;
    for (uint32_t k = 0; k < params_[i].sub_groups.size(); ++k) units.push_back({i, k});
  }
  Status status = run_units(units, PassShape{}, step_ + 1, grad_scale, &report);
  if (!status.is_ok()) {
    reset_step_flags();
    return status;
  }
  ++step_;
  last_loss_scale_ = loss_scale;
  reset_step_flags();
  report.step = step_;
  return report;
}

// ---------------------------------------------------------------------------------------------
// Overlap with backward

Status TieredOptimizer::grad_ready(sched::TensorHandle param) {
  std::unique_lock lock(mu_);
  STRATA_ASSIGN_OR_RETURN(auto index, find_param(param));
  Param& p = params_[index];
  if (p.stats_done || p.queued || p.updated || p.ready_order != 0) {
    return Status::error(STRATA_E_STATE,
                         "the gradient of '" + p.name + "' was already announced this step");
  }
  if (options_.overlap_backward) {
    STRATA_TRY(take_worker_error_locked());
    STRATA_TRY(check_gradient(p));
    p.ready_order = ++announced_;
    p.queued = true;
    overlapped_this_step_ = true;
    queue_.push_back(index);
    cv_.notify_all();
    return Status::ok();
  }
  if (options_.check_overflow || options_.max_grad_norm > 0) {
    STRATA_TRY(check_gradient(p));
    auto stats = measure_gradient(p);
    if (!stats) return std::move(stats).take_status();
    p.stats = stats.value();
    p.stats_done = true;
  }
  p.ready_order = ++announced_;
  return Status::ok();
}

void TieredOptimizer::worker_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    const uint32_t index = queue_.front();
    queue_.pop_front();
    worker_busy_ = true;
    std::vector<Unit> units;
    for (uint32_t k = 0; k < params_[index].sub_groups.size(); ++k) units.push_back({index, k});
    const int64_t step = step_ + 1;
    const auto grad_scale = static_cast<float>(1.0 / last_loss_scale_);
    // The training thread's calls that could change what this job reads (add_param, set_group,
    // configure, ...) wait for worker_busy_ to clear; grad_ready only appends to the queue.
    lock.unlock();
    StepReport ignored;
    Status status = run_units(units, PassShape{}, step, grad_scale, &ignored);
    lock.lock();
    if (status.is_ok()) {
      params_[index].updated = true;
    } else if (worker_error_.is_ok()) {
      worker_error_ = std::move(status).with_context("overlapped update");
    }
    worker_busy_ = false;
    cv_.notify_all();
  }
}

void TieredOptimizer::wait_idle_locked(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [this] { return queue_.empty() && !worker_busy_; });
}

Status TieredOptimizer::take_worker_error_locked() {
  Status error = std::move(worker_error_);
  worker_error_ = Status::ok();
  return error;
}

// ---------------------------------------------------------------------------------------------
// Step count and states

int64_t TieredOptimizer::step_count() {
  std::lock_guard lock(mu_);
  return step_;
}

Status TieredOptimizer::set_step_count(int64_t step) {
  if (step < 0) return invalid_argument("the step count must be >= 0");
  std::unique_lock lock(mu_);
  wait_idle_locked(lock);
  if (overlapped_this_step_) {
    return Status::error(STRATA_E_STATE, "overlapped updates of this step are under way");
  }
  step_ = step;
  return Status::ok();
}

Status TieredOptimizer::copy_state(const Param& p, StateKind state, void* dst, const void* src) {
  const int k = static_cast<int>(state);
  for (size_t i = 0; i < p.sub_groups.size(); ++i) {
    const SubGroup& s = p.sub_groups[i];
    if (i + 1 < p.sub_groups.size()) {
      (void)scheduler_.prefetch(p.sub_groups[i + 1].states[k], Tier::kPinned);
    }
    auto a = scheduler_.acquire(s.states[k], Tier::kPinned,
                                src != nullptr ? AccessMode::kOverwrite : AccessMode::kRead,
                                config_.timeout);
    if (!a) return state_error(std::move(a).take_status(), p.name, i);
    const uint64_t bytes = s.elements * sizeof(float);
    if (src != nullptr) {
      std::memcpy(a->data, static_cast<const unsigned char*>(src) + s.offset * sizeof(float),
                  bytes);
    } else {
      std::memcpy(static_cast<unsigned char*>(dst) + s.offset * sizeof(float), a->data, bytes);
    }
    Status released = scheduler_.release(s.states[k], /*dirty=*/src != nullptr);
    if (!released.is_ok()) return state_error(released, p.name, i);
  }
  return Status::ok();
}

Status TieredOptimizer::read_state(sched::TensorHandle param, StateKind state, void* dst,
                                   uint64_t bytes) {
  std::unique_lock lock(mu_);
  wait_idle_locked(lock);
  STRATA_ASSIGN_OR_RETURN(auto index, find_param(param));
  const Param& p = params_[index];
  if (bytes != p.elements * sizeof(float)) {
    return invalid_argument("bytes is " + std::to_string(bytes) + "; the " +
                            state_name(static_cast<int>(state)) + " state of '" + p.name + "' is " +
                            std::to_string(p.elements * sizeof(float)) + " bytes");
  }
  return copy_state(p, state, dst, nullptr);
}

Status TieredOptimizer::write_state(sched::TensorHandle param, StateKind state, const void* src,
                                    uint64_t bytes) {
  std::unique_lock lock(mu_);
  wait_idle_locked(lock);
  STRATA_ASSIGN_OR_RETURN(auto index, find_param(param));
  const Param& p = params_[index];
  if (bytes != p.elements * sizeof(float)) {
    return invalid_argument("bytes is " + std::to_string(bytes) + "; the " +
                            state_name(static_cast<int>(state)) + " state of '" + p.name + "' is " +
                            std::to_string(p.elements * sizeof(float)) + " bytes");
  }
  return copy_state(p, state, nullptr, src);
}

bool TieredOptimizer::holds(sched::TensorHandle tensor) {
  std::unique_lock lock(mu_);
  return std::any_of(params_.begin(), params_.end(),
                     [&](const Param& p) { return p.param == tensor || p.grad == tensor; });
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

Status TieredOptimizer::export_checkpoint(const std::string& path) {
  std::unique_lock lock(mu_);
  wait_idle_locked(lock);
  STRATA_ASSIGN_OR_RETURN(auto writer, CheckpointWriter::create(path));
  CheckpointHeader header;
  header.step = step_;
  header.record_count = params_.size();
  for (const Param& p : params_) header.total_elements += p.elements;
  for (const GroupSettings& g : groups_) {
    header.groups.push_back({g.lr, g.beta1, g.beta2, g.eps, g.weight_decay, g.decoupled});
  }
  STRATA_TRY((writer)->write_header(header));
  for (const Param& p : params_) {
    STRATA_TRY((writer)->begin_record(p.name, p.group, p.elements));
    for (int k = 0; k < kStateKinds; ++k) {
      for (size_t i = 0; i < p.sub_groups.size(); ++i) {
        const SubGroup& s = p.sub_groups[i];
        const SubGroup* next = i + 1 < p.sub_groups.size() ? &p.sub_groups[i + 1]
                               : k + 1 < kStateKinds       ? &p.sub_groups[0]
                                                           : nullptr;
        if (next != nullptr) {
          (void)scheduler_.prefetch(next->states[i + 1 < p.sub_groups.size() ? k : k + 1],
                                    Tier::kPinned);
        }
        auto a = scheduler_.acquire(s.states[k], Tier::kPinned, AccessMode::kRead, config_.timeout);
        if (!a) return state_error(std::move(a).take_status(), p.name, i);
        Status written = (writer)->append(a->data, s.elements * sizeof(float));
        Status released = scheduler_.release(s.states[k], /*dirty=*/false);
        STRATA_TRY(std::move(written));
        if (!released.is_ok()) return state_error(released, p.name, i);
      }
    }
    STRATA_TRY((writer)->end_record());
  }
  return (writer)->commit();
}

Status TieredOptimizer::import_checkpoint(const std::string& path) {
  std::unique_lock lock(mu_);
  wait_idle_locked(lock);
  if (overlapped_this_step_) {
    return Status::error(STRATA_E_STATE, "overlapped updates of this step are under way");
  }
  STRATA_ASSIGN_OR_RETURN(auto opened, CheckpointReader::open(path));
  CheckpointReader& reader = *opened;
  // Pass 1: the whole file is read and every checksum checked before anything changes.
  STRATA_TRY(reader.verify());
  const CheckpointHeader& header = reader.header();
  if (header.groups.size() != groups_.size()) {
    return invalid_argument("checkpoint '" + path + "' has " +
                            std::to_string(header.groups.size()) + " groups, the optimizer " +
                            std::to_string(groups_.size()));
  }
  if (header.record_count != params_.size()) {
    return invalid_argument("checkpoint '" + path + "' has " + std::to_string(header.record_count) +
                            " parameters, the optimizer " + std::to_string(params_.size()));
  }
  if (header.step < 0) return invalid_argument("checkpoint '" + path + "' has a negative step");
  std::vector<GroupSettings> groups;
  for (const CheckpointGroup& g : header.groups) {
    GroupSettings settings{g.lr, g.beta1, g.beta2, g.eps, g.weight_decay, g.decoupled};
    STRATA_TRY(validate(settings).with_context("checkpoint '" + path + "'"));
    groups.push_back(settings);
  }
  // Records match parameters by name (in order among equal names) and must agree on size and
  // group: a checkpoint of another model is refused, not squeezed in.
  std::unordered_map<std::string, std::vector<uint32_t>> by_name;
  for (uint32_t i = params_.size(); i-- > 0;) by_name[params_[i].name].push_back(i);
  std::vector<uint32_t> target(reader.records().size());
  for (size_t r = 0; r < reader.records().size(); ++r) {
    const CheckpointRecord& record = reader.records()[r];
    auto it = by_name.find(record.name);
    if (it == by_name.end() || it->second.empty()) {
      return invalid_argument("checkpoint '" + path + "' has parameter '" + record.name +
                              "', which is not under the optimizer");
    }
    const uint32_t index = it->second.back();
    it->second.pop_back();
    const Param& p = params_[index];
    if (record.elements != p.elements || record.group != p.group) {
      return invalid_argument("checkpoint '" + path + "': parameter '" + record.name + "' has " +
                              std::to_string(record.elements) + " elements in group " +
                              std::to_string(record.group) + ", the optimizer's " +
                              std::to_string(p.elements) + " in group " + std::to_string(p.group));
    }
    target[r] = index;
  }
  // Pass 2: stream each record into its parameter's state tensors, one sub-group at a time.
  for (size_t r = 0; r < reader.records().size(); ++r) {
    const Param& p = params_[target[r]];
    int open_state = -1;
    size_t open_group = 0;
    float* open_data = nullptr;
    auto close = [&]() -> Status {
      if (open_state < 0) return Status::ok();
      const sched::TensorHandle h = p.sub_groups[open_group].states[open_state];
      open_state = -1;
      return scheduler_.release(h, /*dirty=*/true);
    };
    Status status = reader.read_states(
        reader.records()[r],
        [&](uint32_t state, uint64_t first, const float* data, uint64_t count) -> Status {
          while (count > 0) {
            // The sub-group holding element `first`: sub-groups are equal-sized but the last.
            const size_t g = static_cast<size_t>(first / p.sub_groups[0].elements);
            const SubGroup& s = p.sub_groups[g];
            if (open_state != static_cast<int>(state) || open_group != g) {
              STRATA_TRY(close());
              auto a = scheduler_.acquire(s.states[state], Tier::kPinned, AccessMode::kOverwrite,
                                          config_.timeout);
              if (!a) return state_error(std::move(a).take_status(), p.name, g);
              open_state = static_cast<int>(state);
              open_group = g;
              open_data = static_cast<float*>(a->data);
            }
            const uint64_t within = first - s.offset;
            const uint64_t n = std::min(count, s.elements - within);
            std::memcpy(open_data + within, data, n * sizeof(float));
            first += n;
            data += n;
            count -= n;
          }
          return Status::ok();
        });
    Status closed = close();
    STRATA_TRY(std::move(status));
    STRATA_TRY(std::move(closed));
  }
  groups_ = std::move(groups);
  step_ = header.step;
  for (Param& p : params_) p.stats_done = p.queued = p.updated = false;
  return Status::ok();
}

}  // namespace strata::optim
