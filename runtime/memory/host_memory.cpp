#include "memory/host_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/unique_fd.h"
#include "memory/device.h"

namespace strata::memory {
namespace {

void raise_peak(std::atomic<uint64_t>& peak, uint64_t value) {
  uint64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

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

}  // namespace strata::memory
