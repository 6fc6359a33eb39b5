#include "memory/pinned_arena.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/align.h"
#include "common/assert.h"
#include "common/units.h"
#include "io/io_engine.h"
#include "memory/device.h"
#include "memory/host_memory.h"

namespace strata::memory {
namespace {

void warn(const std::string& message) {
  std::fprintf(stderr, "strata: warning: %s\n", message.c_str());
}

std::string bytes_and_exact(uint64_t bytes) {
  return format_bytes(bytes) + " (" + std::to_string(bytes) + " B)";
}

// strerror is not thread-safe; allocations happen on many threads.
std::string error_text(int error) {
  char buffer[128];
  return strerror_r(error, buffer, sizeof buffer);  // the GNU variant: returns the text
}

std::string limit_text(rlim_t limit) {
  return limit == RLIM_INFINITY ? "unlimited" : bytes_and_exact(limit);
}

}  // namespace

// --- PinnedBuffer ------------------------------------------------------------------------------

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : arena_(std::exchange(other.arena_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      reserved_(std::exchange(other.reserved_, 0)),
      device_registered_(other.device_registered_),
      io_indices_(std::move(other.io_indices_)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    arena_ = std::exchange(other.arena_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    reserved_ = std::exchange(other.reserved_, 0);
    device_registered_ = other.device_registered_;
    io_indices_ = std::move(other.io_indices_);
  }
  return *this;
}

void PinnedBuffer::reset() {
  if (data_ != nullptr) arena_->release(*this);
  arena_ = nullptr;
  data_ = nullptr;
  size_ = reserved_ = 0;
  io_indices_.clear();
}

int32_t PinnedBuffer::io_buffer_index(uint64_t offset, uint64_t length) const {
  if (io_indices_.empty() || length == 0 || offset + length > reserved_) return -1;
  const uint64_t chunk = offset / kIoRegistrationChunk;
  if ((offset + length - 1) / kIoRegistrationChunk != chunk) return -1;
  return io_indices_[chunk];
}

// --- PinnedArena -------------------------------------------------------------------------------

Result<std::unique_ptr<PinnedArena>> PinnedArena::create(const PinnedArenaOptions& options) {
  if (options.budget_bytes == 0) {
    return invalid_argument("the pinned budget must be > 0 bytes (pinned_budget_bytes)");
  }
  const std::string bus_id = options.device != nullptr ? options.device->pci_bus_id() : "";
  STRATA_ASSIGN_OR_RETURN(HwlocTopology topology,
                          HwlocTopology::load_system(/*with_pci_devices=*/!bus_id.empty()));
  STRATA_ASSIGN_OR_RETURN(NumaChoice choice, choose_numa_node(topology, options.numa_node, bus_id),
                          "pinned arena");
  return std::unique_ptr<PinnedArena>(
      new PinnedArena(options, std::move(topology), choice.node, choice.reason));
}

PinnedArena::PinnedArena(const PinnedArenaOptions& options, HwlocTopology topology, int node,
                         std::string reason)
    : options_(options),
      topology_(std::move(topology)),
      numa_node_(node),
      numa_reason_(std::move(reason)) {
  nodeset_ = hwloc_bitmap_alloc();
  if (nodeset_ != nullptr) hwloc_bitmap_only(nodeset_, static_cast<unsigned>(node));
}

PinnedArena::~PinnedArena() {
  // Buffers hold a pointer to their arena: one still alive now is a lifetime bug in the owner.
  STRATA_ASSERT(allocations_.load() == 0);
  if (nodeset_ != nullptr) hwloc_bitmap_free(nodeset_);
}

Status PinnedArena::reserve_budget(uint64_t bytes, uint64_t reserved) {
  const uint64_t budget = options_.budget_bytes;
  uint64_t in_use = reserved_.load(std::memory_order_relaxed);
  do {
    if (reserved > budget || in_use > budget - reserved) {
      return Status::error(
          STRATA_E_PINNED_BUDGET,
          "pinned budget exceeded: asked " + bytes_and_exact(bytes) + ", " +
              bytes_and_exact(reserved) + " once rounded to 4 KiB pages; in use " +
              bytes_and_exact(in_use) + " of a budget of " + bytes_and_exact(budget) + " (" +
              format_bytes(budget - std::min(budget, in_use)) +
              " free); raise pinned_budget_bytes (strata_config) or stage fewer tensors at "
              "once (a shorter prefetch lookahead)");
    }
  } while (!reserved_.compare_exchange_weak(in_use, in_use + reserved, std::memory_order_relaxed));
  const uint64_t now = in_use + reserved;
  uint64_t peak = peak_reserved_.load(std::memory_order_relaxed);
  while (now > peak && !peak_reserved_.compare_exchange_weak(peak, now)) {
  }
  return Status::ok();
}

void PinnedArena::bind(std::byte* data, uint64_t bytes) {
  if (!options_.bind_numa || nodeset_ == nullptr) return;
  // Bound before the first touch, so pages are born on the node (no migration needed).
  if (hwloc_set_area_membind(topology_.get(), data, bytes, nodeset_, HWLOC_MEMBIND_BIND,
                             HWLOC_MEMBIND_BYNODESET) == 0) {
    return;
  }
  const int error = errno;
  numa_bound_.store(false, std::memory_order_relaxed);
  if (!warned_numa_.exchange(true)) {
    warn("pinned memory cannot be bound to NUMA node " + std::to_string(numa_node_) + " (" +
         error_text(error) + "); pages are placed on first touch instead");
  }
}

Result<std::byte*> PinnedArena::map_pages(uint64_t bytes, int flags, bool huge) {
  // Huge pages: locking (and later pinning for the GPU and io_uring) faults in one 2 MiB page
  // instead of 512 small ones; on the main job this halved Strata's step (docs/memory.md). THP
  // backs only 2 MiB-aligned ranges, so the mapping is made larger by one huge page less a page,
  // and the slack on either side of the aligned range is unmapped again: what stays mapped is
  // exactly [data, data + bytes).
  const uint64_t slack = huge ? kHugePageSize - kPageSize : 0;
  void* p = ::mmap(nullptr, bytes + slack, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    return errno_status(STRATA_E_NOMEM, "mapping " + bytes_and_exact(bytes) + " of pinned memory",
                        errno);
  }
  auto* base = static_cast<std::byte*>(p);
  if (!huge) return base;
  const uint64_t head = align_up(reinterpret_cast<uintptr_t>(base), kHugePageSize) -
                        reinterpret_cast<uintptr_t>(base);
  std::byte* data = base + head;
  STRATA_ASSERT(head <= slack);
  if (head > 0) ::munmap(base, head);
  if (slack - head > 0) ::munmap(data + bytes, slack - head);
  // Advice, not a requirement: with THP off ("never") the range keeps small pages and works the
  // same, only slower to lock.
  ::madvise(data, bytes, MADV_HUGEPAGE);
  return data;
}

Result<PinnedBuffer> PinnedArena::allocate(uint64_t bytes) {
  if (bytes == 0) return invalid_argument("pinned allocation of 0 bytes");
  if (bytes > UINT64_MAX - kPageSize) {
    return invalid_argument("pinned allocation of " + std::to_string(bytes) + " bytes");
  }
  const uint64_t reserved = align_up(bytes, kPageSize);
  STRATA_TRY(reserve_budget(bytes, reserved));
  // From here on, every failure gives the budget back.
  auto give_back = [&] { reserved_.fetch_sub(reserved, std::memory_order_relaxed); };

  // Unlocked mappings (dry runs) must not count against the commit limit before they are used.
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (options_.lock_pages ? 0 : MAP_NORESERVE);
  const bool huge = options_.huge_pages && reserved >= kHugePageSize;
  Result<std::byte*> mapped = map_pages(reserved, flags, huge);
  if (!mapped) {
    give_back();
    return std::move(mapped).take_status();
  }
  std::byte* data = *mapped;
  // A fork (DataLoader workers) must not turn DMA targets into copy-on-write pages.
  ::madvise(data, reserved, MADV_DONTFORK);
  if (options_.require_numa_binding && options_.bind_numa) {
    if (hwloc_set_area_membind(topology_.get(), data, reserved, nodeset_, HWLOC_MEMBIND_BIND,
                               HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT) != 0) {
      const int error = errno;
      ::munmap(data, reserved);
      give_back();
      return errno_status(STRATA_E_UNSUPPORTED,
                          "binding pinned memory to NUMA node " + std::to_string(numa_node_),
                          error);
    }
  } else {
    bind(data, reserved);
  }

  if (options_.lock_pages && ::mlock(data, reserved) != 0) {
    const int error = errno;
    ::munmap(data, reserved);
    give_back();
    rlimit limit{};
    ::getrlimit(RLIMIT_MEMLOCK, &limit);
    uint64_t locked = 0;
    if (Result<ProcMemory> m = read_proc_memory(); m.is_ok()) locked = m->vm_lck;
    return Status::error(
        STRATA_E_LIMIT,
        std::string("locking ") + bytes_and_exact(reserved) + " of pinned memory failed (" +
            error_text(error) + "): RLIMIT_MEMLOCK is " + limit_text(limit.rlim_cur) + " (hard " +
            limit_text(limit.rlim_max) + ") and the process has " + bytes_and_exact(locked) +
            " locked already; raise the limit (ulimit -l unlimited; systemd LimitMEMLOCK=infinity; "
            "docker run --ulimit memlock=-1) or lower pinned_budget_bytes");
  }

  PinnedBuffer buffer;
  buffer.arena_ = this;
  buffer.data_ = data;
  buffer.size_ = bytes;
  buffer.reserved_ = reserved;
  allocations_.fetch_add(1, std::memory_order_relaxed);
  requested_.fetch_add(bytes, std::memory_order_relaxed);
  // From here the buffer owns the mapping: an early return releases everything done so far.

  if (options_.device != nullptr) {
    Status registered = options_.device->register_host(data, reserved);
    if (!registered.is_ok()) {
      return std::move(registered)
          .with_context("registering pinned memory with " + options_.device->name());
    }
    buffer.device_registered_ = true;
  }

  if (options_.io_engine != nullptr) {
    // Fixed buffers save the kernel from pinning pages on every request; an engine that refuses
    // (memlock accounting, too many buffers) still does I/O on the memory, only slower.
    buffer.io_indices_.reserve((reserved + kIoRegistrationChunk - 1) / kIoRegistrationChunk);
    for (uint64_t offset = 0; offset < reserved; offset += kIoRegistrationChunk) {
      const uint64_t length = std::min(kIoRegistrationChunk, reserved - offset);
      Result<int32_t> index = options_.io_engine->register_buffer(data + offset, length);
      if (index.is_ok()) {
        buffer.io_indices_.push_back(*index);
        continue;
      }
      buffer.io_indices_.push_back(-1);
      io_failures_.fetch_add(1, std::memory_order_relaxed);
      if (!warned_io_.exchange(true)) {
        warn("pinned memory is not registered with the I/O engine (" + index.status().message() +
             "); I/O on it works without fixed buffers");
      }
    }
  }
  return buffer;
}

void PinnedArena::release(PinnedBuffer& buffer) noexcept {
  for (const int32_t index : buffer.io_indices_) {
    if (index >= 0) (void)options_.io_engine->unregister_buffer(index);
  }
  if (buffer.device_registered_) (void)options_.device->unregister_host(buffer.data_);
  ::munmap(buffer.data_, buffer.reserved_);
  requested_.fetch_sub(buffer.size_, std::memory_order_relaxed);
  allocations_.fetch_sub(1, std::memory_order_relaxed);
  reserved_.fetch_sub(buffer.reserved_, std::memory_order_relaxed);
}

PinnedArenaStats PinnedArena::stats() const {
  PinnedArenaStats s;
  s.budget_bytes = options_.budget_bytes;
  s.reserved_bytes = reserved_.load(std::memory_order_relaxed);
  s.requested_bytes = requested_.load(std::memory_order_relaxed);
  s.peak_reserved_bytes = peak_reserved_.load(std::memory_order_relaxed);
  s.allocations = allocations_.load(std::memory_order_relaxed);
  s.io_registration_failures = io_failures_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace strata::memory
