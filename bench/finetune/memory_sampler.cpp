#include "finetune/memory_sampler.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "memory/host_memory.h"

namespace strata::bench::finetune {
namespace {

// Explicit limit: a sample every 5 ms for the longest allowed run stays well below this.
constexpr size_t kMaxSeries = 1u << 20;

}  // namespace

int find_emulated_device_fd() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    char link[256];
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    const ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
    if (n <= 0) continue;
    link[n] = '\0';
    if (std::strncmp(link, "/memfd:strata-emulated-device", 29) == 0) {
      found = static_cast<int>(fd);
      break;
    }
  }
  ::closedir(dir);
  return found;
}

MemorySampler::MemorySampler(
    std::chrono::microseconds interval, uint32_t series_every,
    std::chrono::milliseconds report_interval,
    std::function<void(const MemoryReading&, const MemoryPeaks&)> on_sample)
    : interval_(interval),
      series_every_(std::max<uint32_t>(series_every, 1)),
      report_interval_(report_interval),
      on_sample_(std::move(on_sample)) {
  series_.reserve(4096);
  sample_now();
  thread_ = std::thread([this] { run(); });
}

MemorySampler::~MemorySampler() {
  stop();
}

void MemorySampler::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MemorySampler::set_unlocked_pinned(uint64_t bytes) {
  unlocked_pinned_.store(bytes, std::memory_order_relaxed);
  sample_now();
}

Result<MemoryReading> MemorySampler::read() const {
  STRATA_ASSIGN_OR_RETURN(memory::ProcMemory proc, memory::read_proc_memory());
  MemoryReading r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
  const int fd = device_fd_.load(std::memory_order_relaxed);
  if (fd >= 0) {
    struct stat st {};
    // A memfd's block count is exactly the shmem pages it holds.
    if (::fstat(fd, &st) == 0) r.device = static_cast<uint64_t>(st.st_blocks) * 512;
  }
  const uint64_t other_shmem = proc.rss_shmem > r.device ? proc.rss_shmem - r.device : 0;
  r.host = proc.rss_anon + proc.rss_file + other_shmem;
  r.pinned = proc.vm_lck + unlocked_pinned_.load(std::memory_order_relaxed);
  return r;
}

void MemorySampler::sample_now(bool report) {
  Result<MemoryReading> reading = read();
  if (!reading) return;  // no /proc: peaks stay 0, which the report shows as unknown
  const MemoryReading& r = *reading;
  MemoryPeaks peaks;
  {
    std::lock_guard lock(mutex_);
    for (MemoryPeaks* p : {&peaks_, &window_}) {
      if (r.host > p->host) {
        const char* moment = moment_.load(std::memory_order_relaxed);
        p->host_moment = moment != nullptr ? moment : "";
        p->host = r.host;
      }
      p->pinned = std::max(p->pinned, r.pinned);
      p->device = std::max(p->device, r.device);
    }
    last_ = r;
    if (samples_++ % series_every_ == 0 && series_.size() < kMaxSeries) series_.push_back(r);
    const auto now = std::chrono::steady_clock::now();
    if (report || now - last_report_ >= report_interval_) {
      last_report_ = now;
      report = true;
      peaks = peaks_;
    }
  }
  if (report && on_sample_) on_sample_(r, peaks);
}

void MemorySampler::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    lock.unlock();
    sample_now();
    lock.lock();
    wake_.wait_for(lock, interval_, [this] { return stop_; });
  }
}

MemoryPeaks MemorySampler::peaks() const {
  std::lock_guard lock(mutex_);
  return peaks_;
}

void MemorySampler::start_window() {
  {
    std::lock_guard lock(mutex_);
    window_ = MemoryPeaks{};
  }
  sample_now();
}

MemoryPeaks MemorySampler::window_peaks() const {
  std::lock_guard lock(mutex_);
  return window_;
}

MemoryReading MemorySampler::last() const {
  std::lock_guard lock(mutex_);
  return last_;
}

std::vector<MemoryReading> MemorySampler::series(size_t max_points) const {
  std::lock_guard lock(mutex_);
  if (max_points == 0 || series_.size() <= max_points) return series_;
  // Max-pooling keeps every spike visible in a plot, which averaging would flatten.
  const size_t per = (series_.size() + max_points - 1) / max_points;
  std::vector<MemoryReading> out;
  out.reserve(max_points);
  for (size_t i = 0; i < series_.size(); i += per) {
    MemoryReading m = series_[i];
    for (size_t j = i + 1; j < std::min(series_.size(), i + per); ++j) {
      m.host = std::max(m.host, series_[j].host);
      m.pinned = std::max(m.pinned, series_[j].pinned);
      m.device = std::max(m.device, series_[j].device);
    }
    out.push_back(m);
  }
  return out;
}

}  // namespace strata::bench::finetune
