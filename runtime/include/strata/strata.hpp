// strata.hpp - a header-only C++20 face of Strata's C API (strata.h), so that a C++ framework
// need not write its own RAII layer. It includes only strata.h and standard headers, and calls
// nothing but the exported strata_* functions: it works against the shared library alone.
//
// Error model: exceptions, on the C++ side only. A C call that returns a STRATA_E_* code makes
// the wrapper throw strata::Error, which carries that code (code()) and the context the C API
// recorded for the failure (what(): strata_last_error on the same thread, read right after the
// call, e.g. "strata_tensor_read: STRATA_E_STATE: ..."). The C API itself never throws; there is
// no second, non-throwing path here: call the C functions directly (handle(), get()) for that.
//
// Destructors never throw. Each one gives back what its object owns (unregister, free, release,
// step_end, layer_end, destroy) and ignores the status, because a destructor also runs while an
// exception unwinds the stack, and a second exception then would be std::terminate. A failure
// there is not lost: the C API still records it, so Runtime::last_error() on the same thread
// names it until the next failing call on that runtime; a write-back failure that a
// destructor's step_end() took is retried, and reported by sync() if the retry fails too. Every
// such object has an explicit call (unregister(), free(), release(), end(), destroy()) that does
// the same and throws; after it, the destructor does nothing.
//
// Ownership: Runtime owns a strata_runtime*. Tensor, Allocation, Acquired, Optimizer and the
// scopes keep a non-owning strata_runtime* of the runtime they came from, which must outlive
// them (destroy them first). A Runtime may be moved while they exist: the C handle they hold
// does not change. Move-only types leave the source empty (operator bool is false); an empty
// object is safe to destroy, and any call on it throws Error with STRATA_E_BAD_HANDLE.
//
// Threads: the wrapper adds no locking and no state beyond the handles. The thread rules of
// each C function (strata.h) apply to the member that calls it; one object must not be used
// from two threads at once.
#ifndef STRATA_STRATA_HPP
#define STRATA_STRATA_HPP

#include <strata/strata.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace strata {

// A failed C call: code() is the STRATA_E_* value, what() the C API's context for it.
class Error : public std::runtime_error {
 public:
  Error(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

inline const char* version() noexcept {
  return strata_version();
}

namespace detail {

// STRATA_TENSOR_NONE without its C cast, which -Wold-style-cast would report in client code.
inline constexpr strata_tensor kNoTensor = 0;

// The C API records a failure's context per thread on the runtime (for rt == NULL: the last
// failed creation), so it is read here, before another call on this thread can replace it.
inline void check(int code, const strata_runtime* rt) {
  if (code == STRATA_OK) return;
  std::string message = strata_last_error(rt);
  if (message.empty()) message = strata_strerror(code);
  throw Error(code, message);
}

// An empty wrapper is refused here rather than passed on as NULL: the C API would return
// STRATA_E_INVALID without recording a message, and strata_last_error(NULL) would then name an
// unrelated failed creation.
inline void require(bool engaged, const char* call) {
  if (engaged) return;
  throw Error(STRATA_E_BAD_HANDLE,
              std::string(call) +
                  ": the wrapper is empty (moved from, given back, or default-constructed)");
}

// A bound for the C API's *_timeout calls: whole milliseconds that fit their uint32_t.
inline uint32_t timeout_ms(std::chrono::milliseconds timeout, const char* call) {
  if (timeout.count() < 0 || timeout.count() > UINT32_MAX) {
    throw Error(STRATA_E_INVALID, std::string(call) + ": timeout " +
                                      std::to_string(timeout.count()) +
                                      " ms is outside 0 to 4294967295");
  }
  return static_cast<uint32_t>(timeout.count());
}

template <typename R>
concept ByteSource = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
    std::is_trivially_copyable_v<std::ranges::range_value_t<R>>;

template <typename R>
concept ByteSink =
    ByteSource<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

template <typename R>
uint64_t size_in_bytes(const R& range) {
  return static_cast<uint64_t>(std::ranges::size(range)) * sizeof(std::ranges::range_value_t<R>);
}

}  // namespace detail

// A filled strata_tensor_desc (struct_size set). `name` is copied by the registration, so it
// need only live until then.
inline strata_tensor_desc tensor_desc(const char* name, uint64_t bytes, strata_dtype dtype,
                                      strata_tensor_kind kind, int32_t layer = -1,
                                      strata_tier home_tier = STRATA_TIER_NVME,
                                      uint32_t flags = 0) noexcept {
  strata_tensor_desc desc{};
  desc.struct_size = sizeof desc;
  desc.name = name;
  desc.bytes = bytes;
  desc.dtype = dtype;
  desc.kind = kind;
  desc.layer = layer;
  desc.home_tier = home_tier;
  desc.flags = flags;
  return desc;
}

// strata_config, initialised by strata_config_init. Fields without a setter are set on `c`
// directly. The path setters keep their own copy of the string (and so do copies of the
// Config); a path assigned to c.nvme_path / c.raw_device directly must outlive the Runtime's
// construction, as must the array given to planned_tensors().
class Config {
 public:
  strata_config c;

  Config() { strata_config_init(&c); }
  Config(const Config& other)
      : c(other.c), nvme_path_(other.nvme_path_), raw_device_(other.raw_device_) {
    point_into_own_strings(other);
  }
  Config& operator=(const Config& other) {
    if (this != &other) {
      c = other.c;
      nvme_path_ = other.nvme_path_;
      raw_device_ = other.raw_device_;
      point_into_own_strings(other);
    }
    return *this;
  }
  ~Config() = default;

  Config& nvme_path(std::string path) {
    nvme_path_ = std::move(path);
    c.nvme_path = nvme_path_.c_str();
    return *this;
  }
  Config& raw_device(std::string device) {
    raw_device_ = std::move(device);
    c.raw_device = raw_device_.c_str();
    return *this;
  }
  Config& nvme_capacity_bytes(uint64_t v) { return set(c.nvme_capacity_bytes, v); }
  Config& keep_swap_file(bool v) { return set(c.keep_swap_file, v ? 1 : 0); }
  Config& verify_checksums(bool v) { return set(c.verify_checksums, v ? 1 : 0); }
  Config& pinned_budget_bytes(uint64_t v) { return set(c.pinned_budget_bytes, v); }
  Config& device_budget_bytes(uint64_t v) { return set(c.device_budget_bytes, v); }
  Config& host_budget_bytes(uint64_t v) { return set(c.host_budget_bytes, v); }
  Config& io_engine(strata_io_engine v) { return set(c.io_engine, v); }
  Config& queue_depth(uint32_t v) { return set(c.queue_depth, v); }
  Config& block_size(uint32_t v) { return set(c.block_size, v); }
  Config& worker_threads(uint32_t v) { return set(c.worker_threads, v); }
  Config& optimizer_threads(uint32_t v) { return set(c.optimizer_threads, v); }
  Config& policy(strata_policy v) { return set(c.policy, v); }
  Config& device_backend(strata_device_backend v) { return set(c.device_backend, v); }
  Config& device_ordinal(int v) { return set(c.device_ordinal, v); }
  Config& numa_node(int v) { return set(c.numa_node, v); }
  Config& trace_events(uint32_t v) { return set(c.trace_events, v); }
  Config& nvme_layout(strata_nvme_layout v) { return set(c.nvme_layout, v); }
  Config& zero_sub_group_elements(uint64_t v) { return set(c.zero_sub_group_elements, v); }
  Config& zero_param_buffer_elements(uint64_t v) { return set(c.zero_param_buffer_elements, v); }
  Config& stream_chunk_bytes(uint64_t v) { return set(c.stream_chunk_bytes, v); }
  Config& stream_buffers(uint32_t v) { return set(c.stream_buffers, v); }
  Config& drive_read_bytes_per_s(uint64_t v) { return set(c.drive_read_bytes_per_s, v); }
  Config& drive_write_bytes_per_s(uint64_t v) { return set(c.drive_write_bytes_per_s, v); }
  Config& planned_tensors(std::span<const strata_tensor_desc> tensors) {
    c.planned_tensors = tensors.data();
    c.planned_tensor_count = tensors.size();
    return *this;
  }

 private:
  template <typename Field, typename Value>
  Config& set(Field& field, Value value) {
    field = value;
    return *this;
  }

  // A path set through a setter points into the source's string; the copy must point into its
  // own (the source may die first). A pointer the caller put in `c` is the caller's: kept.
  void point_into_own_strings(const Config& other) {
    if (other.c.nvme_path == other.nvme_path_.c_str()) c.nvme_path = nvme_path_.c_str();
    if (other.c.raw_device == other.raw_device_.c_str()) c.raw_device = raw_device_.c_str();
  }

  std::string nvme_path_;
  std::string raw_device_;
};

// One strata_acquire, released when the guard dies. The bytes at data() are valid until then.
// The destructor releases with STRATA_RELEASE_DIRTY after mark_dirty(), else clean, and ignores
// a failed release (see the top of this file); release() does the same and throws.
class Acquired {
 public:
  Acquired() = default;
  Acquired(strata_runtime* rt, strata_tensor tensor, strata_tier tier, uint32_t flags = 0)
      : rt_(rt), tensor_(tensor) {
    detail::require(rt != nullptr, "strata_acquire");
    acquired_.struct_size = sizeof acquired_;
    detail::check(strata_acquire(rt, tensor, tier, flags, &acquired_), rt);
  }
  // strata_acquire_timeout: gives up after `timeout` (whole milliseconds, at most 2^32 - 1) with
  // STRATA_E_TIMEOUT, nothing acquired.
  Acquired(strata_runtime* rt, strata_tensor tensor, strata_tier tier, uint32_t flags,
           std::chrono::milliseconds timeout)
      : rt_(rt), tensor_(tensor) {
    detail::require(rt != nullptr, "strata_acquire_timeout");
    const uint32_t bound = detail::timeout_ms(timeout, "strata_acquire_timeout");
    acquired_.struct_size = sizeof acquired_;
    detail::check(strata_acquire_timeout(rt, tensor, tier, flags, bound, &acquired_), rt);
  }
  Acquired(Acquired&& other) noexcept { take(other); }
  Acquired& operator=(Acquired&& other) noexcept {
    if (this != &other) {
      release_quietly();
      take(other);
    }
    return *this;
  }
  Acquired(const Acquired&) = delete;
  Acquired& operator=(const Acquired&) = delete;
  ~Acquired() { release_quietly(); }

  explicit operator bool() const noexcept { return rt_ != nullptr; }
  strata_tensor tensor() const noexcept { return tensor_; }
  void* data() const noexcept { return acquired_.data; }
  uint64_t bytes() const noexcept { return acquired_.bytes; }
  // On CUDA, the event the caller's stream waits on before touching data(); NULL: ready now.
  void* ready_event() const noexcept { return acquired_.ready_event; }
  bool dirty() const noexcept { return (release_flags_ & STRATA_RELEASE_DIRTY) != 0; }

  // The buffer as elements of T. Throws STRATA_E_INVALID when the size is not a whole number
  // of elements or the address is not aligned for T.
  template <typename T>
  std::span<T> span() const {
    static_assert(std::is_trivially_copyable_v<T>, "a tensor's bytes hold trivially copyable T");
    if (acquired_.bytes % sizeof(T) != 0 ||
        reinterpret_cast<std::uintptr_t>(acquired_.data) % alignof(T) != 0) {
      throw Error(STRATA_E_INVALID, "strata::Acquired::span: " + std::to_string(acquired_.bytes) +
                                        " bytes are not whole, aligned elements of " +
                                        std::to_string(sizeof(T)) + " bytes");
    }
    return {static_cast<T*>(acquired_.data), static_cast<size_t>(acquired_.bytes / sizeof(T))};
  }

  // For a DEVICE tensor on CUDA: the cudaStream_t whose queued work reads or writes data(). The
  // release passes it to strata_release, which orders Strata's later copies out of, and reuse
  // of, the buffer after that work. Without it the release passes NULL, CUDA's default stream:
  // work queued on a stream created with cudaStreamNonBlocking would then still be reading the
  // buffer when Strata refills it for another tensor. Ignored for other tiers.
  void used_on_stream(strata_cuda_stream device_stream) noexcept { device_stream_ = device_stream; }
  // The data was (or will have been, once the stream's queued work is done) modified: the
  // release writes it back. The second form also names the stream writing it (used_on_stream).
  void mark_dirty() noexcept { release_flags_ |= STRATA_RELEASE_DIRTY; }
  void mark_dirty(strata_cuda_stream device_stream) noexcept {
    mark_dirty();
    used_on_stream(device_stream);
  }
  strata_cuda_stream device_stream() const noexcept { return device_stream_; }

  // Releases now and throws on failure (strata_release may end the acquire and still report an
  // earlier failed write-back of the tensor). The guard is empty afterwards either way, so the
  // destructor never releases twice.
  void release() {
    detail::require(rt_ != nullptr, "strata_release");
    strata_runtime* rt = rt_;
    const strata_tensor tensor = tensor_;
    const uint32_t flags = release_flags_;
    strata_cuda_stream device_stream = device_stream_;
    clear();
    detail::check(strata_release(rt, tensor, flags, device_stream), rt);
  }

 private:
  void release_quietly() noexcept {
    if (rt_ == nullptr) return;
    strata_release(rt_, tensor_, release_flags_, device_stream_);
    clear();
  }
  // Empty means data() NULL and bytes() 0 as well: the buffer is no longer the caller's.
  void clear() noexcept {
    rt_ = nullptr;
    tensor_ = detail::kNoTensor;
    acquired_ = strata_acquired{};
    release_flags_ = 0;
    device_stream_ = nullptr;
  }
  void take(Acquired& other) noexcept {
    rt_ = other.rt_;
    tensor_ = other.tensor_;
    acquired_ = other.acquired_;
    release_flags_ = other.release_flags_;
    device_stream_ = other.device_stream_;
    other.clear();
  }

  strata_runtime* rt_ = nullptr;  // not owned; nullptr: nothing to release
  strata_tensor tensor_ = detail::kNoTensor;
  strata_acquired acquired_{};
  uint32_t release_flags_ = 0;
  strata_cuda_stream device_stream_ = nullptr;
};

namespace detail {

// A tensor handle owned by one object and given back by GiveBack (unregister or free) when the
// object dies. Shared by Tensor and Allocation, which differ only in how they are made and
// given back.
template <int (*GiveBack)(strata_runtime*, strata_tensor)>
class OwnedTensor {
 public:
  explicit operator bool() const noexcept { return handle_ != detail::kNoTensor; }
  strata_tensor handle() const noexcept { return handle_; }
  strata_runtime* runtime() const noexcept { return rt_; }
  uint64_t bytes() const noexcept { return bytes_; }

  [[nodiscard]] Acquired acquire(strata_tier tier, uint32_t flags = 0) const {
    require_engaged("strata_acquire");
    return Acquired(rt_, handle_, tier, flags);
  }
  [[nodiscard]] Acquired acquire(strata_tier tier, uint32_t flags,
                                 std::chrono::milliseconds timeout) const {
    require_engaged("strata_acquire_timeout");
    return Acquired(rt_, handle_, tier, flags, timeout);
  }
  void prefetch(strata_tier tier) const {
    require_engaged("strata_prefetch");
    check(strata_prefetch(rt_, handle_, tier), rt_);
  }

  // Gives up ownership without giving the tensor back: the caller owns the handle now.
  strata_tensor detach() noexcept {
    rt_ = nullptr;
    bytes_ = 0;
    return std::exchange(handle_, detail::kNoTensor);
  }

 protected:
  OwnedTensor() = default;
  OwnedTensor(strata_runtime* rt, strata_tensor handle, uint64_t bytes) noexcept
      : rt_(rt), handle_(handle), bytes_(bytes) {}
  OwnedTensor(OwnedTensor&& other) noexcept { take(other); }
  OwnedTensor& operator=(OwnedTensor&& other) noexcept {
    if (this != &other) {
      give_back_quietly();
      take(other);
    }
    return *this;
  }
  OwnedTensor(const OwnedTensor&) = delete;
  OwnedTensor& operator=(const OwnedTensor&) = delete;
  ~OwnedTensor() { give_back_quietly(); }

  void require_engaged(const char* call) const { require(handle_ != detail::kNoTensor, call); }

  // Empties the object first: after a failure the destructor does not try again.
  void give_back(const char* call) {
    require_engaged(call);
    strata_runtime* rt = rt_;
    const strata_tensor handle = detach();
    check(GiveBack(rt, handle), rt);
  }

 private:
  void give_back_quietly() noexcept {
    if (handle_ == detail::kNoTensor) return;
    strata_runtime* rt = rt_;
    const strata_tensor handle = detach();
    GiveBack(rt, handle);
  }
  void take(OwnedTensor& other) noexcept {
    rt_ = std::exchange(other.rt_, nullptr);
    handle_ = std::exchange(other.handle_, detail::kNoTensor);
    bytes_ = std::exchange(other.bytes_, 0);
  }

  strata_runtime* rt_ = nullptr;  // not owned
  strata_tensor handle_ = detail::kNoTensor;
  uint64_t bytes_ = 0;
};

}  // namespace detail

// A registered tensor, unregistered when the Tensor dies. A failed unregister in the destructor
// (STRATA_E_STATE: an Acquired guard of it is still alive) leaves the tensor registered until
// it is unregistered by handle or the runtime is destroyed; unregister() throws instead.
class Tensor : public detail::OwnedTensor<&strata_tensor_unregister> {
 public:
  Tensor() = default;
  Tensor(strata_runtime* rt, const strata_tensor_desc& desc)
      : OwnedTensor(rt, registered(rt, desc), desc.bytes) {}

  void write(const void* src, uint64_t offset, uint64_t bytes) {
    require_engaged("strata_tensor_write");
    detail::check(strata_tensor_write(runtime(), handle(), src, offset, bytes), runtime());
  }
  void read(void* dst, uint64_t offset, uint64_t bytes) const {
    require_engaged("strata_tensor_read");
    detail::check(strata_tensor_read(runtime(), handle(), dst, offset, bytes), runtime());
  }
  // strata_tensor_write_timeout / read_timeout: give up after `timeout` with STRATA_E_TIMEOUT,
  // nothing copied.
  void write(const void* src, uint64_t offset, uint64_t bytes, std::chrono::milliseconds timeout) {
    require_engaged("strata_tensor_write_timeout");
    const uint32_t bound = detail::timeout_ms(timeout, "strata_tensor_write_timeout");
    detail::check(strata_tensor_write_timeout(runtime(), handle(), src, offset, bytes, bound),
                  runtime());
  }
  void read(void* dst, uint64_t offset, uint64_t bytes, std::chrono::milliseconds timeout) const {
    require_engaged("strata_tensor_read_timeout");
    const uint32_t bound = detail::timeout_ms(timeout, "strata_tensor_read_timeout");
    detail::check(strata_tensor_read_timeout(runtime(), handle(), dst, offset, bytes, bound),
                  runtime());
  }
  // Whole ranges of trivially copyable elements (std::vector, std::array, std::span, ...),
  // starting `offset` bytes into the tensor.
  template <detail::ByteSource R>
  void write(const R& src, uint64_t offset = 0) {
    write(std::ranges::data(src), offset, detail::size_in_bytes(src));
  }
  template <detail::ByteSink R>
  void read(R&& dst, uint64_t offset = 0) const {
    read(std::ranges::data(dst), offset, detail::size_in_bytes(dst));
  }

  void discard() {
    require_engaged("strata_tensor_discard");
    detail::check(strata_tensor_discard(runtime(), handle()), runtime());
  }
  void unregister() { give_back("strata_tensor_unregister"); }

 private:
  static strata_tensor registered(strata_runtime* rt, const strata_tensor_desc& desc) {
    detail::require(rt != nullptr, "strata_tensor_register");
    strata_tensor handle = detail::kNoTensor;
    detail::check(strata_tensor_register(rt, &desc, &handle), rt);
    return handle;
  }
};

// Memory from strata_malloc, freed by strata_free when the Allocation dies (a failed free in the
// destructor, e.g. while acquired, leaves it until freed by handle or the runtime is destroyed;
// free() throws).
// acquire() gives its address.
class Allocation : public detail::OwnedTensor<&strata_free> {
 public:
  Allocation() = default;
  Allocation(strata_runtime* rt, uint64_t bytes, strata_tier tier, uint32_t flags = 0)
      : OwnedTensor(rt, allocated(rt, bytes, tier, flags), bytes) {}

  void free() { give_back("strata_free"); }

 private:
  static strata_tensor allocated(strata_runtime* rt, uint64_t bytes, strata_tier tier,
                                 uint32_t flags) {
    detail::require(rt != nullptr, "strata_malloc");
    strata_tensor handle = detail::kNoTensor;
    detail::check(strata_malloc(rt, bytes, tier, flags, &handle), rt);
    return handle;
  }
};

// The strata_optimizer_* calls of one runtime. It owns nothing (the optimizer's states belong to
// the runtime), so it is freely copied; training thread only, like the calls.
class Optimizer {
 public:
  explicit Optimizer(strata_runtime* rt) noexcept : rt_(rt) {}

  static strata_optimizer_group default_group() {
    strata_optimizer_group group{};
    detail::check(strata_optimizer_group_init(&group), nullptr);
    return group;
  }
  static strata_optimizer_options default_options() {
    strata_optimizer_options options{};
    detail::check(strata_optimizer_options_init(&options), nullptr);
    return options;
  }

  uint32_t add_group(const strata_optimizer_group& group) {
    uint32_t index = 0;
    call(strata_optimizer_add_group(rt(), &group, &index));
    return index;
  }
  void set_group(uint32_t index, const strata_optimizer_group& group) {
    call(strata_optimizer_set_group(rt(), index, &group));
  }
  strata_optimizer_group get_group(uint32_t index) const {
    strata_optimizer_group group{};
    group.struct_size = sizeof group;
    call(strata_optimizer_get_group(rt(), index, &group));
    return group;
  }
  void configure(const strata_optimizer_options& options) {
    call(strata_optimizer_configure(rt(), &options));
  }
  // The options in force, for read-modify-write: auto o = get_options(); o.x = ...; configure(o).
  strata_optimizer_options get_options() const {
    strata_optimizer_options options{};
    options.struct_size = sizeof options;
    call(strata_optimizer_get_options(rt(), &options));
    return options;
  }
  void add_param(uint32_t group, strata_tensor param, strata_tensor grad) {
    call(strata_optimizer_add_param(rt(), group, param, grad));
  }
  void grad_ready(strata_tensor param) { call(strata_optimizer_grad_ready(rt(), param)); }

  strata_optimizer_result step(double loss_scale = 1.0) {
    strata_optimizer_result result{};
    result.struct_size = sizeof result;
    call(strata_optimizer_step(rt(), loss_scale, &result));
    return result;
  }
  int64_t get_step() const {
    int64_t step = 0;
    call(strata_optimizer_get_step(rt(), &step));
    return step;
  }
  void set_step(int64_t step) { call(strata_optimizer_set_step(rt(), step)); }

  // One state of one parameter: dst / src hold exactly its element count of floats.
  void read_state(strata_tensor param, strata_optimizer_state state, std::span<float> dst) const {
    call(strata_optimizer_read_state(rt(), param, state, dst.data(), dst.size_bytes()));
  }
  void write_state(strata_tensor param, strata_optimizer_state state, std::span<const float> src) {
    call(strata_optimizer_write_state(rt(), param, state, src.data(), src.size_bytes()));
  }

  // strata_optimizer_export / _import (`export` is a C++ keyword).
  void export_checkpoint(const std::string& path) {
    call(strata_optimizer_export(rt(), path.c_str()));
  }
  void import_checkpoint(const std::string& path) {
    call(strata_optimizer_import(rt(), path.c_str()));
  }

 private:
  strata_runtime* rt() const {
    detail::require(rt_ != nullptr, "strata_optimizer");
    return rt_;
  }
  void call(int code) const { detail::check(code, rt_); }

  strata_runtime* rt_;  // not owned
};

class Runtime;

// strata_step_begin now, strata_step_end when the scope dies, so that a step left by an
// exception still ends and the next step can begin. The destructor ignores a failed end (a
// failed write-back is retried, and reported by sync() if it fails again); end() throws for a
// failure that has happened by then; sync() writes back what is dirty and throws if that fails.
// Not movable: it belongs to the block that opened it.
class StepScope {
 public:
  explicit StepScope(Runtime& runtime);
  explicit StepScope(strata_runtime* rt) : rt_(rt) {
    detail::require(rt != nullptr, "strata_step_begin");
    detail::check(strata_step_begin(rt), rt);
  }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;
  ~StepScope() {
    if (rt_ != nullptr) strata_step_end(rt_);
  }

  // Ends the step now and throws on failure; the destructor then does nothing.
  void end() {
    detail::require(rt_ != nullptr, "strata_step_end");
    strata_runtime* rt = std::exchange(rt_, nullptr);
    detail::check(strata_step_end(rt), rt);
  }

 private:
  strata_runtime* rt_;  // not owned; nullptr once ended
};

// strata_layer_begin(phase, layer) now, strata_layer_end(phase, layer) when the scope dies; the
// same error rules as StepScope. Declare it inside the StepScope's block so it ends first.
class LayerScope {
 public:
  LayerScope(Runtime& runtime, strata_phase phase, int32_t layer);
  LayerScope(strata_runtime* rt, strata_phase phase, int32_t layer)
      : rt_(rt), phase_(phase), layer_(layer) {
    detail::require(rt != nullptr, "strata_layer_begin");
    detail::check(strata_layer_begin(rt, phase, layer), rt);
  }
  LayerScope(const LayerScope&) = delete;
  LayerScope& operator=(const LayerScope&) = delete;
  ~LayerScope() {
    if (rt_ != nullptr) strata_layer_end(rt_, phase_, layer_);
  }

  void end() {
    detail::require(rt_ != nullptr, "strata_layer_end");
    strata_runtime* rt = std::exchange(rt_, nullptr);
    detail::check(strata_layer_end(rt, phase_, layer_), rt);
  }

 private:
  strata_runtime* rt_;  // not owned; nullptr once ended
  strata_phase phase_;
  int32_t layer_;
};

// Owns a strata_runtime: created in the constructor (throws Error with the creation's message),
// destroyed by the destructor (status ignored) or by destroy() (throws).
class Runtime {
 public:
  Runtime() = default;
  explicit Runtime(const strata_config& config) {
    detail::check(strata_runtime_create(&config, &rt_), nullptr);
  }
  explicit Runtime(const Config& config) : Runtime(config.c) {}
  Runtime(Runtime&& other) noexcept : rt_(std::exchange(other.rt_, nullptr)) {}
  Runtime& operator=(Runtime&& other) noexcept {
    if (this != &other) {
      strata_runtime_destroy(rt_);
      rt_ = std::exchange(other.rt_, nullptr);
    }
    return *this;
  }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  ~Runtime() { strata_runtime_destroy(rt_); }

  explicit operator bool() const noexcept { return rt_ != nullptr; }
  strata_runtime* get() const noexcept { return rt_; }

  // Destroys now. The runtime is gone afterwards even on failure, so the message is the code's
  // name: there is no runtime left to ask for its context.
  void destroy() {
    detail::require(rt_ != nullptr, "strata_runtime_destroy");
    const int code = strata_runtime_destroy(std::exchange(rt_, nullptr));
    if (code != STRATA_OK) {
      throw Error(code, std::string("strata_runtime_destroy: ") + strata_strerror(code));
    }
  }

  // The context of this thread's last failed call on the runtime, "" when none. On an empty
  // Runtime: the last failed creation on this thread.
  std::string last_error() const { return strata_last_error(rt_); }

  strata_stats stats() const {
    strata_stats stats{};
    stats.struct_size = sizeof stats;
    call(strata_get_stats(rt(), &stats));
    return stats;
  }
  void sync() { call(strata_sync(rt())); }
  // strata_sync_timeout: throws STRATA_E_TIMEOUT after `timeout`, the write-backs still going.
  void sync(std::chrono::milliseconds timeout) {
    call(strata_sync_timeout(rt(), detail::timeout_ms(timeout, "strata_sync_timeout")));
  }
  void export_trace(const std::string& path) { call(strata_export_trace(rt(), path.c_str())); }

  [[nodiscard]] Tensor register_tensor(const strata_tensor_desc& desc) {
    return Tensor(rt(), desc);
  }
  [[nodiscard]] Tensor register_tensor(const std::string& name, uint64_t bytes, strata_dtype dtype,
                                       strata_tensor_kind kind, int32_t layer = -1,
                                       strata_tier home_tier = STRATA_TIER_NVME) {
    return register_tensor(tensor_desc(name.c_str(), bytes, dtype, kind, layer, home_tier));
  }
  [[nodiscard]] Allocation allocate(uint64_t bytes, strata_tier tier, uint32_t flags = 0) {
    return Allocation(rt(), bytes, tier, flags);
  }
  [[nodiscard]] Acquired acquire(strata_tensor tensor, strata_tier tier, uint32_t flags = 0) {
    return Acquired(rt(), tensor, tier, flags);
  }
  void prefetch(strata_tensor tensor, strata_tier tier) {
    call(strata_prefetch(rt(), tensor, tier));
  }

  void step_begin() { call(strata_step_begin(rt())); }
  void step_end() { call(strata_step_end(rt())); }
  void layer_begin(strata_phase phase, int32_t layer) {
    call(strata_layer_begin(rt(), phase, layer));
  }
  void layer_end(strata_phase phase, int32_t layer) { call(strata_layer_end(rt(), phase, layer)); }
  [[nodiscard]] StepScope step() { return StepScope(rt()); }
  [[nodiscard]] LayerScope layer(strata_phase phase, int32_t layer) {
    return LayerScope(rt(), phase, layer);
  }
  void declare_schedule(std::span<const strata_schedule_entry> entries) {
    call(strata_declare_schedule(rt(), entries.data(), entries.size()));
  }

  Optimizer optimizer() { return Optimizer(rt()); }

 private:
  strata_runtime* rt() const {
    detail::require(rt_ != nullptr, "strata::Runtime");
    return rt_;
  }
  void call(int code) const { detail::check(code, rt_); }

  strata_runtime* rt_ = nullptr;
};

inline StepScope::StepScope(Runtime& runtime) : StepScope(runtime.get()) {}
inline LayerScope::LayerScope(Runtime& runtime, strata_phase phase, int32_t layer)
    : LayerScope(runtime.get(), phase, layer) {}

}  // namespace strata

#endif  // STRATA_STRATA_HPP
