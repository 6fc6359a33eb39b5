// The DeepSpeed baseline worker of `strata bench finetune`: DeepSpeed ZeRO-3 with parameters and
// optimizer states offloaded to NVMe, one process, one configuration (deepspeed_config.h), doing
// what DeepSpeed 0.16.5 does, step by step, on this machine's disk:
//
//   start-up   the buffers of deepspeed_buffers.h in DeepSpeed's order; a file per parameter,
//              per optimizer state of each sub-group (and per gradient slice, from backward on).
//   forward    per parameter, as ZeRO-3's per-submodule hooks fetch them: its partition is
//              read into a parameter swap buffer (prefetched from the second step on, within
//              2x the elements in flight and the free buffers, partitioned_param_coordinator.py
//              :557-580), copied to the device, its buffer released; then its share of the
//              layer's compute. Parameters used again within max_reuse_distance stay.
//   backward   the same in reverse; each gradient goes to the flat host buffer, its norm is
//              taken, it is up-cast to fp32 into the optimizer's swap buffers and written to
//              its slice file (stage3.py:1466-1526); nothing is kept across steps.
//   optimizer  sub-group by sub-group, in order (stage3.py:2086-2135): read master, exp_avg,
//              exp_avg_sq and the fp32 gradient, wait; scale the gradient for clipping
//              (2178-2187); Adam; the bf16 weights into the write-back buffer and out through
//              the parameter write handle (partitioned_param_swapper.py:404-425); the states out
//              and wait - or, pipelined, the next read and this write in flight
//              (pipelined_optimizer_swapper.py:102-158).
//
// Compute is modelled (LayerCompute, the same timed wait as Strata's worker); the Adam kernel
// is Strata's (docs/results.md states what that means for the comparison).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/align.h"
#include "common/assert.h"
#include "common/interrupt_cleanup.h"
#include "common/unique_fd.h"
#include "finetune/deepspeed_aio.h"
#include "finetune/deepspeed_host.h"
#include "finetune/finetune_worker.h"
#include "finetune/layer_compute.h"
#include "finetune/memory_sampler.h"
#include "finetune/worker_common.h"
#include "memory/host_memory.h"
#include "model/plan_report.h"
#include "optim/cpu_adam.h"
#include "optim/half_convert.h"

namespace strata::bench::finetune {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kVersionModelled = "DeepSpeed 0.16.5 (commit 38327e07f)";
constexpr uint32_t kModelBytes = 2;
constexpr uint32_t kFp32Bytes = 4;

// A worker-private directory for DeepSpeed's swap files (its nvme_path/zero_stage_3), removed at
// the end and on SIGINT/SIGTERM.
class SwapFolder {
 public:
  static Result<SwapFolder> create(const std::string& parent, const std::string& name) {
    SwapFolder f;
    f.path_ = parent + "/" + name;
    std::error_code ec;
    std::filesystem::remove_all(f.path_, ec);
    if (!std::filesystem::create_directory(f.path_, ec)) {
      return Status::error(STRATA_E_IO, "creating " + f.path_ + ": " + ec.message());
    }
    f.parent_fd_ = UniqueFd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (f.parent_fd_.valid()) {
      f.cleanup_ =
          InterruptCleanup::arm(f.parent_fd_.get(), name, InterruptCleanup::What::kDirectory);
    }
    return f;
  }
  SwapFolder() = default;
  SwapFolder(SwapFolder&& o) noexcept
      : path_(std::exchange(o.path_, {})),
        parent_fd_(std::move(o.parent_fd_)),
        cleanup_(std::move(o.cleanup_)) {}
  SwapFolder& operator=(SwapFolder&& o) noexcept {
    remove();
    path_ = std::exchange(o.path_, {});
    parent_fd_ = std::move(o.parent_fd_);
    cleanup_ = std::move(o.cleanup_);
    return *this;
  }
  SwapFolder(const SwapFolder&) = delete;
  SwapFolder& operator=(const SwapFolder&) = delete;
  ~SwapFolder() { remove(); }
  void remove() {
    cleanup_.disarm();
    if (!path_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
      path_.clear();
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  UniqueFd parent_fd_;
  InterruptCleanup cleanup_;
};

// The GPU's memory, emulated: a memfd named as the runtime names its emulated device, so that
// the sampler counts it as device memory, not host memory, for both workers alike.
class EmulatedGpu {
 public:
  static Result<EmulatedGpu> create(uint64_t bytes) {
    EmulatedGpu g;
    g.fd_ = UniqueFd(::memfd_create("strata-emulated-device", MFD_CLOEXEC));
    if (!g.fd_.valid() || ::ftruncate(g.fd_.get(), static_cast<off_t>(bytes)) != 0) {
      return errno_status(STRATA_E_NOMEM, "the emulated device", errno);
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, g.fd_.get(), 0);
    if (p == MAP_FAILED) return errno_status(STRATA_E_NOMEM, "mapping the emulated device", errno);
    g.data_ = static_cast<std::byte*>(p);
    g.bytes_ = bytes;
    return g;
  }
  EmulatedGpu() = default;
  EmulatedGpu(EmulatedGpu&& o) noexcept
      : fd_(std::move(o.fd_)),
        data_(std::exchange(o.data_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  EmulatedGpu& operator=(EmulatedGpu&& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~EmulatedGpu() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  std::byte* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  UniqueFd fd_;
  std::byte* data_ = nullptr;
  uint64_t bytes_ = 0;
};

class DeepSpeedWorker {
 public:
  DeepSpeedWorker(const FinetunePlan& plan, const Contender& contender, int fd,
                  std::string trace_path)
      : plan_(plan),
        c_(contender),
        config_(contender.deepspeed),
        layout_(contender.layout),
        channel_(fd),
        trace_path_(std::move(trace_path)),
        units_(build_units(plan.inventory, plan.model.num_hidden_layers)),
        log_(!trace_path_.empty()) {}
  ~DeepSpeedWorker() {
    if (sampler_) sampler_->stop();
    // Handles first: no request may outlive the buffers it reads or writes.
    param_read_.reset();
    param_write_.reset();
    optimizer_write_.reset();
    optimizer_.reset();
  }

  Status run();
  void send_error(const Status& status) { channel_.send(error_event(c_.name, status)); }

 private:
  struct ParamState {
    size_t spec = 0;  // inventory index
    uint64_t elements = 0;
    uint64_t file_bytes = 0;    // io-aligned bf16
    std::string file;           // swapped only
    std::byte* host = nullptr;  // not swapped: its partition in CPU memory
    uint64_t grad_offset = 0;   // in the flat gradient buffer, elements
    int slot = -1;              // the parameter swap buffer holding it, while fetched
    uint64_t ticket = 0;        // its read, while in flight
    bool on_device = false;
  };

  uint64_t now_us() const { return log_.now_us(); }
  // What the handles were asked to move so far: the step's requests, without the file system's
  // own writes that /proc/self/io also counts.
  std::pair<uint64_t, uint64_t> requested_bytes() const {
    uint64_t read = 0, written = 0;
    for (const AioHandle* h :
         {param_read_.get(), param_write_.get(), optimizer_.get(), optimizer_write_.get()}) {
      if (h == nullptr) continue;
      read += h->bytes_read();
      written += h->bytes_written();
    }
    return {read, written};
  }
  void span(const char* track, std::string name, uint64_t begin, uint64_t end, int64_t bytes = -1) {
    log_.add(track, std::move(name), begin, end, bytes);
  }
  // A wait on an aio handle (one ticket, or kAll for everything submitted): a stall.
  static constexpr uint64_t kAll = 0;
  Status wait(AioHandle& handle, uint64_t ticket, const std::string& what) {
    const uint64_t begin = now_us();
    Status s = ticket == kAll ? handle.wait_all() : handle.wait(ticket);
    const uint64_t end = now_us();
    stall_us_ += end - begin;
    if (end - begin >= kMinWaitSpanUs) span("acquire wait", what, begin, end);
    return s;
  }
  Status wait(AioHandle& handle, const std::vector<uint64_t>& tickets, const std::string& what) {
    for (uint64_t t : tickets) STRATA_TRY(wait(handle, t, what));
    return Status::ok();
  }

  Status allocate_buffers();
  Status create_handles();
  Status initialize_files();
  Status step(uint32_t index);
  Status fetch(size_t p);
  void prefetch(size_t position);
  Status start_read(ParamState& s);
  void fill_master(const SubGroup& group, float* out) const;
  Status release_from_device(size_t p);
  Status gradient_out(size_t p);
  Status optimizer_step();
  Status move_states(size_t g, int set, bool read, std::vector<uint64_t>& tickets);
  Status read_sub_group(size_t g, int set, std::vector<uint64_t>& tickets);
  Status write_sub_group(size_t g, int set, std::vector<uint64_t>& tickets);
  void progress(const char* phase, uint32_t step);
  void send_result();
  Status write_trace();

  std::byte* opt_buffer(int set, int which) const {
    return opt_buffers_[static_cast<size_t>(set) * 4 + static_cast<size_t>(which)].data();
  }
  float* host_state(const SubGroup& g, int which) const {
    return reinterpret_cast<float*>(host_states_->data()) +
           static_cast<uint64_t>(which) * layout_.host_state_elements + g.host_offset;
  }
  std::string state_file(size_t g, const char* which) const {
    return folder_.path() + "/" + std::to_string(g) + "_" + which + ".tensor.swp";
  }
  std::string gradient_file(size_t p) const {
    const ParamState& s = params_[p];
    return folder_.path() + "/" + std::to_string(p) + "_gradient_" + std::to_string(s.grad_offset) +
           "_" + std::to_string(s.elements) + ".tensor.swp";
  }

  const FinetunePlan& plan_;
  const Contender& c_;
  const DeepSpeedConfig& config_;
  const DeepSpeedLayout& layout_;
  Channel channel_;
  const std::string trace_path_;
  const std::vector<Unit> units_;
  SpanLog log_;

  std::unique_ptr<MemorySampler> sampler_;
  std::unique_ptr<LayerCompute> compute_;
  std::unique_ptr<optim::CpuAdam> adam_;
  SwapFolder folder_;
  EmulatedGpu gpu_;
  std::unique_ptr<AioHandle> param_read_, param_write_, optimizer_, optimizer_write_;
  AioHandle* optimizer_reads_ = nullptr;   // the optimizer handle, or the pipelined read one
  AioHandle* optimizer_writes_ = nullptr;  // the optimizer handle, or the pipelined write one

  // The buffers of deepspeed_buffers.h, by role.
  std::vector<HostBlock> blocks_;
  HostBlock* param_slots_ = nullptr;
  uint64_t slot_bytes_ = 0;
  std::vector<bool> slot_free_;
  HostBlock* writeback_ = nullptr;
  std::vector<HostBlock> opt_buffers_;
  HostBlock* grad_flat_ = nullptr;
  HostBlock* cpu_flat_ = nullptr;
  HostBlock* unswapped_ = nullptr;
  HostBlock* host_states_ = nullptr;  // unswapped sub-groups: master | m | v | gradient
  uint64_t pinned_bytes_ = 0, locked_bytes_ = 0;

  std::vector<ParamState> params_;
  std::vector<size_t> trace_;  // fetch order of one step (forward, then backward)
  std::vector<size_t> param_units_;
  // Per param: kept on the device from its forward to its backward (its next use comes within
  // max_reuse_distance elements of fetches).
  std::vector<bool> kept_for_backward_;
  bool trace_complete_ = false;
  std::byte* device_params_ = nullptr;  // the unit being computed
  std::byte* device_grads_ = nullptr;
  std::vector<uint64_t> device_offset_;  // per param, within its unit
  // The gradient swapper's position in the optimizer buffers (AsyncTensorSwapper).
  size_t grad_buffer_ = 0;
  uint64_t grad_buffer_used_ = 0;
  std::vector<std::vector<uint64_t>> grad_buffer_tickets_;

  uint64_t stall_us_ = 0;
  std::atomic<uint64_t> stall_total_us_{0};
  double sum_squares_ = 0;
  double compute_seconds_ = 0, optimizer_seconds_ = 0, overflow_seconds_ = 0;
  std::vector<StepRecord> steps_;
  double startup_seconds_ = 0;
  uint64_t process_base_bytes_ = 0;  // host memory before the engine exists
  double load_start_ = -1;
  double done_units_ = 0;
};

Status DeepSpeedWorker::allocate_buffers() {
  // In DeepSpeed's order; pinned blocks rounded as the CachingHostAllocator rounds them, each
  // zeroed source resident until its copy returns (deepspeed_buffers.h).
  blocks_.reserve(c_.buffers.size() * 16);
  for (const BufferSpec& b : c_.buffers) {
    if (b.life != BufferLife::kRun) continue;
    sampler_->set_moment(b.zero_source ? "start-up: pinned copy of a zeroed buffer"
                                       : "start-up: buffers");
    for (uint32_t i = 0; i < b.count; ++i) {
      HostBlock source;
      if (b.zero_source) {
        Result<HostBlock> s = HostBlock::map(b.each_bytes, false);  // torch.zeros: touched
        if (!s) return std::move(s).take_status().with_context(b.name);
        source = std::move(*s);
      }
      STRATA_ASSIGN_OR_RETURN(HostBlock block, HostBlock::map(b.each_held, b.pinned), b.name);
      if (b.zero_source) std::memcpy(block.data(), source.data(), b.each_bytes);
      if (b.pinned) {
        pinned_bytes_ += b.each_held;
        if (block.locked()) locked_bytes_ += b.each_held;
        sampler_->set_unlocked_pinned(pinned_bytes_ - locked_bytes_);
      }
      sampler_->sample_now();  // both copies exist here
      blocks_.push_back(std::move(block));
    }
  }
  // Roles, by the same order.
  size_t next = 0;
  for (const BufferSpec& b : c_.buffers) {
    if (b.life != BufferLife::kRun) continue;
    HostBlock* first = &blocks_[next];
    switch (b.role) {
      case BufferRole::kUnswappedParameters:
        unswapped_ = first;
        break;
      case BufferRole::kParameterSwap:
        param_slots_ = first;
        break;
      case BufferRole::kCpuFlatParameters:
        cpu_flat_ = first;
        break;
      case BufferRole::kWriteBack:
        writeback_ = first;
        break;
      case BufferRole::kFlatGradients:
        grad_flat_ = first;
        break;
      case BufferRole::kHostStates:
        host_states_ = first;
        break;
      case BufferRole::kOptimizerSwap:
        for (uint32_t i = 0; i < b.count; ++i) opt_buffers_.push_back(std::move(blocks_[next + i]));
        break;
      case BufferRole::kMasterSource:
      case BufferRole::kOverflowTemporary:
        STRATA_ASSERT(false);  // not run-long
    }
    next += b.count;
  }
  if (grad_flat_ == nullptr || opt_buffers_.size() < 4) {
    return Status::error(STRATA_E_INTERNAL, "DeepSpeed buffers incomplete");
  }
  if (param_slots_ != nullptr) {
    slot_bytes_ =
        io_aligned_elements(config_, config_.param_buffer_elements, kModelBytes) * kModelBytes;
    slot_free_.assign(config_.param_buffer_count, true);
  }
  return Status::ok();
}

Status DeepSpeedWorker::create_handles() {
  auto on_done = [this](const std::string& handle, bool read, const std::string& file,
                        uint64_t begin, uint64_t end, uint64_t bytes) {
    span(read ? "nvme read" : "nvme write",
         handle + ": " + std::filesystem::path(file).filename().string(), begin, end,
         static_cast<int64_t>(bytes));
  };
  auto make = [&](const char* name, std::unique_ptr<AioHandle>& out) -> Status {
    AioHandle::Options o;
    o.name = name;
    o.block_bytes = config_.aio_block_bytes;
    o.queue_depth = config_.aio_queue_depth;
    o.threads = config_.aio_intra_op_parallelism;
    o.epoch = log_.epoch();
    STRATA_ASSIGN_OR_RETURN(out, AioHandle::create(o, on_done));
    return Status::ok();
  };
  // partitioned_param_swapper.py:111-121: a read and a write handle for parameters;
  // partitioned_optimizer_swapper.py:36-40: one for the optimizer, or (pipelined) a read and a
  // write handle (pipelined_optimizer_swapper.py:58-70).
  STRATA_TRY(make("parameter reads", param_read_));
  STRATA_TRY(make("parameter writes", param_write_));
  if (config_.pipeline_read || config_.pipeline_write) {
    STRATA_TRY(make("optimizer reads", optimizer_));
    STRATA_TRY(make("optimizer writes", optimizer_write_));
    optimizer_reads_ = optimizer_.get();
    optimizer_writes_ = optimizer_write_.get();
  } else {
    STRATA_TRY(make("optimizer reads and writes", optimizer_));
    optimizer_reads_ = optimizer_writes_ = optimizer_.get();
  }
  return Status::ok();
}

Status DeepSpeedWorker::initialize_files() {
  sampler_->set_moment("start-up: initial weights and states");
  uint64_t cpu_offset = 0, unswapped_offset = 0, grad_offset = 0;
  for (size_t p = 0; p < layout_.params.size(); ++p) {
    ParamState s;
    s.spec = layout_.params[p];
    s.elements = plan_.inventory[s.spec].elements();
    s.file_bytes = io_aligned_elements(config_, s.elements, kModelBytes) * kModelBytes;
    s.grad_offset = grad_offset;
    grad_offset += s.elements;
    const SubGroup& g = layout_.sub_groups[layout_.sub_group[p]];
    if (g.in_cpu) {
      s.host = cpu_flat_->data() + cpu_offset * kModelBytes;
      cpu_offset += s.elements;
    } else if (!layout_.swapped[p]) {
      s.host = unswapped_->data() + unswapped_offset;
      unswapped_offset += s.elements * kModelBytes;
    } else {
      s.file = folder_.path() + "/" + std::to_string(p) + "_param.tensor.swp";
    }
    params_.push_back(std::move(s));
  }
  // The bf16 partitions: in CPU memory, or written to their file through a swap buffer.
  for (size_t p = 0; p < params_.size(); ++p) {
    ParamState& s = params_[p];
    auto* out = reinterpret_cast<uint16_t*>(s.host != nullptr ? s.host : param_slots_->data());
    for (uint64_t i = 0; i < s.elements; ++i)
      out[i] = optim::float_to_bf16(initial_weight(s.spec, i));
    if (s.host == nullptr) {
      std::memset(reinterpret_cast<std::byte*>(out) + s.elements * kModelBytes, 0,
                  s.file_bytes - s.elements * kModelBytes);
      STRATA_ASSIGN_OR_RETURN(uint64_t t, param_write_->write(s.file, out, s.file_bytes));
      STRATA_TRY(param_write_->wait(t));
    }
  }
  // Each sub-group's fp32 master from a pageable source of its size (stage3.py:879-883), written
  // through a pinned swap buffer; exp_avg and exp_avg_sq start at zero.
  for (size_t g = 0; g < layout_.sub_groups.size(); ++g) {
    const SubGroup& group = layout_.sub_groups[g];
    if (!group.swapped_states) {
      fill_master(group, host_state(group, 0));
      std::memset(host_state(group, 1), 0, group.elements * kFp32Bytes);
      std::memset(host_state(group, 2), 0, group.elements * kFp32Bytes);
      continue;
    }
    const uint64_t bytes = io_aligned_elements(config_, group.elements, kFp32Bytes) * kFp32Bytes;
    STRATA_ASSIGN_OR_RETURN(HostBlock source, HostBlock::map(group.elements * kFp32Bytes, false),
                            "fp32 master source");
    auto* f = reinterpret_cast<float*>(source.data());
    fill_master(group, f);
    sampler_->sample_now();
    std::memset(opt_buffer(0, 0), 0, bytes);
    std::memcpy(opt_buffer(0, 0), f, group.elements * kFp32Bytes);
    std::memset(opt_buffer(0, 1), 0, bytes);
    std::vector<uint64_t> tickets;
    for (auto [name, buffer] :
         {std::pair{"master", opt_buffer(0, 0)}, std::pair{"exp_avg", opt_buffer(0, 1)},
          std::pair{"exp_avg_sq", opt_buffer(0, 1)}}) {
      STRATA_ASSIGN_OR_RETURN(uint64_t t,
                              optimizer_writes_->write(state_file(g, name), buffer, bytes));
      tickets.push_back(t);
    }
    STRATA_TRY(optimizer_writes_->wait(tickets.back()));
    done_units_ +=
        1.0 / static_cast<double>(layout_.sub_groups.size()) * static_cast<double>(units_.size());
    progress("startup", 0);
  }
  // The fetch order of a step: every parameter in forward order, then in backward order.
  param_units_.assign(params_.size(), 0);
  std::vector<size_t> by_spec(plan_.inventory.size(), SIZE_MAX);
  for (size_t p = 0; p < params_.size(); ++p) by_spec[params_[p].spec] = p;
  uint64_t largest_unit = 0;
  device_offset_.assign(params_.size(), 0);
  for (size_t u = 0; u < units_.size(); ++u) {
    uint64_t offset = 0;
    for (const ParamEntry& e : units_[u].params) {
      const size_t p = by_spec[e.param];
      param_units_[p] = u;
      device_offset_[p] = offset;
      offset += align_up(params_[p].elements * kModelBytes, 256);
      trace_.push_back(p);
    }
    largest_unit = std::max(largest_unit, offset);
  }
  for (size_t u = units_.size(); u-- > 0;) {
    for (size_t i = units_[u].params.size(); i-- > 0;)
      trace_.push_back(by_spec[units_[u].params[i].param]);
  }
  // Released after its forward use unless its backward use comes within max_reuse_distance
  // elements of fetches (the layout decides it, for the planner too).
  kept_for_backward_ = layout_.kept_for_backward;
  STRATA_ASSIGN_OR_RETURN(gpu_, EmulatedGpu::create(2 * largest_unit));
  device_params_ = gpu_.data();
  device_grads_ = gpu_.data() + largest_unit;
  sampler_->set_device_fd(find_emulated_device_fd());
  return Status::ok();
}

// partitioned_param_coordinator.py:557-580: swap in the parameters after the one in flight,
// while the elements considered stay within twice those in flight and buffers are free. Only
// once the trace is complete (from the second step).
void DeepSpeedWorker::prefetch(size_t position) {
  if (!trace_complete_ || param_slots_ == nullptr) return;
  const uint64_t in_flight = params_[trace_[position]].elements;
  uint64_t considered = 0;
  for (size_t i = position + 1; i < trace_.size(); ++i) {
    ParamState& s = params_[trace_[i]];
    if (s.file.empty()) continue;  // no nvme_swapper
    const bool free = std::find(slot_free_.begin(), slot_free_.end(), true) != slot_free_.end();
    if (considered > 2 * in_flight || !free) break;
    if (s.slot < 0 && !s.on_device && !start_read(s).is_ok()) {
      return;  // its fetch reads it again and reports the error
    }
    considered += s.elements;
  }
}

// Reads a swapped parameter into a free swap buffer, asynchronously.
Status DeepSpeedWorker::start_read(ParamState& s) {
  const auto free = std::find(slot_free_.begin(), slot_free_.end(), true);
  if (free == slot_free_.end()) {
    return Status::error(STRATA_E_INTERNAL, "no free parameter swap buffer");
  }
  const size_t slot = static_cast<size_t>(free - slot_free_.begin());
  STRATA_ASSIGN_OR_RETURN(
      uint64_t t,
      param_read_->read(s.file, param_slots_->data() + slot * slot_bytes_, s.file_bytes));
  *free = false;
  s.slot = static_cast<int>(slot);
  s.ticket = t;
  return Status::ok();
}

void DeepSpeedWorker::fill_master(const SubGroup& group, float* out) const {
  for (size_t p : group.params) {
    for (uint64_t i = 0; i < params_[p].elements; ++i) out[i] = initial_weight(params_[p].spec, i);
    out += params_[p].elements;
  }
}

Status DeepSpeedWorker::fetch(size_t p) {
  ParamState& s = params_[p];
  if (s.on_device) return Status::ok();  // kept: within max_reuse_distance
  const std::byte* from = s.host;
  if (!s.file.empty()) {
    if (s.slot < 0) STRATA_TRY(start_read(s));
    STRATA_TRY(wait(*param_read_, s.ticket, plan_.inventory[s.spec].name));
    from = param_slots_->data() + static_cast<size_t>(s.slot) * slot_bytes_;
  }
  // The all-gather (one rank: a host-to-device copy), then the swap buffer is released.
  const uint64_t copy_begin = now_us();
  std::memcpy(device_params_ + device_offset_[p], from, s.elements * kModelBytes);
  span("h2d copy", plan_.inventory[s.spec].name, copy_begin, now_us(),
       static_cast<int64_t>(s.elements * kModelBytes));
  if (s.slot >= 0) {
    slot_free_[static_cast<size_t>(s.slot)] = true;
    s.slot = -1;
  }
  s.on_device = true;
  return Status::ok();
}

Status DeepSpeedWorker::release_from_device(size_t p) {
  // Parameters under param_persistence_threshold stay on the GPU for the whole run
  // (partitioned_param_coordinator.py: persistent parameters are never released).
  if (!layout_.persistent[p]) params_[p].on_device = false;
  return Status::ok();
}

// stage3.py:1466-1526 and the gradient swapper (optimizer_utils.py _swap_out_gradients,
// AsyncTensorSwapper): the bf16 gradient into the flat host buffer, its norm, then up-cast to
// fp32 into the optimizer's swap buffers (all of them, allocate_all) and written to its slice
// file; a full buffer waits for its writes before it is reused.
Status DeepSpeedWorker::gradient_out(size_t p) {
  const ParamState& s = params_[p];
  const auto* device_grad = reinterpret_cast<const uint16_t*>(device_grads_ + device_offset_[p]);
  auto* flat = reinterpret_cast<uint16_t*>(grad_flat_->data()) + s.grad_offset;
  const uint64_t copy_begin = now_us();
  std::memcpy(flat, device_grad, s.elements * kModelBytes);
  span("d2h copy", plan_.inventory[s.spec].name, copy_begin, now_us(),
       static_cast<int64_t>(s.elements * kModelBytes));
  const optim::GradSlice slice{device_grad, DType::kBFloat16, static_cast<size_t>(s.elements)};
  STRATA_ASSIGN_OR_RETURN(optim::GradStats stats,
                          adam_->grad_stats(std::span<const optim::GradSlice>(&slice, 1)));
  sum_squares_ += stats.sum_squares;
  const SubGroup& group = layout_.sub_groups[layout_.sub_group[p]];
  auto upcast = [&](float* out) {
    for (uint64_t i = 0; i < s.elements; ++i) out[i] = optim::bf16_to_float(device_grad[i]);
  };
  if (!group.swapped_states) {
    // stage3.py:1511-1515: into the fp32 partition's gradient in CPU memory.
    upcast(host_state(group, 3) + (s.grad_offset - params_[group.params.front()].grad_offset));
    return Status::ok();
  }
  const uint64_t bytes = io_aligned_elements(config_, s.elements, kFp32Bytes) * kFp32Bytes;
  const uint64_t capacity = opt_buffers_[0].size();
  if (grad_buffer_used_ + bytes > capacity) {
    grad_buffer_ = (grad_buffer_ + 1) % opt_buffers_.size();
    grad_buffer_used_ = 0;
    STRATA_TRY(
        wait(*optimizer_writes_, grad_buffer_tickets_[grad_buffer_], "gradient swap buffer"));
    grad_buffer_tickets_[grad_buffer_].clear();
  }
  auto* out = reinterpret_cast<float*>(opt_buffers_[grad_buffer_].data() + grad_buffer_used_);
  upcast(out);
  std::memset(reinterpret_cast<std::byte*>(out) + s.elements * kFp32Bytes, 0,
              bytes - s.elements * kFp32Bytes);
  STRATA_ASSIGN_OR_RETURN(uint64_t t, optimizer_writes_->write(gradient_file(p), out, bytes));
  grad_buffer_tickets_[grad_buffer_].push_back(t);
  grad_buffer_used_ += bytes;
  return Status::ok();
}

// master, exp_avg and exp_avg_sq of sub-group `g`, a file each, to or from buffer set `set`.
Status DeepSpeedWorker::move_states(size_t g, int set, bool read, std::vector<uint64_t>& tickets) {
  const uint64_t bytes =
      io_aligned_elements(config_, layout_.sub_groups[g].elements, kFp32Bytes) * kFp32Bytes;
  AioHandle& handle = read ? *optimizer_reads_ : *optimizer_writes_;
  int which = 0;
  for (const char* name : {"master", "exp_avg", "exp_avg_sq"}) {
    std::byte* buffer = opt_buffer(set, which++);
    STRATA_ASSIGN_OR_RETURN(uint64_t t, read ? handle.read(state_file(g, name), buffer, bytes)
                                             : handle.write(state_file(g, name), buffer, bytes));
    tickets.push_back(t);
  }
  return Status::ok();
}

Status DeepSpeedWorker::read_sub_group(size_t g, int set, std::vector<uint64_t>& tickets) {
  const SubGroup& group = layout_.sub_groups[g];
  if (!group.swapped_states) return Status::ok();
  STRATA_TRY(move_states(g, set, true, tickets));
  // The fp32 gradient: its slices, each from its own file, into the fourth buffer
  // (partitioned_optimizer_swapper.py:207-230).
  uint64_t offset = 0;
  for (size_t p : group.params) {
    const uint64_t slice =
        io_aligned_elements(config_, params_[p].elements, kFp32Bytes) * kFp32Bytes;
    STRATA_ASSIGN_OR_RETURN(
        uint64_t t, optimizer_reads_->read(gradient_file(p), opt_buffer(set, 3) + offset, slice));
    tickets.push_back(t);
    offset += slice;
  }
  return Status::ok();
}

Status DeepSpeedWorker::write_sub_group(size_t g, int set, std::vector<uint64_t>& tickets) {
  if (!layout_.sub_groups[g].swapped_states) return Status::ok();
  return move_states(g, set, false, tickets);
}

Status DeepSpeedWorker::optimizer_step() {
  sampler_->set_moment("step: optimizer");
  // flush_gradients: every gradient write done before the buffers become state buffers.
  STRATA_TRY(wait(*optimizer_writes_, kAll, "gradient swap-out"));
  if (plan_.precision == Precision::kFp16) {
    std::vector<GradientView> views{
        {reinterpret_cast<const uint16_t*>(grad_flat_->data()), layout_.total_elements, true}};
    sampler_->set_moment("step: fp16 overflow check");
    const uint64_t begin = now_us();
    STRATA_ASSIGN_OR_RETURN(OverflowCheckResult checked,
                            deepspeed_overflow_check(views, adam_->pool(), *sampler_));
    overflow_seconds_ += static_cast<double>(now_us() - begin) / 1e6;
    span("overflow check", "isinf + isnan passes", begin, now_us(),
         static_cast<int64_t>(checked.temporary_bytes));
    sampler_->set_moment("step: optimizer");
  }
  const double norm = std::sqrt(sum_squares_);
  // unscale_and_clip_grads (stage3.py:2178-2187), loss scale 1 for bf16.
  float combined_scale = 1.0f;
  if (config_.gradient_clipping > 0) {
    combined_scale = static_cast<float>(std::max(1.0, (norm + 1e-6) / config_.gradient_clipping));
  }
  optim::AdamWParams hp;
  hp.lr = 1e-5;
  hp.weight_decay = 0.01;
  hp.step = static_cast<int64_t>(steps_.size()) + 1;
  const bool pipelined = config_.pipeline_read || config_.pipeline_write;
  const int sets = pipelined ? 3 : 1;
  std::vector<uint64_t> read_tickets, param_write_tickets;
  std::vector<std::vector<uint64_t>> async_writes(static_cast<size_t>(sets));
  const size_t groups = layout_.sub_groups.size();
  // The next sub-group's reads, into the set whose asynchronous write has completed.
  auto read_next = [&](size_t g) -> Status {
    const auto next = (g + 1) % static_cast<size_t>(sets);
    STRATA_TRY(wait(*optimizer_writes_, async_writes[next], "optimizer swap-out"));
    async_writes[next].clear();
    return read_sub_group(g + 1, static_cast<int>(next), read_tickets);
  };
  STRATA_TRY(read_sub_group(0, 0, read_tickets));
  for (size_t g = 0; g < groups; ++g) {
    const int set = static_cast<int>(g % static_cast<size_t>(sets));
    const SubGroup& group = layout_.sub_groups[g];
    // swap_in_optimizer_state: wait for this sub-group's reads; pipelined, start the next one's
    // into a set whose asynchronous write has completed.
    STRATA_TRY(wait(*optimizer_reads_, read_tickets, "optimizer swap-in"));
    read_tickets.clear();
    if (config_.pipeline_read && g + 1 < groups) STRATA_TRY(read_next(g));
    const uint64_t begin = now_us();
    const uint64_t stall_before = stall_us_;
    const bool swapped = group.swapped_states;
    auto* grad = swapped ? reinterpret_cast<float*>(opt_buffer(set, 3)) : host_state(group, 3);
    // The fp32 gradient is one flat tensor of the sub-group; slices were read io-aligned, so
    // compact them first when alignment left gaps (none for sizes that are multiples of 1024).
    uint64_t packed = 0, read_at = 0;
    for (size_t p : group.params) {
      const uint64_t n = params_[p].elements;
      if (swapped && packed != read_at) std::memmove(grad + packed, grad + read_at, n * kFp32Bytes);
      packed += n;
      read_at += io_aligned_elements(config_, n, kFp32Bytes);
    }
    // grad.mul_(1 / combined_scale), a pass of its own.
    const float inverse = 1.0f / combined_scale;
    const int threads = adam_->pool().threads();
    auto scale = [&](int t) {
      const uint64_t b = group.elements * static_cast<uint64_t>(t) / threads;
      const uint64_t e = group.elements * static_cast<uint64_t>(t + 1) / threads;
      for (uint64_t i = b; i < e; ++i) grad[i] *= inverse;
    };
    adam_->pool().run_each(scale);
    optim::AdamWSlice slice;
    slice.param = swapped ? reinterpret_cast<float*>(opt_buffer(set, 0)) : host_state(group, 0);
    slice.m = swapped ? reinterpret_cast<float*>(opt_buffer(set, 1)) : host_state(group, 1);
    slice.v = swapped ? reinterpret_cast<float*>(opt_buffer(set, 2)) : host_state(group, 2);
    slice.grad = grad;
    slice.grad_dtype = DType::kFloat32;
    slice.n = static_cast<size_t>(group.elements);
    STRATA_TRY(adam_->step(hp, std::span<const optim::AdamWSlice>(&slice, 1)));
    // _reassign_or_swap_out_partitioned_parameters: the bf16 weights into CPU memory, or
    // (after the previous write-back completes) into the write-back buffer and out.
    const float* master = slice.param;
    if (group.in_cpu) {
      uint64_t at = 0;
      for (size_t p : group.params) {
        auto* out = reinterpret_cast<uint16_t*>(params_[p].host);
        for (uint64_t i = 0; i < params_[p].elements; ++i)
          out[i] = optim::float_to_bf16(master[at + i]);
        at += params_[p].elements;
      }
    } else {
      STRATA_TRY(wait(*param_write_, param_write_tickets, "parameter write-back"));
      param_write_tickets.clear();
      uint64_t at = 0, offset = 0;
      for (size_t p : group.params) {
        const ParamState& s = params_[p];
        auto* out = reinterpret_cast<uint16_t*>(writeback_->data() + offset);
        for (uint64_t i = 0; i < s.elements; ++i) out[i] = optim::float_to_bf16(master[at + i]);
        std::memset(reinterpret_cast<std::byte*>(out) + s.elements * kModelBytes, 0,
                    s.file_bytes - s.elements * kModelBytes);
        at += s.elements;
        if (!s.file.empty()) {
          STRATA_ASSIGN_OR_RETURN(uint64_t t, param_write_->write(s.file, out, s.file_bytes));
          param_write_tickets.push_back(t);
        } else {
          std::memcpy(s.host, out, s.elements * kModelBytes);
        }
        offset += s.file_bytes;
      }
    }
    // CPU time of the update alone: the wait for the previous write-back above is a stall.
    optimizer_seconds_ += static_cast<double>(now_us() - begin - (stall_us_ - stall_before)) / 1e6;
    span("optimizer", "sub-group " + std::to_string(g), begin, now_us(),
         static_cast<int64_t>(group.elements));
    // swap_out_optimizer_state: write and wait, or (pipeline_write) leave it in flight until
    // the set is needed again.
    std::vector<uint64_t> tickets;
    STRATA_TRY(write_sub_group(g, set, tickets));
    if (config_.pipeline_write) {
      async_writes[static_cast<size_t>(set)] = std::move(tickets);
    } else {
      STRATA_TRY(wait(*optimizer_writes_, tickets, "optimizer swap-out"));
    }
    if (!config_.pipeline_read && g + 1 < groups) STRATA_TRY(read_next(g));
    done_units_ += static_cast<double>(units_.size()) / static_cast<double>(groups);
    progress("optimizer", static_cast<uint32_t>(steps_.size()));
  }
  STRATA_TRY(wait(*optimizer_writes_, kAll, "optimizer swap-out"));
  STRATA_TRY(wait(*param_write_, kAll, "parameter write-back"));
  return Status::ok();
}

Status DeepSpeedWorker::step(uint32_t index) {
  stall_us_ = 0;
  sum_squares_ = 0;
  compute_seconds_ = optimizer_seconds_ = overflow_seconds_ = 0;
  const ProcIo io_before = read_proc_io();
  const auto requested_before = requested_bytes();
  const auto start = Clock::now();
  const uint64_t begin_us = now_us();
  grad_buffer_tickets_.assign(opt_buffers_.size(), {});
  grad_buffer_ = 0;
  grad_buffer_used_ = 0;
  const size_t forward_end = trace_.size() / 2;
  auto compute_share = [&](size_t p, bool backward) -> Status {
    const ParamState& s = params_[p];
    ComputeTensor t{&plan_.inventory[s.spec], device_params_ + device_offset_[p],
                    backward ? device_grads_ + device_offset_[p] : nullptr, nullptr};
    const uint64_t b = now_us();
    Status st = backward ? compute_->backward(std::span<const ComputeTensor>(&t, 1))
                         : compute_->forward(std::span<const ComputeTensor>(&t, 1));
    const uint64_t e = now_us();
    compute_seconds_ += static_cast<double>(e - b) / 1e6;
    span("compute", std::string(backward ? "backward " : "forward ") + plan_.inventory[s.spec].name,
         b, e);
    return st;
  };
  sampler_->set_moment("step: forward");
  size_t previous_unit = SIZE_MAX;
  for (size_t i = 0; i < forward_end; ++i) {
    const size_t p = trace_[i];
    STRATA_TRY(fetch(p));
    prefetch(i);
    STRATA_TRY(compute_share(p, false));
    if (!kept_for_backward_[p]) STRATA_TRY(release_from_device(p));
    if (param_units_[p] != previous_unit) {
      done_units_ += 1;
      previous_unit = param_units_[p];
      progress("forward", index);
    }
  }
  sampler_->set_moment("step: backward");
  for (size_t i = forward_end; i < trace_.size(); ++i) {
    const size_t p = trace_[i];
    STRATA_TRY(fetch(p));
    prefetch(i);
    STRATA_TRY(compute_share(p, true));
    STRATA_TRY(gradient_out(p));
    STRATA_TRY(release_from_device(p));
    if (param_units_[p] != previous_unit) {
      done_units_ += 1;
      previous_unit = param_units_[p];
      progress("backward", index);
    }
  }
  trace_complete_ = true;  // the coordinator has recorded the trace: prefetch from now on
  STRATA_TRY(optimizer_step());
  StepRecord r;
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  span("step", "step " + std::to_string(index), begin_us, now_us());
  const ProcIo io_after = read_proc_io();
  r.read = io_after.read - io_before.read;
  r.written = io_after.written - io_before.written;
  const auto requested_after = requested_bytes();
  r.runtime_read = requested_after.first - requested_before.first;
  r.runtime_written = requested_after.second - requested_before.second;
  r.stall = static_cast<double>(stall_us_) / 1e6;
  stall_total_us_ += stall_us_;
  r.compute = compute_seconds_;
  r.optimizer = optimizer_seconds_;
  r.overflow_check = overflow_seconds_;
  r.grad_norm = std::sqrt(sum_squares_);
  steps_.push_back(r);
  return Status::ok();
}

void DeepSpeedWorker::progress(const char* phase, uint32_t step) {
  const double per_step = 3.0 * static_cast<double>(units_.size());
  const double total = static_cast<double>(units_.size()) + per_step * plan_.options.steps;
  channel_.send({{"event", "progress"},
                 {"strategy", c_.name},
                 {"phase", phase},
                 {"step", step},
                 {"steps", plan_.options.steps},
                 {"fraction", std::min(1.0, done_units_ / total)}});
}

Status DeepSpeedWorker::write_trace() {
  return write_worker_trace(trace_path_, {{"strategy", c_.name}, {"runtime_trace", ""}},
                            log_.spans());
}

json config_json(const DeepSpeedConfig& c, const DeepSpeedLayout& layout) {
  return {{"offload_param",
           {{"device", "nvme"},
            {"buffer_count", c.param_buffer_count},
            {"buffer_size", c.param_buffer_elements},
            {"max_in_cpu", c.max_in_cpu},
            {"pin_memory", c.param_pin_memory}}},
          {"offload_optimizer",
           {{"device", "nvme"},
            {"buffer_count", c.optimizer_buffer_count},
            {"pin_memory", c.optimizer_pin_memory},
            {"pipeline_read", c.pipeline_read},
            {"pipeline_write", c.pipeline_write}}},
          {"sub_group_size", c.sub_group_elements},
          {"stage3_prefetch_bucket_size", c.prefetch_bucket_elements},
          {"stage3_param_persistence_threshold", c.param_persistence_threshold},
          {"stage3_max_live_parameters", c.max_live_parameters},
          {"stage3_max_reuse_distance", c.max_reuse_distance},
          {"aio",
           {{"block_size", c.aio_block_bytes},
            {"queue_depth", c.aio_queue_depth},
            {"intra_op_parallelism", c.aio_intra_op_parallelism},
            {"single_submit", false},
            {"overlap_events", true}}},
          {"gradient_clipping", c.gradient_clipping},
          {"sub_groups", layout.sub_groups.size()},
          {"largest_sub_group", layout.largest_sub_group}};
}

void DeepSpeedWorker::send_result() {
  const MemoryPeaks peaks = sampler_->peaks();
  const MemoryPeaks during = sampler_->window_peaks();
  StepTotals totals = summarize_steps(steps_);
  const std::vector<double>& measured = totals.measured;
  const uint64_t read = totals.read, written = totals.written;
  const double seconds = totals.seconds, stall = totals.stall;
  Result<memory::ProcMemory> proc = memory::read_proc_memory();
  const BufferPeaks modelled = buffer_peaks(c_.buffers);
  const double n = static_cast<double>(std::max<size_t>(measured.size(), 1));
  channel_.send(
      {{"event", "result"},
       {"name", c_.name},
       {"deepspeed_version_modelled", kVersionModelled},
       {"semantics", "optimizer after backward: global clipping"},
       {"pid", static_cast<int64_t>(::getpid())},
       {"peak_host_bytes", peaks.host},
       {"peak_host_moment", peaks.host_moment},
       {"peak_host_bytes_steps", during.host},
       {"peak_host_bytes_during_steps", during.host},
       {"process_base_bytes", process_base_bytes_},
       {"peak_host_moment_during_steps", during.host_moment},
       {"peak_pinned_bytes", peaks.pinned},
       {"peak_pinned_bytes_during_steps", during.pinned},
       {"peak_device_bytes", peaks.device},
       {"modelled_peak_host_bytes", modelled.run},
       {"modelled_peak_host_moment", modelled.run_moment},
       {"modelled_peak_host_bytes_steps", modelled.steps},
       {"modelled_pinned_bytes", modelled.pinned},
       {"step_seconds", median(measured)},
       {"nvme_read_bytes_per_step", static_cast<double>(read) / n},
       {"nvme_write_bytes_per_step", static_cast<double>(written) / n},
       {"nvme_read_gbps", seconds > 0 ? static_cast<double>(read) / seconds / 1e9 : 0.0},
       {"nvme_write_gbps", seconds > 0 ? static_cast<double>(written) / seconds / 1e9 : 0.0},
       {"stall_fraction", seconds > 0 ? stall / seconds : 0.0},
       {"os_vmhwm_bytes", proc ? proc->vm_hwm : 0},
       {"startup_seconds", startup_seconds_},
       {"load_average_start", load_start_},
       {"load_average_end", load_average()},
       {"cpus", static_cast<int64_t>(::sysconf(_SC_NPROCESSORS_ONLN))},
       {"measured_steps", measured.size()},
       {"nvme_read_bytes", read},
       {"nvme_write_bytes", written},
       {"config", config_json(config_, layout_)},
       {"buffers", deepspeed_buffers_json(c_.buffers)},
       {"steps", std::move(totals.steps)},
       {"memory_series", memory_series_json(*sampler_)}});
}

Status DeepSpeedWorker::run() {
  sampler_ = start_sampler(channel_, c_.name, stall_total_us_);
  STRATA_ASSIGN_OR_RETURN(compute_, make_layer_compute(plan_));
  // The process before DeepSpeed's engine (its CPU Adam, handles, buffers) exists, read where
  // the Strata worker reads it, before its runtime.
  sampler_->sample_now();
  process_base_bytes_ = sampler_->last().host;
  STRATA_ASSIGN_OR_RETURN(adam_, optim::CpuAdam::create());
  load_start_ = load_average();
  const auto startup = Clock::now();
  STRATA_ASSIGN_OR_RETURN(
      folder_, SwapFolder::create(plan_.options.nvme_dir,
                                  "strata-" + c_.name + "-" + std::to_string(::getpid())));
  STRATA_TRY(create_handles());
  const uint64_t begin = now_us();
  STRATA_TRY(allocate_buffers());
  span("startup", "deepspeed buffers", begin, now_us());
  STRATA_TRY(initialize_files());
  startup_seconds_ = std::chrono::duration<double>(Clock::now() - startup).count();
  sampler_->start_window();
  for (uint32_t s = 0; s < plan_.options.steps; ++s) STRATA_TRY(step(s));
  sampler_->sample_now(/*report=*/true);  // the live metrics end at the run's totals
  sampler_->stop();
  if (!trace_path_.empty()) STRATA_TRY(write_trace());
  send_result();
  return Status::ok();
}

}  // namespace

int run_deepspeed_worker(const FinetunePlan& plan, const Contender& contender, int fd,
                         const std::string& trace_path) {
  DeepSpeedWorker worker(plan, contender, fd, trace_path);
  return run_worker_process(worker);
}

}  // namespace strata::bench::finetune
