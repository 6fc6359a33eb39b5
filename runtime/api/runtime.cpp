#include "api/runtime.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "api/torch_memory.h"
#include "api/versioned_struct.h"
#include "common/align.h"
#include "common/units.h"
#include "io/engine_factory.h"
#include "io/fault_injection.h"
#include "io/paced_engine.h"
#include "optim/thread_pool.h"
#include "sched/memory_plan.h"
#include "storage/drive_probe.h"
#include "storage/extent_store.h"
#include "storage/file_per_tensor_store.h"

namespace strata::api {
namespace {

// Explicit limits on what a config may ask for: beyond them the request is a typo, not a plan.
constexpr uint32_t kMaxQueueDepth = 4096;
constexpr uint32_t kMaxBlockSize = 64u << 20;
constexpr uint32_t kMaxThreads = 256;
constexpr uint32_t kMaxTraceEvents = 1u << 26;

io::IoEngineKind engine_kind(strata_io_engine engine) {
  switch (engine) {
    case STRATA_IO_URING:
      return io::IoEngineKind::kUring;
    case STRATA_IO_PSYNC:
      return io::IoEngineKind::kPsync;
    case STRATA_IO_AUTO:
      break;
  }
  return io::IoEngineKind::kAuto;
}

memory::DeviceBackend device_backend(strata_device_backend backend) {
  switch (backend) {
    case STRATA_DEVICE_CUDA:
      return memory::DeviceBackend::kCuda;
    case STRATA_DEVICE_EMULATED:
      return memory::DeviceBackend::kEmulated;
    case STRATA_DEVICE_AUTO:
      break;
  }
  return memory::DeviceBackend::kAuto;
}

// config.planned_tensors as specs, each element read by the in-struct rule and checked, under
// every policy (only ZeRO-Infinity's sizes its buffers from them, but a bad array is the caller's
// bug whichever policy reads it).
Result<std::vector<TensorSpec>> planned_inventory(const strata_config& c) {
  // Sizes past these are typos, and the plan's byte arithmetic (and its rounding up to powers
  // of two) would overflow on them.
  constexpr uint64_t kMaxPlannedBytes = uint64_t{1} << 56;
  // No more than the tensors a runtime can have registered at once.
  if (c.planned_tensor_count > size_t{sched::kMaxHandleIndex} + 1) {
    return invalid_argument("config.planned_tensor_count is limited to " +
                            std::to_string(size_t{sched::kMaxHandleIndex} + 1) +
                            " (the most tensors a runtime registers)");
  }
  std::vector<TensorSpec> inventory;
  inventory.reserve(c.planned_tensor_count);
  uint64_t planned_bytes = 0;
  for (size_t i = 0; i < c.planned_tensor_count; ++i) {
    STRATA_ASSIGN_OR_RETURN(auto element,
                            read_array_element_in(c.planned_tensors, i, default_tensor_desc(),
                                                  "config.planned_tensors"));
    const strata_tensor_desc& d = element;
    if (d.bytes == 0 || d.bytes > kMaxPlannedBytes - planned_bytes || d.dtype < STRATA_DTYPE_F32 ||
        d.dtype > STRATA_DTYPE_U8 || d.kind < STRATA_KIND_PARAMETER || d.kind > STRATA_KIND_OTHER) {
      return invalid_argument("planned_tensors[" + std::to_string(i) + "] is invalid (sizes: " +
                              "each > 0, all together at most 2^56 bytes)");
    }
    planned_bytes += d.bytes;
    TensorSpec spec;
    spec.dtype = static_cast<DType>(d.dtype);
    spec.kind = static_cast<TensorKind>(d.kind);
    spec.layer = d.layer;
    spec.shape = {(d.bytes + dtype_size(spec.dtype) - 1) / dtype_size(spec.dtype)};
    inventory.push_back(std::move(spec));
  }
  return inventory;
}

// DeepSpeed's buffers are sized from the model, so this policy needs the planned tensors.
Result<sched::MemoryPlan> zero_infinity_plan(const strata_config& c) {
  if (c.planned_tensors == nullptr || c.planned_tensor_count == 0) {
    return invalid_argument(
        "set config.planned_tensors: ZeRO-Infinity sizes its uniform slots "
        "for the largest tensor, as DeepSpeed's buffer_size must be");
  }
  // A swap-buffer size near 2^64 made creation loop forever (found by tests/fuzz/config_fuzz).
  constexpr uint64_t kMaxZeroElements = uint64_t{1} << 40;
  if (c.zero_sub_group_elements > kMaxZeroElements ||
      c.zero_param_buffer_elements > kMaxZeroElements) {
    return invalid_argument(
        "zero_sub_group_elements and zero_param_buffer_elements are limited to " +
        std::to_string(kMaxZeroElements));
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<TensorSpec> inventory, planned_inventory(c));
  sched::ZeroInfinityOptions options;
  if (c.zero_sub_group_elements != 0) options.sub_group_elements = c.zero_sub_group_elements;
  if (c.zero_param_buffer_elements != 0) {
    options.param_buffer_elements = c.zero_param_buffer_elements;
  }
  STRATA_ASSIGN_OR_RETURN(sched::MemoryPlan plan, sched::zero_infinity_memory_plan(
                                                      inventory, options, c.device_budget_bytes));
  // DeepSpeed allocates its pinned buffers when its engine starts, and fails there when they do
  // not fit; so does this policy. Otherwise its pools would promise room the pinned arena, held
  // to pinned_budget_bytes, does not have, and a write-back would fail later.
  uint64_t pinned = 0;
  for (const sched::PoolSpec& pool : plan.pools) {
    if (pool.tier == Tier::kPinned) pinned += std::max(pool.budget_bytes, pool.reserved_bytes);
  }
  if (pinned > c.pinned_budget_bytes) {
    return Status::error(STRATA_E_PINNED_BUDGET,
                         "ZeRO-Infinity's pinned buffers for these planned tensors take " +
                             format_bytes(pinned) + " (" + std::to_string(pinned) +
                             " B), more than pinned_budget_bytes (" +
                             format_bytes(c.pinned_budget_bytes) +
                             "): raise it, or lower zero_param_buffer_elements / "
                             "zero_sub_group_elements");
  }
  return plan;
}

}  // namespace

Result<strata_config> normalize_config(const strata_config* in) {
  strata_config defaults{};
  strata_config_init(&defaults);
  STRATA_ASSIGN_OR_RETURN(auto read, read_struct_in(in, defaults, "strata_config"));
  strata_config c = read;

  const bool has_path = c.nvme_path != nullptr && c.nvme_path[0] != '\0';
  const bool has_device = c.raw_device != nullptr && c.raw_device[0] != '\0';
  if (has_path == has_device) {
    return invalid_argument(
        "set exactly one of config.nvme_path (a directory for the swap file) "
        "and config.raw_device (a block device)");
  }
  if (c.nvme_layout != STRATA_NVME_EXTENTS && c.nvme_layout != STRATA_NVME_FILE_PER_TENSOR) {
    return invalid_argument("config.nvme_layout " + std::to_string(c.nvme_layout) +
                            " is unknown (STRATA_NVME_EXTENTS or STRATA_NVME_FILE_PER_TENSOR)");
  }
  if (c.nvme_layout == STRATA_NVME_FILE_PER_TENSOR && has_device) {
    return invalid_argument(
        "config.nvme_layout STRATA_NVME_FILE_PER_TENSOR keeps files on a file system: set "
        "config.nvme_path, not config.raw_device");
  }
  if (c.queue_depth == 0 || c.queue_depth > kMaxQueueDepth) {
    return invalid_argument("config.queue_depth " + std::to_string(c.queue_depth) +
                            " is outside 1.." + std::to_string(kMaxQueueDepth));
  }
  if (c.block_size < kPageSize || c.block_size > kMaxBlockSize || c.block_size % kPageSize) {
    return invalid_argument("config.block_size " + std::to_string(c.block_size) +
                            " must be a multiple of 4096 between 4 KiB and 64 MiB");
  }
  if (c.pinned_budget_bytes != 0 && c.pinned_budget_bytes < kPageSize) {
    return invalid_argument("config.pinned_budget_bytes must be 0 (automatic) or at least 4096");
  }
  if (c.device_budget_bytes < kPageSize) {
    return invalid_argument("config.device_budget_bytes must be at least 4096");
  }
  if (c.worker_threads > kMaxThreads || c.optimizer_threads > kMaxThreads) {
    return invalid_argument("config thread counts are limited to " + std::to_string(kMaxThreads));
  }
  if (c.io_engine < STRATA_IO_AUTO || c.io_engine > STRATA_IO_PSYNC) {
    return invalid_argument("config.io_engine " + std::to_string(c.io_engine) + " is unknown");
  }
  if (c.policy < STRATA_POLICY_STRATA || c.policy > STRATA_POLICY_ZERO_INFINITY) {
    return invalid_argument("config.policy " + std::to_string(c.policy) + " is unknown");
  }
  if (c.device_backend < STRATA_DEVICE_AUTO || c.device_backend > STRATA_DEVICE_EMULATED) {
    return invalid_argument("config.device_backend " + std::to_string(c.device_backend) +
                            " is unknown");
  }
  if (c.host_budget_bytes != 0) {
    // Accepting it would promise a limit nothing enforces.
    return Status::error(STRATA_E_UNSUPPORTED,
                         "config.host_budget_bytes " + std::to_string(c.host_budget_bytes) +
                             ": Strata holds no pageable host memory of its own (its host "
                             "buffers are pinned, bounded by pinned_budget_bytes); leave it 0");
  }
  if (c.numa_node < -1 || c.numa_node > 4095) {
    return invalid_argument("config.numa_node " + std::to_string(c.numa_node) + " is invalid");
  }
  if (c.planned_tensor_count != 0 && c.planned_tensors == nullptr) {
    return invalid_argument("config.planned_tensor_count is set but planned_tensors is NULL");
  }
  STRATA_TRY(planned_inventory(c).status());
  if (c.trace_events > kMaxTraceEvents) {
    return invalid_argument("config.trace_events is limited to " + std::to_string(kMaxTraceEvents));
  }
  const uint64_t chunk = c.stream_chunk_bytes;
  if (chunk != 0 && chunk != STRATA_STREAMING_OFF && !sched::valid_stream_chunk_bytes(chunk)) {
    return invalid_argument("config.stream_chunk_bytes " + std::to_string(chunk) +
                            " must be a power of two from 64 KiB to 64 MiB (or 0, or "
                            "STRATA_STREAMING_OFF)");
  }
  if (c.stream_buffers > sched::kMaxStreamBuffers) {
    return invalid_argument("config.stream_buffers is limited to " +
                            std::to_string(sched::kMaxStreamBuffers) + " per direction");
  }
  if ((c.drive_read_bytes_per_s == 0) != (c.drive_write_bytes_per_s == 0)) {
    return invalid_argument(
        "set both config.drive_read_bytes_per_s and drive_write_bytes_per_s, or neither");
  }
  if (c.pinned_budget_bytes == 0) {
    if (c.policy != STRATA_POLICY_STRATA || c.nvme_layout != STRATA_NVME_EXTENTS ||
        c.stream_chunk_bytes == STRATA_STREAMING_OFF) {
      return invalid_argument(
          "an automatic pinned budget (pinned_budget_bytes 0) sizes streaming buffers, which "
          "policy ZERO_INFINITY, STRATA_NVME_FILE_PER_TENSOR and STRATA_STREAMING_OFF do not "
          "use: set pinned_budget_bytes");
    }
    return c;  // sized at creation, once the drive is known (Runtime::size_pinned_budget)
  }
  const StreamingShape shape = streaming_shape(c);
  if (shape.on() && shape.staging_bytes() > c.pinned_budget_bytes / 2) {
    return invalid_argument(
        "the streaming staging buffers (2 directions x " + std::to_string(shape.buffers) + " x " +
        format_bytes(shape.chunk_bytes) + " = " + format_bytes(shape.staging_bytes()) +
        ") may take at most half of pinned_budget_bytes (" + format_bytes(c.pinned_budget_bytes) +
        "): lower stream_chunk_bytes or stream_buffers, or raise pinned_budget_bytes");
  }
  return c;
}

StreamingShape streaming_shape(const strata_config& c) {
  if (c.stream_chunk_bytes == STRATA_STREAMING_OFF || c.policy != STRATA_POLICY_STRATA ||
      c.nvme_layout != STRATA_NVME_EXTENTS) {
    return {};
  }
  StreamingShape shape;
  shape.buffers = c.stream_buffers != 0 ? c.stream_buffers : sched::kDefaultBudgetStreamBuffers;
  if (c.stream_chunk_bytes != 0) {
    shape.chunk_bytes = c.stream_chunk_bytes;
    return shape;
  }
  // Automatic: the default chunk, halved until the staging buffers take at most a quarter of
  // the pinned budget; without room for the smallest chunk, no streaming.
  const StreamingShape automatic =
      sched::stream_shape_for_budget(c.pinned_budget_bytes, shape.buffers);
  return automatic.on() ? automatic : StreamingShape{};
}

Result<std::unique_ptr<Runtime>> Runtime::create(const strata_config& in, uint16_t handle_owner) {
  STRATA_ASSIGN_OR_RETURN(auto config, normalize_config(&in));
  std::unique_ptr<Runtime> rt(new Runtime());
  rt->adopt(config);
  // Each step builds on the ones before it; the destructor takes them down in reverse.
  STRATA_TRY(rt->open_io_engine());
  STRATA_TRY(rt->open_nvme_tier());
  STRATA_TRY(rt->open_memory_tiers());
  STRATA_TRY(rt->open_scheduler(handle_owner));
  // Read during creation only: the caller's array need not outlive the call.
  rt->config_.planned_tensors = nullptr;
  rt->config_.planned_tensor_count = 0;
  return rt;
}

void Runtime::adopt(const strata_config& config) {
  config_ = config;
  if (config.nvme_path != nullptr) nvme_path_ = config.nvme_path;
  if (config.raw_device != nullptr) raw_device_ = config.raw_device;
  // The caller's strings need not outlive the call.
  config_.nvme_path = nvme_path_.empty() ? nullptr : nvme_path_.c_str();
  config_.raw_device = raw_device_.empty() ? nullptr : raw_device_.c_str();
}

Status Runtime::open_io_engine() {
  const strata_config& c = config_;
  io::IoEngineOptions io_options;
  io_options.queue_depth = c.queue_depth;
  io_options.block_size = c.block_size;
  if (c.worker_threads != 0) io_options.threads = c.worker_threads;
  STRATA_ASSIGN_OR_RETURN(engine_, io::make_io_engine(engine_kind(c.io_engine), io_options),
                          "I/O engine");
  // Fault injection (tests, drills): off unless STRATA_FAULTS names rules; see
  // io/fault_injection.h.
  STRATA_ASSIGN_OR_RETURN(auto faults, io::fault_plan_from_env(), "STRATA_FAULTS");
  if (!faults.empty()) {
    STRATA_ASSIGN_OR_RETURN(engine_,
                            io::FaultInjectingEngine::wrap(std::move(engine_), std::move(faults)),
                            "STRATA_FAULTS");
  }
  // A modelled drive (benchmarks): off unless STRATA_PACED_DRIVE gives rates; see
  // io/paced_engine.h.
  STRATA_ASSIGN_OR_RETURN(auto drive, io::drive_model_from_env());
  if (drive.has_value()) {
    STRATA_ASSIGN_OR_RETURN(engine_, io::PacedEngine::wrap(std::move(engine_), *drive),
                            "STRATA_PACED_DRIVE");
  }
  return Status::ok();
}

Status Runtime::open_nvme_tier() {
  const strata_config& c = config_;
  if (c.nvme_layout == STRATA_NVME_FILE_PER_TENSOR) {
    storage::FilePerTensorOptions files;
    files.dir = nvme_path_;
    files.capacity_bytes = c.nvme_capacity_bytes;
    files.threads = c.worker_threads != 0 ? c.worker_threads : 1;
    files.keep = c.keep_swap_file != 0;
    STRATA_ASSIGN_OR_RETURN(store_, storage::FilePerTensorStore::open(files), "NVMe tier");
    return Status::ok();
  }
  storage::BackingDeviceOptions backing;
  backing.swap_dir = nvme_path_;
  backing.raw_device = raw_device_;
  backing.capacity_bytes = c.nvme_capacity_bytes;
  backing.keep = c.keep_swap_file != 0;
  STRATA_ASSIGN_OR_RETURN(auto device_file, storage::BackingDevice::open(backing), "NVMe tier");
  // Before the store hands out any space: the probe writes the start of it.
  if (c.pinned_budget_bytes == 0) STRATA_TRY(size_pinned_budget(device_file));
  storage::ExtentStoreOptions store_options;
  store_options.verify_checksums = c.verify_checksums != 0;
  // A stream's ranged requests start on a chunk: the chunk is the checksum block.
  const StreamingShape streaming = streaming_shape(c);
  if (streaming.on()) store_options.block_bytes = streaming.chunk_bytes;
  STRATA_ASSIGN_OR_RETURN(
      store_, storage::ExtentStore::open(std::move(device_file), *engine_, store_options),
      "NVMe tier");
  return Status::ok();
}

Status Runtime::size_pinned_budget(const storage::BackingDevice& device) {
  strata_config& c = config_;
  sched::DriveFigures drive;
  drive.queue_depth = c.queue_depth;
  drive.request_bytes = c.block_size;
  if (c.drive_read_bytes_per_s != 0) {
    drive.read_bytes_per_s = static_cast<double>(c.drive_read_bytes_per_s);
    drive.write_bytes_per_s = static_cast<double>(c.drive_write_bytes_per_s);
    drive.source = "declared (strata_config.drive_read/write_bytes_per_s)";
  } else {
    STRATA_ASSIGN_OR_RETURN(auto probe, storage::probe_drive(device, *engine_),
                            "sizing the pinned budget");
    drive.read_bytes_per_s = probe.read_bytes_per_s;
    drive.write_bytes_per_s = probe.write_bytes_per_s;
    drive.queue_depth = probe.knee_queue_depth;
    drive.request_bytes = probe.request_bytes;
    drive.latency_s = probe.knee_latency_s;
    drive.source = "measured on " + device.path() + (probe.direct_io ? "" : " (page cache)");
  }
  const uint64_t chunk = c.stream_chunk_bytes;
  const auto threads =
      static_cast<uint32_t>(c.optimizer_threads != 0 ? static_cast<int>(c.optimizer_threads)
                                                     : optim::affinity_cpu_count());
  pinned_sizing_ = sched::size_pinned_budget(drive, threads, chunk, c.stream_buffers);
  c.pinned_budget_bytes = pinned_sizing_->budget_bytes;
  if (c.stream_chunk_bytes == 0) c.stream_chunk_bytes = pinned_sizing_->chunk_bytes;
  if (c.stream_buffers == 0) c.stream_buffers = pinned_sizing_->stream_buffers;
  return Status::ok();
}

Status Runtime::open_memory_tiers() {
  const strata_config& c = config_;
  memory::DeviceOptions device_options;
  device_options.backend = device_backend(c.device_backend);
  device_options.ordinal = c.device_ordinal;
  // The scheduler keeps what it places within device_budget_bytes; the arena's slab has a
  // quarter more so that fragmentation of its sub-allocator never refuses what the budget allows.
  device_options.budget_bytes = c.device_budget_bytes + c.device_budget_bytes / 4;
  STRATA_ASSIGN_OR_RETURN(device_, memory::open_device(device_options), "device");

  memory::PinnedArenaOptions arena_options;
  arena_options.budget_bytes = c.pinned_budget_bytes;
  arena_options.numa_node = c.numa_node;
  arena_options.device = device_.get();
  arena_options.io_engine = engine_.get();
  STRATA_ASSIGN_OR_RETURN(arena_, memory::PinnedArena::create(arena_options), "pinned memory");

  memory::HostMemorySamplerOptions sampler_options;
  sampler_options.excluded_device = device_.get();
  sampler_ = std::make_unique<memory::HostMemorySampler>(sampler_options);
  return Status::ok();
}

Status Runtime::open_scheduler(uint16_t handle_owner) {
  const strata_config& c = config_;
  telemetry::TraceConfig trace_config;
  trace_config.capacity_events = std::max<uint64_t>(c.trace_events, 64);
  trace_config.start_enabled = c.trace_events != 0;
  STRATA_ASSIGN_OR_RETURN(trace_, telemetry::TraceRecorder::create(trace_config), "trace");

  // Completions only take the scheduler's lock and issue the next transfers: one thread keeps
  // up with NVMe, a second covers a completion that waits on that lock.
  completions_ = std::make_unique<boost::asio::thread_pool>(2);

  datapath::RealBackendOptions backend_options;
  backend_options.trace = trace_.get();
  backend_ = std::make_unique<datapath::RealBackend>(*store_, *arena_, *device_, backend_options);
  const StreamingShape streaming = streaming_shape(c);
  if (streaming.on()) {
    datapath::StreamerOptions stream_options;
    stream_options.chunk_bytes = streaming.chunk_bytes;
    stream_options.buffers_per_direction = streaming.buffers;
    STRATA_TRY(backend_->start_streaming(stream_options), "streaming staging buffers");
    STRATA_ASSERT(backend_->staging_bytes() == streaming.staging_bytes());
  }

  sched::SchedulerConfig sched_config;
  sched_config.handle_owner = handle_owner;
  // Tests and drills: STRATA_CHECK_INVARIANTS=1 has the scheduler recount its books after every
  // pump and abort on a disagreement (docs/reliability.md). Off by default: it scans every tensor.
  const char* check = std::getenv("STRATA_CHECK_INVARIANTS");
  sched_config.check_invariants = check != nullptr && std::string_view(check) == "1";
  if (c.policy == STRATA_POLICY_ZERO_INFINITY) {
    STRATA_ASSIGN_OR_RETURN(sched_config.memory, zero_infinity_plan(c), "policy zero-infinity");
  } else {
    sched_config.memory = sched::strata_memory_plan(c.pinned_budget_bytes, c.device_budget_bytes,
                                                    streaming.staging_bytes());
  }
  // Keep the engine's queue full: as many NVMe transfers in flight as it has slots, within the
  // backend's preallocated operations.
  const uint32_t nvme_inflight = std::clamp<uint32_t>(c.queue_depth, 4, 64);
  sched_config.max_inflight = {nvme_inflight, nvme_inflight, 8, 8};
  STRATA_ASSIGN_OR_RETURN(
      scheduler_, sched::Scheduler::create(sched_config, *backend_, completions_->get_executor()),
      "scheduler");
  // PyTorch's pluggable allocator (strata_torch_alloc) now takes this runtime's device memory,
  // under its device budget (api/torch_memory.h).
  torch_memory_ = std::make_unique<TorchMemory>(*scheduler_, device_->ordinal());
  torch_binding_ = memory::TorchAllocatorBinding::install(*torch_memory_);
  return Status::ok();
}

Runtime::~Runtime() {
  torch_binding_.reset();  // no torch call reaches the scheduler from here on
  torch_memory_.reset();
  optimizer_.reset();
  scheduler_.reset();
  backend_.reset();
  if (completions_) completions_->join();
  completions_.reset();
  arena_.reset();
  sampler_.reset();
  device_.reset();
  if (store_) (void)store_->close();
  store_.reset();
  engine_.reset();
}

optim::TieredOptimizerConfig Runtime::optimizer_config() const {
  optim::TieredOptimizerConfig config;
  // The pinned pool's: what the streaming staging buffers leave of the pinned budget.
  config.pinned_budget_bytes = config_.pinned_budget_bytes - backend_->staging_bytes();
  // An automatic budget was sized for sub-groups of this size (sched/pinned_sizing.h).
  if (pinned_sizing_) config.sub_group_bytes = pinned_sizing_->sub_group_bytes;
  config.device_budget_bytes = config_.device_budget_bytes;
  config.device_streams = backend_->staging_bytes() > 0;
  config.adam.threads = static_cast<int>(config_.optimizer_threads);
  config.timeout = kAcquireTimeout;
  return config;
}

uint64_t Runtime::optimizer_sub_group_bytes() {
  std::lock_guard lock(optimizer_mutex_);
  if (optimizer_) return optimizer_->sub_group_elements() * sizeof(float);
  return optim::TieredOptimizer::sub_group_bytes_for(optimizer_config());
}

Result<optim::TieredOptimizer*> Runtime::optimizer() {
  std::lock_guard lock(optimizer_mutex_);
  if (!optimizer_) {
    STRATA_ASSIGN_OR_RETURN(auto made,
                            optim::TieredOptimizer::create(*scheduler_, optimizer_config()));
    optimizer_ = std::move(made);
  }
  return optimizer_.get();
}

optim::TieredOptimizer* Runtime::optimizer_if_made() {
  std::lock_guard lock(optimizer_mutex_);
  return optimizer_.get();
}

void Runtime::set_last_error(const char* function, const Status& status) {
  std::lock_guard lock(errors_mutex_);
  errors_[std::this_thread::get_id()] =
      std::string(function) + ": " + strata_strerror(status.code()) + ": " + status.message();
}

const char* Runtime::last_error() const {
  std::lock_guard lock(errors_mutex_);
  auto it = errors_.find(std::this_thread::get_id());
  return it == errors_.end() ? "" : it->second.c_str();
}

}  // namespace strata::api
