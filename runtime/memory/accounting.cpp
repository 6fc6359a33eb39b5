#include "memory/accounting.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/assert.h"
#include "common/unique_fd.h"
#include "memory/device.h"

namespace strata::memory {
namespace {

void raise_peak(std::atomic<uint64_t>& peak, uint64_t value) {
  uint64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

uint64_t add(std::atomic<uint64_t>& counter, uint64_t bytes) {
  return counter.fetch_add(bytes, std::memory_order_relaxed) + bytes;
}

void subtract(std::atomic<uint64_t>& counter, uint64_t bytes) {
  const uint64_t before = counter.fetch_sub(bytes, std::memory_order_relaxed);
  STRATA_ASSERT(before >= bytes);  // released more than was counted: a bookkeeping bug
}

}  // namespace

void Accounting::reserve(Tier tier, uint64_t bytes) {
  TierSlot& t = tiers_[static_cast<size_t>(tier)];
  raise_peak(t.peak_reserved, add(t.reserved, bytes));
}

void Accounting::unreserve(Tier tier, uint64_t bytes) {
  subtract(tiers_[static_cast<size_t>(tier)].reserved, bytes);
}

void Accounting::use(Tier tier, TensorKind kind, uint64_t bytes) {
  TierSlot& t = tiers_[static_cast<size_t>(tier)];
  KindSlot& k = t.kinds[static_cast<size_t>(kind)];
  raise_peak(t.peak_in_use, add(t.in_use, bytes));
  raise_peak(k.peak, add(k.in_use, bytes));
}

void Accounting::unuse(Tier tier, TensorKind kind, uint64_t bytes) {
  TierSlot& t = tiers_[static_cast<size_t>(tier)];
  subtract(t.in_use, bytes);
  subtract(t.kinds[static_cast<size_t>(kind)].in_use, bytes);
}

TierCounters Accounting::tier(Tier tier) const {
  const TierSlot& t = tiers_[static_cast<size_t>(tier)];
  TierCounters c;
  c.reserved_bytes = t.reserved.load(std::memory_order_relaxed);
  c.in_use_bytes = t.in_use.load(std::memory_order_relaxed);
  c.peak_reserved_bytes = t.peak_reserved.load(std::memory_order_relaxed);
  c.peak_in_use_bytes = t.peak_in_use.load(std::memory_order_relaxed);
  return c;
}

KindCounters Accounting::kind(Tier tier, TensorKind kind) const {
  const KindSlot& k = tiers_[static_cast<size_t>(tier)].kinds[static_cast<size_t>(kind)];
  return {k.in_use.load(std::memory_order_relaxed), k.peak.load(std::memory_order_relaxed)};
}

void Accounting::reset_peaks() {
  for (TierSlot& t : tiers_) {
    t.peak_reserved.store(t.reserved.load(std::memory_order_relaxed), std::memory_order_relaxed);
    t.peak_in_use.store(t.in_use.load(std::memory_order_relaxed), std::memory_order_relaxed);
    for (KindSlot& k : t.kinds) {
      k.peak.store(k.in_use.load(std::memory_order_relaxed), std::memory_order_relaxed);
    }
  }
}

ScopedUse::ScopedUse(Accounting* accounting, Tier tier, TensorKind kind, uint64_t bytes)
    : accounting_(accounting), tier_(tier), kind_(kind), bytes_(bytes) {
  if (accounting_ != nullptr) accounting_->use(tier_, kind_, bytes_);
}

ScopedUse::ScopedUse(ScopedUse&& other) noexcept
    : accounting_(std::exchange(other.accounting_, nullptr)),
      tier_(other.tier_),
      kind_(other.kind_),
      bytes_(other.bytes_) {}

ScopedUse& ScopedUse::operator=(ScopedUse&& other) noexcept {
  if (this != &other) {
    reset();
    accounting_ = std::exchange(other.accounting_, nullptr);
    tier_ = other.tier_;
    kind_ = other.kind_;
    bytes_ = other.bytes_;
  }
  return *this;
}

void ScopedUse::reset() {
  if (accounting_ != nullptr) accounting_->unuse(tier_, kind_, bytes_);
  accounting_ = nullptr;
}

// --- /proc/self/status -------------------------------------------------------------------------

namespace {

// Value in kB of the line "Key:   12345 kB" inside text, in bytes; false if absent.
bool find_kb(const char* text, const char* key, uint64_t* out) {
  const size_t key_length = std::strlen(key);
  for (const char* line = text; line != nullptr && *line != '\0';) {
    if (std::strncmp(line, key, key_length) == 0 && line[key_length] == ':') {
      const char* p = line + key_length + 1;
      while (*p == ' ' || *p == '\t') ++p;
      uint64_t value = 0;
      while (*p >= '0' && *p <= '9') value = value * 10 + static_cast<uint64_t>(*p++ - '0');
      *out = value * 1024;
      return true;
    }
    line = std::strchr(line, '\n');
    if (line != nullptr) ++line;
  }
  return false;
}

}  // namespace

Result<ProcMemory> read_proc_memory() {
  // /proc/self/status is about 1.5 KiB; a fixed buffer keeps the sampler allocation-free.
  char text[8192];
  UniqueFd fd(::open("/proc/self/status", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return errno_status(STRATA_E_IO, "opening /proc/self/status", errno);
  size_t length = 0;
  while (length < sizeof text - 1) {
    const ssize_t n = ::read(fd.get(), text + length, sizeof text - 1 - length);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(STRATA_E_IO, "reading /proc/self/status", errno);
    if (n == 0) break;
    length += static_cast<size_t>(n);
  }
  text[length] = '\0';
  ProcMemory m;
  const bool ok = find_kb(text, "VmRSS", &m.vm_rss) && find_kb(text, "VmHWM", &m.vm_hwm) &&
                  find_kb(text, "RssAnon", &m.rss_anon) && find_kb(text, "RssFile", &m.rss_file) &&
                  find_kb(text, "RssShmem", &m.rss_shmem) && find_kb(text, "VmLck", &m.vm_lck);
  if (!ok) return unsupported("/proc/self/status lacks the Vm*/Rss* memory lines");
  return m;
}

uint64_t host_bytes_excluding(const ProcMemory& memory, const Device* device) {
  const uint64_t device_shmem = device != nullptr ? device->host_resident_bytes() : 0;
  // The two numbers are read a moment apart, so the device may have grown in between.
  const uint64_t other_shmem =
      memory.rss_shmem > device_shmem ? memory.rss_shmem - device_shmem : 0;
  return memory.rss_anon + memory.rss_file + other_shmem;
}

HostMemorySampler::HostMemorySampler(const HostMemorySamplerOptions& options) : options_(options) {
  sample_now();
  thread_ = std::thread([this] { run(); });
}

HostMemorySampler::~HostMemorySampler() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void HostMemorySampler::sample_now() {
  Result<ProcMemory> memory = read_proc_memory();
  if (!memory.is_ok()) return;  // no /proc: the peak stays 0, which readers see as "unknown"
  raise_peak(peak_, host_bytes_excluding(*memory, options_.excluded_device));
  samples_.fetch_add(1, std::memory_order_relaxed);
}

void HostMemorySampler::reset_peak() {
  peak_.store(0, std::memory_order_relaxed);
  sample_now();
}

void HostMemorySampler::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    lock.unlock();
    sample_now();
    lock.lock();
    wake_.wait_for(lock, options_.interval, [this] { return stop_; });
  }
}

// --- strata_stats ------------------------------------------------------------------------------

namespace {

void fill_tier(const Accounting& accounting, Tier tier, strata_tier_stats* out) {
  const TierCounters c = accounting.tier(tier);
  *out = strata_tier_stats{};
  out->reserved_bytes = c.reserved_bytes;
  out->in_use_bytes = c.in_use_bytes;
  out->peak_reserved_bytes = c.peak_reserved_bytes;
  out->peak_in_use_bytes = c.peak_in_use_bytes;
  static_assert(kTensorKindCount <= STRATA_STATS_KIND_SLOTS);
  for (int k = 0; k < kTensorKindCount; ++k) {
    const KindCounters kc = accounting.kind(tier, static_cast<TensorKind>(k));
    out->kinds[k].in_use_bytes = kc.in_use_bytes;
    out->kinds[k].peak_in_use_bytes = kc.peak_in_use_bytes;
  }
}

}  // namespace

int fill_stats(const Accounting& accounting, const Device* device, HostMemorySampler* sampler,
               strata_stats* out) {
  // The first published strata_stats ends with emulated_device_resident_bytes; later versions
  // only append, so any struct at least that large is one we know how to fill.
  constexpr size_t kFirstVersionSize =
      offsetof(strata_stats, emulated_device_resident_bytes) + sizeof(uint64_t);
  if (out == nullptr || out->struct_size < kFirstVersionSize) return STRATA_E_INVALID;

  strata_stats s{};
  s.struct_size = out->struct_size;
  fill_tier(accounting, Tier::kHost, &s.host);
  fill_tier(accounting, Tier::kPinned, &s.pinned);
  fill_tier(accounting, Tier::kDevice, &s.device);
  fill_tier(accounting, Tier::kNvme, &s.nvme);
  s.nvme_bytes_read = accounting.nvme_bytes_read();
  s.nvme_bytes_written = accounting.nvme_bytes_written();

  if (sampler != nullptr) sampler->sample_now();
  if (Result<ProcMemory> memory = read_proc_memory(); memory.is_ok()) {
    s.os_rss_bytes = memory->vm_rss;
    s.os_peak_rss_bytes = memory->vm_hwm;
    s.os_host_bytes_excluding_emulated_device = host_bytes_excluding(*memory, device);
  }
  s.os_peak_host_bytes_excluding_emulated_device =
      sampler != nullptr ? std::max(sampler->peak_host_bytes_excluding_device(),
                                    s.os_host_bytes_excluding_emulated_device)
                         : s.os_host_bytes_excluding_emulated_device;
  s.emulated_device_resident_bytes = device != nullptr ? device->host_resident_bytes() : 0;

  std::memcpy(out, &s, std::min(out->struct_size, sizeof s));
  return STRATA_OK;
}

}  // namespace strata::memory
