// The C API: argument checks, type translation, last-error text. No exception crosses it: every
// entry point runs its body inside `guarded`, which turns a std::bad_alloc into STRATA_E_NOMEM
// and anything else into STRATA_E_INTERNAL.
#include <strata/strata.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>

#include "api/runtime.h"
#include "api/runtime_handle.h"
#include "api/stats.h"
#include "api/versioned_struct.h"

namespace strata::api {
namespace {

// The live runtimes. A handle the caller destroyed (or never had) is refused instead of read:
// the C API promises an error code, never a crash, for a bad handle. This set and the
// creation-error text below are the library's only process-wide state.
std::mutex& live_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_set<const strata_runtime*>& live_runtimes() {
  static std::unordered_set<const strata_runtime*> set;
  return set;
}
thread_local std::string create_error;
// The owner tag of the last runtime created. Tags go round 1..65535 and skip those of live
// runtimes, so no two live runtimes share one and a destroyed runtime's tag comes back only
// after 65,535 creations. Guarded by live_mutex().
uint16_t last_handle_owner = 0;

// A tag no live runtime holds; STRATA_E_LIMIT when 65,535 runtimes are alive at once.
Result<uint16_t> next_handle_owner() {
  constexpr uint32_t kTags = 65535;
  for (uint32_t tried = 0; tried < kTags; ++tried) {
    last_handle_owner = static_cast<uint16_t>(last_handle_owner % kTags + 1);
    const bool taken =
        std::any_of(live_runtimes().begin(), live_runtimes().end(),
                    [](const strata_runtime* rt) { return rt->handle_owner == last_handle_owner; });
    if (!taken) return last_handle_owner;
  }
  return Status::error(STRATA_E_LIMIT, "65535 runtimes are alive in this process (the limit)");
}

bool is_live(const strata_runtime* rt) {
  std::lock_guard lock(live_mutex());
  return live_runtimes().count(rt) != 0 && rt->impl != nullptr;
}

int fail_create(const Status& status) {
  create_error = std::string("strata_runtime_create: ") + strata_strerror(status.code()) + ": " +
                 status.message();
  return status.code();
}

template <typename F>
int guarded(strata_runtime* rt, const char* function, F&& body) noexcept {
  if (rt == nullptr) return STRATA_E_INVALID;
  if (!is_live(rt)) return STRATA_E_BAD_HANDLE;
  Status status;
  try {
    status = body(*rt->impl);
  } catch (const std::bad_alloc&) {
    status = Status::error(STRATA_E_NOMEM, "out of host memory");
  } catch (const std::exception& e) {
    status = Status::error(STRATA_E_INTERNAL, std::string("unexpected exception: ") + e.what());
  } catch (...) {
    status = Status::error(STRATA_E_INTERNAL, "unexpected exception");
  }
  if (!status.is_ok()) rt->impl->set_last_error(function, status);
  return status.code();
}

Result<Tier> memory_tier(strata_tier tier, const char* what) {
  switch (tier) {
    case STRATA_TIER_DEVICE:
      return Tier::kDevice;
    case STRATA_TIER_PINNED:
      return Tier::kPinned;
    case STRATA_TIER_HOST:
    case STRATA_TIER_NVME:
      break;
  }
  return invalid_argument(std::string(what) + ": tier " + std::to_string(tier) +
                          " is not DEVICE or PINNED");
}

Result<Tier> home_tier(strata_tier tier) {
  switch (tier) {
    case STRATA_TIER_DEVICE:
      return Tier::kDevice;
    case STRATA_TIER_PINNED:
      return Tier::kPinned;
    case STRATA_TIER_NVME:
      return Tier::kNvme;
    case STRATA_TIER_HOST:
      break;
  }
  return invalid_argument("home tier " + std::to_string(tier) + " is not DEVICE, PINNED or NVME");
}

Result<sched::PhaseKind> phase_kind(strata_phase phase) {
  switch (phase) {
    case STRATA_PHASE_FORWARD:
      return sched::PhaseKind::kForward;
    case STRATA_PHASE_BACKWARD:
      return sched::PhaseKind::kBackward;
    case STRATA_PHASE_OPTIMIZER:
      return sched::PhaseKind::kOptimizer;
  }
  return invalid_argument("phase " + std::to_string(phase) + " is unknown");
}

// Absurd sizes are refused before anything is allocated: no tier holds 2^56 bytes.
constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 56;
constexpr size_t kMaxNameBytes = 4096;
constexpr size_t kMaxScheduleEntries = size_t{1} << 24;

// The calls that would write a read-only tensor (STRATA_TENSOR_READ_ONLY) fail before they
// change anything: a frozen base written through would be modified in memory and then silently
// lost at its next eviction, since it is never written back.
// refused: what the call would have done, for the message.
Status refuse_read_only(Runtime& rt, sched::TensorHandle handle, const char* refused) {
  STRATA_ASSIGN_OR_RETURN(bool read_only, rt.scheduler().read_only(handle));
  if (!read_only) return Status::ok();
  STRATA_ASSIGN_OR_RETURN(auto info, rt.scheduler().describe(handle));
  return invalid_argument("tensor '" + info.name + "' is read-only (STRATA_TENSOR_READ_ONLY): " +
                          refused + "; give it new contents with strata_tensor_write");
}

// strata_tensor_write (write) and strata_tensor_read: through a pinned acquire, wherever the
// tensor lives.
Status copy_tensor(Runtime& rt, sched::TensorHandle handle, void* caller, uint64_t offset,
                   uint64_t bytes, bool write, std::chrono::nanoseconds timeout) {
  STRATA_ASSIGN_OR_RETURN(auto info, rt.scheduler().describe(handle));
  if (bytes == 0) return invalid_argument("bytes is 0");
  if (offset > info.bytes || bytes > info.bytes - offset) {
    return invalid_argument("range [" + std::to_string(offset) + ", " +
                            std::to_string(offset + bytes) + ") is outside tensor '" + info.name +
                            "' of " + std::to_string(info.bytes) + " bytes");
  }
  if (info.uses != 0) {
    return Status::error(STRATA_E_STATE, "tensor '" + info.name + "' is acquired");
  }
  if (!write && info.residency == sched::Residency::kUnwritten) {
    return Status::error(STRATA_E_STATE, "tensor '" + info.name + "' has no contents yet");
  }
  // A whole-tensor write replaces the contents, and a tensor never written has none to keep:
  // nothing to read first.
  const bool whole = write && ((offset == 0 && bytes == info.bytes) ||
                               info.residency == sched::Residency::kUnwritten);
  STRATA_ASSIGN_OR_RETURN(
      auto acquired,
      rt.scheduler().acquire(handle, Tier::kPinned,
                             whole ? sched::AccessMode::kOverwrite : sched::AccessMode::kRead,
                             timeout));
  auto* data = static_cast<unsigned char*>(acquired.data) + offset;
  if (write) {
    std::memcpy(data, caller, bytes);
  } else {
    std::memcpy(caller, data, bytes);
  }
  return rt.scheduler().release(handle, /*dirty=*/write);
}

strata_optimizer_group default_group() {
  strata_optimizer_group g{};
  strata_optimizer_group_init(&g);
  return g;
}

strata_optimizer_options default_options() {
  strata_optimizer_options o{};
  strata_optimizer_options_init(&o);
  return o;
}

optim::GroupSettings group_settings(const strata_optimizer_group& g) {
  optim::GroupSettings s;
  s.lr = g.lr;
  s.beta1 = g.beta1;
  s.beta2 = g.beta2;
  s.eps = g.eps;
  s.weight_decay = g.weight_decay;
  s.decoupled = g.decoupled_weight_decay != 0;
  return s;
}

Result<optim::StateKind> state_kind(strata_optimizer_state state) {
  switch (state) {
    case STRATA_OPTIMIZER_MASTER:
      return optim::StateKind::kMaster;
    case STRATA_OPTIMIZER_EXP_AVG:
      return optim::StateKind::kExpAvg;
    case STRATA_OPTIMIZER_EXP_AVG_SQ:
      return optim::StateKind::kExpAvgSq;
  }
  return invalid_argument("optimizer state " + std::to_string(static_cast<int>(state)) +
                          " is not MASTER, EXP_AVG or EXP_AVG_SQ");
}

// The runtime's optimizer, made on first use.
// `name` is declared, which parentheses would break.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define STRATA_OPTIMIZER(rt, name)                                                \
  STRATA_ASSIGN_OR_RETURN(optim::TieredOptimizer* name##_made, (rt).optimizer()); \
  optim::TieredOptimizer& name = *name##_made
// NOLINTEND(bugprone-macro-parentheses)

// strata_acquire and strata_acquire_timeout, which differ only in how long they wait.
int acquire_within(strata_runtime* rt, const char* function, strata_tensor tensor, strata_tier tier,
                   uint32_t flags, std::chrono::nanoseconds timeout, strata_acquired* out) {
  return guarded(rt, function, [&](Runtime& r) -> Status {
    STRATA_TRY(check_struct_out(out, "strata_acquired"));
    if ((flags & ~STRATA_ACQUIRE_DISCARD) != 0) {
      return invalid_argument("unknown flags " + std::to_string(flags));
    }
    STRATA_ASSIGN_OR_RETURN(auto where, memory_tier(tier, function));
    const auto handle = sched::TensorHandle::from_u64(tensor);
    // Without DISCARD the contents are read, and a tensor that has none (never written, or
    // discarded) is STRATA_E_STATE: handing out whatever the buffer holds as "the contents"
    // would let an optimizer consume last step's gradient. (A fresh strata_malloc has contents:
    // undefined ones, taken at the call.)
    const auto mode = (flags & STRATA_ACQUIRE_DISCARD) != 0 ? sched::AccessMode::kOverwrite
                                                            : sched::AccessMode::kRead;
    if (mode == sched::AccessMode::kOverwrite) {
      STRATA_TRY(refuse_read_only(r, handle, "it cannot be acquired with DISCARD"));
    }
    STRATA_ASSIGN_OR_RETURN(auto acquired, r.scheduler().acquire(handle, where, mode, timeout));
    strata_acquired result{};
    result.data = acquired.data;
    result.bytes = acquired.bytes;
    // The backend completes a copy to the device only after its event fired: data is ready.
    result.ready_event = nullptr;
    write_struct_out(out, result);
    return Status::ok();
  });
}

// strata_tensor_write / read and their _timeout forms, which differ only in how long they wait
// for the pinned room the copy passes through.
int copy_within(strata_runtime* rt, const char* function, strata_tensor tensor, void* caller,
                uint64_t offset, uint64_t bytes, bool write, std::chrono::nanoseconds timeout) {
  return guarded(rt, function, [&](Runtime& r) -> Status {
    if (caller == nullptr) return invalid_argument(write ? "src is NULL" : "dst is NULL");
    // The source is only read: copy_tensor never writes through it when write is set.
    return copy_tensor(r, sched::TensorHandle::from_u64(tensor), caller, offset, bytes, write,
                       timeout);
  });
}

}  // namespace
}  // namespace strata::api

using strata::invalid_argument;
using strata::Status;
using strata::Tier;
using strata::api::guarded;
using strata::api::Runtime;
namespace sched = strata::sched;
namespace optim = strata::optim;

extern "C" {

int strata_runtime_create(const strata_config* config, strata_runtime** out) {
  strata::api::create_error.clear();
  if (out == nullptr) {
    strata::api::create_error = "strata_runtime_create: out is NULL";
    return STRATA_E_INVALID;
  }
  *out = nullptr;
  Status status;
  try {
    // The tag is taken first, by entering the live set with no implementation yet (is_live
    // refuses such an entry), so two runtimes created at once on two threads get different ones.
    // The reservation ends with the attempt unless it succeeds, whatever is thrown meanwhile.
    auto rt = std::make_unique<strata_runtime>();
    {
      std::lock_guard lock(strata::api::live_mutex());
      auto owner = strata::api::next_handle_owner();
      if (!owner) return strata::api::fail_create(std::move(owner).take_status());
      rt->handle_owner = owner.value();
      strata::api::live_runtimes().insert(rt.get());
    }
    struct Reservation {
      strata_runtime* rt;
      ~Reservation() {
        if (rt == nullptr) return;
        std::lock_guard lock(strata::api::live_mutex());
        strata::api::live_runtimes().erase(rt);
      }
    } reservation{rt.get()};
    auto runtime =
        config == nullptr
            ? strata::Result<std::unique_ptr<Runtime>>(invalid_argument("config is NULL"))
            : Runtime::create(*config, rt->handle_owner);
    if (runtime) {
      std::lock_guard lock(strata::api::live_mutex());
      rt->impl = std::move(runtime.value());
      reservation.rt = nullptr;
      *out = rt.release();
      return STRATA_OK;
    }
    status = std::move(runtime).take_status();
  } catch (const std::bad_alloc&) {
    status = Status::error(STRATA_E_NOMEM, "out of host memory");
  } catch (...) {
    status = Status::error(STRATA_E_INTERNAL, "unexpected exception");
  }
  return strata::api::fail_create(status);
}

int strata_runtime_destroy(strata_runtime* rt) {
  if (rt == nullptr) return STRATA_OK;
  {
    std::lock_guard lock(strata::api::live_mutex());
    auto& live = strata::api::live_runtimes();
    auto it = live.find(rt);
    // An entry with no implementation is a creation still under way: not a handle anyone holds.
    if (it == live.end() || rt->impl == nullptr) return STRATA_E_BAD_HANDLE;
    live.erase(it);
  }
  try {
    delete rt;
  } catch (...) {
    return STRATA_E_INTERNAL;
  }
  return STRATA_OK;
}

const char* strata_last_error(const strata_runtime* rt) {
  if (rt == nullptr) return strata::api::create_error.c_str();
  if (!strata::api::is_live(rt)) return "strata_last_error: not a live runtime handle";
  return rt->impl->last_error();
}

int strata_tensor_register(strata_runtime* rt, const strata_tensor_desc* desc, strata_tensor* out) {
  return guarded(rt, "strata_tensor_register", [&](Runtime& r) -> Status {
    if (out == nullptr) return invalid_argument("out is NULL");
    *out = STRATA_TENSOR_NONE;
    STRATA_ASSIGN_OR_RETURN(auto read,
                            strata::api::read_struct_in(desc, strata::api::default_tensor_desc(),
                                                        "strata_tensor_desc"));
    desc = &read;
    if (desc->bytes == 0 || desc->bytes > strata::api::kMaxTensorBytes) {
      return invalid_argument("tensor bytes " + std::to_string(desc->bytes) + " is zero or absurd");
    }
    if (desc->dtype < STRATA_DTYPE_F32 || desc->dtype > STRATA_DTYPE_U8) {
      return invalid_argument("dtype " + std::to_string(desc->dtype) + " is unknown");
    }
    if (desc->kind < STRATA_KIND_PARAMETER || desc->kind > STRATA_KIND_OTHER) {
      return invalid_argument("kind " + std::to_string(desc->kind) + " is unknown");
    }
    if (desc->layer < -1) return invalid_argument("layer must be >= -1");
    if ((desc->flags & ~STRATA_TENSOR_READ_ONLY) != 0) {
      return invalid_argument("unknown tensor flags " + std::to_string(desc->flags));
    }
    auto home = strata::api::home_tier(desc->home_tier);
    if (!home) return std::move(home).take_status();
    strata::TensorSpec spec;
    if (desc->name != nullptr)
      spec.name.assign(desc->name, strnlen(desc->name, strata::api::kMaxNameBytes));
    spec.dtype = static_cast<strata::DType>(desc->dtype);
    spec.kind = static_cast<strata::TensorKind>(desc->kind);
    spec.layer = desc->layer;
    sched::RegisterOptions options;
    options.home = home.value();
    options.bytes = desc->bytes;
    options.read_only = (desc->flags & STRATA_TENSOR_READ_ONLY) != 0;
    STRATA_ASSIGN_OR_RETURN(auto handle, r.scheduler().register_tensor(spec, options));
    *out = handle.to_u64();
    return Status::ok();
  });
}

int strata_tensor_write(strata_runtime* rt, strata_tensor tensor, const void* src, uint64_t offset,
                        uint64_t bytes) {
  return strata::api::copy_within(rt, "strata_tensor_write", tensor, const_cast<void*>(src), offset,
                                  bytes, /*write=*/true, strata::api::kAcquireTimeout);
}

int strata_tensor_write_timeout(strata_runtime* rt, strata_tensor tensor, const void* src,
                                uint64_t offset, uint64_t bytes, uint32_t timeout_ms) {
  return strata::api::copy_within(rt, "strata_tensor_write_timeout", tensor, const_cast<void*>(src),
                                  offset, bytes, /*write=*/true,
                                  std::chrono::milliseconds(timeout_ms));
}

int strata_tensor_read(strata_runtime* rt, strata_tensor tensor, void* dst, uint64_t offset,
                       uint64_t bytes) {
  return strata::api::copy_within(rt, "strata_tensor_read", tensor, dst, offset, bytes,
                                  /*write=*/false, strata::api::kAcquireTimeout);
}

int strata_tensor_read_timeout(strata_runtime* rt, strata_tensor tensor, void* dst, uint64_t offset,
                               uint64_t bytes, uint32_t timeout_ms) {
  return strata::api::copy_within(rt, "strata_tensor_read_timeout", tensor, dst, offset, bytes,
                                  /*write=*/false, std::chrono::milliseconds(timeout_ms));
}

int strata_tensor_unregister(strata_runtime* rt, strata_tensor tensor) {
  return guarded(rt, "strata_tensor_unregister", [&](Runtime& r) -> Status {
    const auto handle = sched::TensorHandle::from_u64(tensor);
    STRATA_ASSIGN_OR_RETURN(auto info, r.scheduler().describe(handle));
    if (info.allocation) {
      return Status::error(STRATA_E_STATE, "tensor " + std::to_string(tensor) +
                                               " is a strata_malloc allocation: free it with "
                                               "strata_free");
    }
    if (optim::TieredOptimizer* optimizer = r.optimizer_if_made();
        optimizer != nullptr && optimizer->holds(handle)) {
      // Unregistered, it would leave every later step failing on the missing tensor.
      return Status::error(STRATA_E_STATE, "tensor '" + info.name +
                                               "' is a parameter or gradient under the "
                                               "optimizer: it stays registered until the "
                                               "runtime is destroyed");
    }
    return r.scheduler().unregister_tensor(handle);
  });
}

int strata_malloc(strata_runtime* rt, uint64_t bytes, strata_tier tier, uint32_t flags,
                  strata_tensor* out) {
  return guarded(rt, "strata_malloc", [&](Runtime& r) -> Status {
    if (out == nullptr) return invalid_argument("out is NULL");
    *out = STRATA_TENSOR_NONE;
    if (bytes == 0 || bytes > strata::api::kMaxTensorBytes) {
      return invalid_argument("bytes " + std::to_string(bytes) + " is zero or absurd");
    }
    if ((flags & ~STRATA_MALLOC_OFFLOADABLE) != 0) {
      return invalid_argument("unknown flags " + std::to_string(flags));
    }
    STRATA_ASSIGN_OR_RETURN(auto placed, strata::api::memory_tier(tier, "strata_malloc"));
    strata::TensorSpec spec;
    spec.name = "malloc";
    spec.dtype = strata::DType::kUInt8;
    spec.kind = strata::TensorKind::kOther;
    sched::RegisterOptions options;
    options.bytes = bytes;
    options.allocation = true;
    // Offloadable: rests on NVMe when released, like any tensor. Otherwise it lives on its tier.
    options.home = (flags & STRATA_MALLOC_OFFLOADABLE) ? Tier::kNvme : placed;
    STRATA_ASSIGN_OR_RETURN(auto handle, r.scheduler().register_tensor(spec, options));
    // The memory is taken now, on its tier, as malloc's is: a budget that cannot hold it fails
    // here with the numbers, not at some later acquire. Its contents are undefined (whatever the
    // buffer held) until written, and an offloadable allocation may be spilled from here on.
    Status reserved = r.scheduler().reserve(handle, placed, strata::api::kAcquireTimeout);
    if (!reserved) {
      (void)r.scheduler().unregister_tensor(handle);
      return std::move(reserved).with_context("strata_malloc of " + std::to_string(bytes) +
                                              " bytes");
    }
    *out = handle.to_u64();
    return Status::ok();
  });
}

int strata_free(strata_runtime* rt, strata_tensor allocation) {
  return guarded(rt, "strata_free", [&](Runtime& r) -> Status {
    const auto handle = sched::TensorHandle::from_u64(allocation);
    auto info = r.scheduler().describe(handle);
    if (!info) return std::move(info).take_status();
    if (!info->allocation) {
      return Status::error(STRATA_E_STATE, "tensor '" + info->name +
                                               "' was registered, not allocated with "
                                               "strata_malloc: use strata_tensor_unregister");
    }
    return r.scheduler().unregister_tensor(handle);
  });
}

int strata_step_begin(strata_runtime* rt) {
  return guarded(rt, "strata_step_begin", [&](Runtime& r) { return r.scheduler().begin_step(); });
}

int strata_step_end(strata_runtime* rt) {
  return guarded(rt, "strata_step_end", [&](Runtime& r) { return r.scheduler().end_step(); });
}

int strata_layer_begin(strata_runtime* rt, strata_phase phase, int32_t layer) {
  return guarded(rt, "strata_layer_begin", [&](Runtime& r) -> Status {
    STRATA_ASSIGN_OR_RETURN(auto kind, strata::api::phase_kind(phase));
    if (layer < -1) return invalid_argument("layer must be >= -1");
    return r.scheduler().begin_phase({kind, layer});
  });
}

int strata_layer_end(strata_runtime* rt, strata_phase phase, int32_t layer) {
  return guarded(rt, "strata_layer_end", [&](Runtime& r) -> Status {
    STRATA_ASSIGN_OR_RETURN(auto kind, strata::api::phase_kind(phase));
    if (layer < -1) return invalid_argument("layer must be >= -1");
    return r.scheduler().end_phase({kind, layer});
  });
}

int strata_declare_schedule(strata_runtime* rt, const strata_schedule_entry* entries,
                            size_t count) {
  return guarded(rt, "strata_declare_schedule", [&](Runtime& r) -> Status {
    if (entries == nullptr || count == 0) return invalid_argument("no entries");
    if (count > strata::api::kMaxScheduleEntries) return invalid_argument("too many entries");
    sched::AccessSchedule::Builder builder;
    bool first = true;
    sched::PhaseKey current;
    for (size_t i = 0; i < count; ++i) {
      STRATA_ASSIGN_OR_RETURN(auto kind, strata::api::phase_kind(entries[i].phase),
                              "entry " + std::to_string(i));
      auto tier = strata::api::memory_tier(entries[i].tier, "strata_declare_schedule");
      if (!tier) return std::move(tier).take_status().with_context("entry " + std::to_string(i));
      // A handle must name a live tensor: the schedule sizes tables by handle slot, and a
      // garbage handle asked for gigabytes (found by tests/fuzz/c_api_fuzz).
      STRATA_ASSIGN_OR_RETURN(
          auto info, r.scheduler().describe(sched::TensorHandle::from_u64(entries[i].tensor)),
          "entry " + std::to_string(i));
      const sched::PhaseKey key{kind, entries[i].layer};
      if (first || !(key == current)) {
        builder.begin_phase(key);
        current = key;
        first = false;
      }
      sched::Access access;
      access.tensor = sched::TensorHandle::from_u64(entries[i].tensor);
      access.tier = tier.value();
      STRATA_TRY(builder.add(access));
    }
    STRATA_ASSIGN_OR_RETURN(auto schedule, std::move(builder).build());
    return r.scheduler().declare_schedule(std::move(schedule));
  });
}

int strata_acquire(strata_runtime* rt, strata_tensor tensor, strata_tier tier, uint32_t flags,
                   strata_acquired* out) {
  return strata::api::acquire_within(rt, "strata_acquire", tensor, tier, flags,
                                     strata::api::kAcquireTimeout, out);
}

int strata_acquire_timeout(strata_runtime* rt, strata_tensor tensor, strata_tier tier,
                           uint32_t flags, uint32_t timeout_ms, strata_acquired* out) {
  return strata::api::acquire_within(rt, "strata_acquire_timeout", tensor, tier, flags,
                                     std::chrono::milliseconds(timeout_ms), out);
}

int strata_release(strata_runtime* rt, strata_tensor tensor, uint32_t flags, void* device_stream) {
  return guarded(rt, "strata_release", [&](Runtime& r) -> Status {
    if ((flags & ~STRATA_RELEASE_DIRTY) != 0) {
      return invalid_argument("unknown flags " + std::to_string(flags));
    }
    const auto handle = sched::TensorHandle::from_u64(tensor);
    const bool dirty = (flags & STRATA_RELEASE_DIRTY) != 0;
    if (dirty) {
      STRATA_TRY(strata::api::refuse_read_only(
          r, handle, "it cannot be released DIRTY (the acquire stays: release it without DIRTY)"));
    }
    return r.scheduler().release(handle, dirty, device_stream);
  });
}

int strata_prefetch(strata_runtime* rt, strata_tensor tensor, strata_tier tier) {
  return guarded(rt, "strata_prefetch", [&](Runtime& r) -> Status {
    STRATA_ASSIGN_OR_RETURN(auto where, strata::api::memory_tier(tier, "strata_prefetch"));
    return r.scheduler().prefetch(sched::TensorHandle::from_u64(tensor), where);
  });
}

int strata_sync(strata_runtime* rt) {
  return guarded(rt, "strata_sync",
                 [&](Runtime& r) { return r.scheduler().flush(strata::api::kAcquireTimeout); });
}

int strata_sync_timeout(strata_runtime* rt, uint32_t timeout_ms) {
  return guarded(rt, "strata_sync_timeout", [&](Runtime& r) {
    return r.scheduler().flush(std::chrono::milliseconds(timeout_ms));
  });
}

int strata_get_stats(strata_runtime* rt, strata_stats* out) {
  return guarded(rt, "strata_get_stats", [&](Runtime& r) -> Status {
    STRATA_TRY(strata::api::check_struct_out(out, "strata_stats"));
    strata::api::write_struct_out(out, strata::api::collect_stats(r));
    return Status::ok();
  });
}

int strata_export_trace(strata_runtime* rt, const char* path) {
  return guarded(rt, "strata_export_trace", [&](Runtime& r) -> Status {
    if (path == nullptr || path[0] == '\0') return invalid_argument("path is empty");
    if (r.config().trace_events == 0) {
      return Status::error(STRATA_E_STATE,
                           "tracing is off: create the runtime with config.trace_events > 0");
    }
    return r.trace().export_chrome_trace(path);
  });
}

int strata_tensor_discard(strata_runtime* rt, strata_tensor tensor) {
  return guarded(rt, "strata_tensor_discard", [&](Runtime& r) -> Status {
    return r.scheduler().discard(sched::TensorHandle::from_u64(tensor));
  });
}

int strata_optimizer_group_init(strata_optimizer_group* group) {
  if (group == nullptr) return STRATA_E_INVALID;
  *group = strata_optimizer_group{};
  group->struct_size = sizeof *group;
  const optim::GroupSettings defaults;  // torch.optim.AdamW's
  group->lr = defaults.lr;
  group->beta1 = defaults.beta1;
  group->beta2 = defaults.beta2;
  group->eps = defaults.eps;
  group->weight_decay = defaults.weight_decay;
  group->decoupled_weight_decay = defaults.decoupled ? 1 : 0;
  return STRATA_OK;
}

int strata_optimizer_add_group(strata_runtime* rt, const strata_optimizer_group* group,
                               uint32_t* index) {
  return guarded(rt, "strata_optimizer_add_group", [&](Runtime& r) -> Status {
    if (index == nullptr) return invalid_argument("index is NULL");
    STRATA_ASSIGN_OR_RETURN(
        auto read,
        strata::api::read_struct_in(group, strata::api::default_group(), "strata_optimizer_group"));
    STRATA_OPTIMIZER(r, optimizer);
    STRATA_ASSIGN_OR_RETURN(auto added, optimizer.add_group(strata::api::group_settings(read)));
    *index = added;
    return Status::ok();
  });
}

int strata_optimizer_set_group(strata_runtime* rt, uint32_t index,
                               const strata_optimizer_group* group) {
  return guarded(rt, "strata_optimizer_set_group", [&](Runtime& r) -> Status {
    STRATA_ASSIGN_OR_RETURN(
        auto read,
        strata::api::read_struct_in(group, strata::api::default_group(), "strata_optimizer_group"));
    STRATA_OPTIMIZER(r, optimizer);
    return optimizer.set_group(index, strata::api::group_settings(read));
  });
}

int strata_optimizer_get_group(strata_runtime* rt, uint32_t index, strata_optimizer_group* out) {
  return guarded(rt, "strata_optimizer_get_group", [&](Runtime& r) -> Status {
    STRATA_TRY(strata::api::check_struct_out(out, "strata_optimizer_group"));
    STRATA_OPTIMIZER(r, optimizer);
    STRATA_ASSIGN_OR_RETURN(auto group, optimizer.group(index));
    strata_optimizer_group g{};
    g.lr = group.lr;
    g.beta1 = group.beta1;
    g.beta2 = group.beta2;
    g.eps = group.eps;
    g.weight_decay = group.weight_decay;
    g.decoupled_weight_decay = group.decoupled ? 1 : 0;
    strata::api::write_struct_out(out, g);
    return Status::ok();
  });
}

int strata_optimizer_add_param(strata_runtime* rt, uint32_t group, strata_tensor param,
                               strata_tensor grad) {
  return guarded(rt, "strata_optimizer_add_param", [&](Runtime& r) -> Status {
    STRATA_OPTIMIZER(r, optimizer);
    const auto param_handle = sched::TensorHandle::from_u64(param);
    const auto grad_handle = sched::TensorHandle::from_u64(grad);
    STRATA_TRY(strata::api::refuse_read_only(
        r, param_handle,
        "the optimizer would write its new weights (a frozen parameter "
        "has no place in an optimizer)"));
    STRATA_TRY(strata::api::refuse_read_only(r, grad_handle, "the backward writes a gradient"));
    return optimizer.add_param(group, param_handle, grad_handle);
  });
}

int strata_optimizer_options_init(strata_optimizer_options* options) {
  if (options == nullptr) return STRATA_E_INVALID;
  *options = strata_optimizer_options{};
  options->struct_size = sizeof *options;
  const optim::TieredOptimizerOptions defaults;
  options->max_grad_norm = defaults.max_grad_norm;
  options->check_overflow = defaults.check_overflow ? 1 : 0;
  options->overlap_backward = defaults.overlap_backward ? 1 : 0;
  options->sub_group_bytes = defaults.sub_group_bytes;
  return STRATA_OK;
}

int strata_optimizer_configure(strata_runtime* rt, const strata_optimizer_options* options) {
  return guarded(rt, "strata_optimizer_configure", [&](Runtime& r) -> Status {
    STRATA_ASSIGN_OR_RETURN(auto read,
                            strata::api::read_struct_in(options, strata::api::default_options(),
                                                        "strata_optimizer_options"));
    options = &read;
    if ((options->check_overflow != 0 && options->check_overflow != 1) ||
        (options->overlap_backward != 0 && options->overlap_backward != 1)) {
      return invalid_argument("check_overflow and overlap_backward must be 0 or 1");
    }
    optim::TieredOptimizerOptions o;
    o.max_grad_norm = options->max_grad_norm;
    o.check_overflow = options->check_overflow != 0;
    o.overlap_backward = options->overlap_backward != 0;
    o.sub_group_bytes = options->sub_group_bytes;
    STRATA_OPTIMIZER(r, optimizer);
    return optimizer.configure(o);
  });
}

int strata_optimizer_get_options(strata_runtime* rt, strata_optimizer_options* out) {
  return guarded(rt, "strata_optimizer_get_options", [&](Runtime& r) -> Status {
    STRATA_TRY(strata::api::check_struct_out(out, "strata_optimizer_options"));
    STRATA_OPTIMIZER(r, optimizer);
    const optim::TieredOptimizerOptions o = optimizer.options();
    strata_optimizer_options options{};
    options.max_grad_norm = o.max_grad_norm;
    options.check_overflow = o.check_overflow ? 1 : 0;
    options.overlap_backward = o.overlap_backward ? 1 : 0;
    options.sub_group_bytes = o.sub_group_bytes;
    strata::api::write_struct_out(out, options);
    return Status::ok();
  });
}

int strata_optimizer_grad_ready(strata_runtime* rt, strata_tensor param) {
  return guarded(rt, "strata_optimizer_grad_ready", [&](Runtime& r) -> Status {
    STRATA_OPTIMIZER(r, optimizer);
    return optimizer.grad_ready(sched::TensorHandle::from_u64(param));
  });
}

int strata_optimizer_step(strata_runtime* rt, double loss_scale, strata_optimizer_result* result) {
  return guarded(rt, "strata_optimizer_step", [&](Runtime& r) -> Status {
    if (result != nullptr) {
      STRATA_TRY(strata::api::check_struct_out(result, "strata_optimizer_result"));
    }
    STRATA_OPTIMIZER(r, optimizer);
    STRATA_ASSIGN_OR_RETURN(auto report, optimizer.step(loss_scale));
    if (result != nullptr) {
      strata_optimizer_result out{};
      out.found_nonfinite = report.found_nonfinite ? 1 : 0;
      out.grad_norm = report.grad_norm;
      out.step = report.step;
      out.read_wait_seconds = report.read_wait_seconds;
      out.update_seconds = report.update_seconds;
      out.write_wait_seconds = report.write_wait_seconds;
      strata::api::write_struct_out(result, out);
    }
    return Status::ok();
  });
}

int strata_optimizer_get_step(strata_runtime* rt, int64_t* step) {
  return guarded(rt, "strata_optimizer_get_step", [&](Runtime& r) -> Status {
    if (step == nullptr) return invalid_argument("step is NULL");
    STRATA_OPTIMIZER(r, optimizer);
    *step = optimizer.step_count();
    return Status::ok();
  });
}

int strata_optimizer_set_step(strata_runtime* rt, int64_t step) {
  return guarded(rt, "strata_optimizer_set_step", [&](Runtime& r) -> Status {
    STRATA_OPTIMIZER(r, optimizer);
    return optimizer.set_step_count(step);
  });
}

int strata_optimizer_read_state(strata_runtime* rt, strata_tensor param,
                                strata_optimizer_state state, void* dst, uint64_t bytes) {
  return guarded(rt, "strata_optimizer_read_state", [&](Runtime& r) -> Status {
    if (dst == nullptr) return invalid_argument("dst is NULL");
    STRATA_ASSIGN_OR_RETURN(auto kind, strata::api::state_kind(state));
    STRATA_OPTIMIZER(r, optimizer);
    return optimizer.read_state(sched::TensorHandle::from_u64(param), kind, dst, bytes);
  });
}

int strata_optimizer_write_state(strata_runtime* rt, strata_tensor param,
                                 strata_optimizer_state state, const void* src, uint64_t bytes) {
  return guarded(rt, "strata_optimizer_write_state", [&](Runtime& r) -> Status {
    if (src == nullptr) return invalid_argument("src is NULL");
    STRATA_ASSIGN_OR_RETURN(auto kind, strata::api::state_kind(state));
    STRATA_OPTIMIZER(r, optimizer);
    return optimizer.write_state(sched::TensorHandle::from_u64(param), kind, src, bytes);
  });
}

int strata_optimizer_export(strata_runtime* rt, const char* path) {
  return guarded(rt, "strata_optimizer_export", [&](Runtime& r) -> Status {
    if (path == nullptr || path[0] == '\0') return invalid_argument("path is empty");
    STRATA_OPTIMIZER(r, optimizer);
    return optimizer.export_checkpoint(path);
  });
}

int strata_optimizer_import(strata_runtime* rt, const char* path) {
  return guarded(rt, "strata_optimizer_import", [&](Runtime& r) -> Status {
    if (path == nullptr || path[0] == '\0') return invalid_argument("path is empty");
    STRATA_OPTIMIZER(r, optimizer);
    return optimizer.import_checkpoint(path);
  });
}

}  // extern "C"
