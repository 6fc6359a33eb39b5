// The object behind strata_runtime*: it owns every tier and the scheduler, in the order they must
// be built and torn down. The C API functions (c_api.cpp) only check arguments, translate types
// and record the last error; everything else happens here.
#pragma once

#include <strata/strata.h>

#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/status.h"
#include "datapath/real_backend.h"
#include "io/io_engine.h"
#include "memory/device.h"
#include "memory/host_memory.h"
#include "memory/pinned_arena.h"
#include "memory/torch_allocator.h"
#include "optim/tiered_optimizer.h"
#include "sched/pinned_sizing.h"
#include "sched/scheduler.h"
#include "storage/backing_device.h"
#include "storage/swap_store.h"
#include "telemetry/trace_recorder.h"

namespace strata::api {

class TorchMemory;

// Longest an acquire waits before STRATA_E_TIMEOUT: a deadlock shows up as an error, not a hang.
inline constexpr std::chrono::seconds kAcquireTimeout{300};

class Runtime {
 public:
  // Validates the config (every field) and builds the tiers. The config may be an older, smaller
  // struct: missing fields keep their defaults. handle_owner tags the tensor handles this runtime
  // issues (the C API gives each live runtime its own, so handles of another are refused).
  static Result<std::unique_ptr<Runtime>> create(const strata_config& in,
                                                 uint16_t handle_owner = 0);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const strata_config& config() const { return config_; }
  // How the automatic pinned budget was sized; empty when the config set one.
  const std::optional<sched::PinnedSizing>& pinned_sizing() const { return pinned_sizing_; }
  sched::Scheduler& scheduler() { return *scheduler_; }
  datapath::RealBackend& backend() { return *backend_; }
  memory::Device& device() { return *device_; }
  memory::PinnedArena& pinned_arena() { return *arena_; }
  storage::SwapStore& store() { return *store_; }
  io::IoEngine& engine() { return *engine_; }
  telemetry::TraceRecorder& trace() { return *trace_; }
  memory::HostMemorySampler& sampler() { return *sampler_; }
  // The optimizer, made on first use: its CPU threads exist only for runtimes that train.
  Result<optim::TieredOptimizer*> optimizer();
  // The optimizer if a call made it already, else nullptr (never makes one).
  optim::TieredOptimizer* optimizer_if_made();
  // The optimizer's sub-group per state tensor: its own once it exists (options included), else
  // what it would be made with.
  uint64_t optimizer_sub_group_bytes();

  // Per-thread last error: each thread sees the context of its own last failure on this runtime.
  void set_last_error(const char* function, const Status& status);
  const char* last_error() const;

 private:
  Runtime() = default;
  // What the optimizer is made with (optimizer()).
  optim::TieredOptimizerConfig optimizer_config() const;
  // create()'s steps, in order; each needs the ones before it.
  void adopt(const strata_config& config);  // owns copies of the config's strings
  Status open_io_engine();                  // the engine, wrapped by fault injection or pacing
  Status open_nvme_tier();                  // the extent store (or file per tensor)
  // An automatic pinned budget (pinned_budget_bytes 0), from the drive measured or declared:
  // fills config_'s budget and streaming shape.
  Status size_pinned_budget(const storage::BackingDevice& device);
  Status open_memory_tiers();                    // the device arena, the pinned arena, the sampler
  Status open_scheduler(uint16_t handle_owner);  // trace, backend, scheduler, torch binding

  strata_config config_{};
  std::optional<sched::PinnedSizing> pinned_sizing_;  // how an automatic budget was sized
  std::string nvme_path_;                             // owned copies of the config's strings
  std::string raw_device_;
  // Built in this order, destroyed in reverse: the scheduler first (it waits for transfers in
  // flight), the engine last (everything above submits to it).
  std::unique_ptr<io::IoEngine> engine_;
  std::unique_ptr<storage::SwapStore> store_;
  std::unique_ptr<memory::Device> device_;
  std::unique_ptr<memory::PinnedArena> arena_;
  std::unique_ptr<memory::HostMemorySampler> sampler_;
  std::unique_ptr<telemetry::TraceRecorder> trace_;
  std::unique_ptr<boost::asio::thread_pool> completions_;
  std::unique_ptr<datapath::RealBackend> backend_;
  std::unique_ptr<sched::Scheduler> scheduler_;
  std::mutex optimizer_mutex_;
  std::unique_ptr<optim::TieredOptimizer> optimizer_;  // uses the scheduler: destroyed first
  // strata_torch_alloc's memory, through the scheduler; the binding goes before it.
  std::unique_ptr<TorchMemory> torch_memory_;
  std::unique_ptr<memory::TorchAllocatorBinding> torch_binding_;

  mutable std::mutex errors_mutex_;
  std::unordered_map<std::thread::id, std::string> errors_;
};

// Normalizes a caller's config: defaults for what an older struct lacks, then every check.
Result<strata_config> normalize_config(const strata_config* in);

// The streamed transfers a config asks for (strata_config.stream_chunk_bytes, stream_buffers),
// with the automatic values filled in. Off (chunk 0) for policy ZERO_INFINITY, the
// file-per-tensor layout, STRATA_STREAMING_OFF, and automatically where the pinned budget has
// no room for the smallest chunk.
// Chunk and buffer limits and defaults: sched/pinned_sizing.h's.
using StreamingShape = sched::StreamShape;
StreamingShape streaming_shape(const strata_config& c);

}  // namespace strata::api
