#include "sched/fake_backend.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

namespace strata::sched::testing {

FakeBackend::FakeBackend(uint32_t max_delay_us) : max_delay_us_(max_delay_us) {
  worker_ = std::thread([this] { run(); });
}

FakeBackend::~FakeBackend() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    paused_ = false;
  }
  wake_.notify_all();
  worker_.join();
}

Result<Buffer> FakeBackend::allocate(Tier tier, uint64_t bytes, TensorKind /*kind*/) {
  if (tier == Tier::kNvme || bytes == 0) return invalid_argument("fake allocate: bad request");
  {
    std::lock_guard lock(mu_);
    uint32_t& failures = allocation_failures_[static_cast<int>(tier)];
    if (failures > 0) {
      --failures;
      return Status::error(STRATA_E_NOMEM, "fake: no memory (injected)");
    }
  }
  if (tier == Tier::kDevice && device_ranges_) {
    std::lock_guard lock(mu_);
    const std::optional<uint64_t> offset = device_ranges_->allocate(bytes);
    if (!offset) {
      return Status::error(STRATA_E_DEVICE_BUDGET,
                           "fake slab: no free range of " + std::to_string(bytes) + " B (largest " +
                               std::to_string(device_ranges_->largest_free_range()) + " B)");
    }
    std::byte* data = device_slab_.get() + *offset;
    std::memset(data, 0xCD, bytes);
    ++live_buffers_;
    return Buffer{data, bytes, *offset};
  }
  void* data = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (data == nullptr) return Status::error(STRATA_E_NOMEM, "fake allocate");
  std::memset(data, 0xCD, bytes);  // poison: never what a test wrote
  ++live_buffers_;
  return Buffer{data, bytes, reinterpret_cast<uint64_t>(data)};
}

void FakeBackend::free(Tier tier, const Buffer& buffer) {
  if (tier == Tier::kDevice && device_ranges_) {
    std::lock_guard lock(mu_);
    const bool freed = device_ranges_->free(buffer.token).has_value();
    EXPECT_TRUE(freed) << "fake slab: free of " << buffer.token << " that is not an allocation";
  } else {
    std::free(buffer.data);
  }
  --live_buffers_;
}

void FakeBackend::use_device_slab(uint64_t capacity) {
  std::lock_guard lock(mu_);
  device_slab_ = std::make_unique<std::byte[]>(capacity);
  device_ranges_ = std::make_unique<memory::RangeAllocator>(capacity, 256, 1024);
}

uint64_t FakeBackend::largest_free_device_range() const {
  std::lock_guard lock(mu_);
  return device_ranges_ ? device_ranges_->largest_free_range() : 0;
}

void FakeBackend::fail_next_allocations(Tier tier, uint32_t count) {
  std::lock_guard lock(mu_);
  allocation_failures_[static_cast<int>(tier)] = count;
}

Result<Extent> FakeBackend::allocate_extent(uint64_t bytes) {
  std::lock_guard lock(mu_);
  if (extent_failures_ > 0) {
    --extent_failures_;
    return Status::error(STRATA_E_NOSPACE, "fake: the NVMe tier is full (injected)");
  }
  const uint64_t token = next_token_++;
  extents_[token].assign(bytes, 0xEE);
  return Extent{token, 0, bytes};
}

void FakeBackend::free_extent(const Extent& extent) {
  std::lock_guard lock(mu_);
  extents_.erase(extent.token);
}

uint64_t FakeBackend::live_extents() const {
  std::lock_guard lock(mu_);
  return extents_.size();
}

Status FakeBackend::read(const Extent& from, const Buffer& to_pinned, uint64_t bytes,
                         Completion done) {
  return enqueue(
      {Link::kNvmeRead, nullptr, static_cast<uint8_t*>(to_pinned.data), from.token, bytes, done});
}

Status FakeBackend::write(const Buffer& from_pinned, const Extent& to, uint64_t bytes,
                          Completion done) {
  return enqueue({Link::kNvmeWrite, static_cast<const uint8_t*>(from_pinned.data), nullptr,
                  to.token, bytes, done});
}

Status FakeBackend::copy_to_device(const Buffer& from_pinned, const Buffer& to_device,
                                   uint64_t bytes, Completion done) {
  return enqueue({Link::kHostToDevice, static_cast<const uint8_t*>(from_pinned.data),
                  static_cast<uint8_t*>(to_device.data), 0, bytes, done});
}

Status FakeBackend::copy_to_host(const Buffer& from_device, const Buffer& to_pinned, uint64_t bytes,
                                 Completion done) {
  return enqueue({Link::kDeviceToHost, static_cast<const uint8_t*>(from_device.data),
                  static_cast<uint8_t*>(to_pinned.data), 0, bytes, done});
}

Status FakeBackend::copy_range(Link link, const Buffer& from, uint64_t from_offset,
                               const Buffer& to, uint64_t to_offset, uint64_t bytes,
                               Completion done) {
  if (from_offset + bytes > from.bytes || to_offset + bytes > to.bytes) {
    return invalid_argument("fake copy_range: outside a buffer");
  }
  return enqueue({link, static_cast<const uint8_t*>(from.data) + from_offset,
                  static_cast<uint8_t*>(to.data) + to_offset, 0, bytes, done});
}

Status FakeBackend::stream_to_device(const Extent& from, const Buffer& to_device, uint64_t bytes,
                                     Completion done) {
  return enqueue({Link::kNvmeRead, nullptr, static_cast<uint8_t*>(to_device.data), from.token,
                  bytes, done, /*streamed=*/true});
}

Status FakeBackend::stream_to_nvme(const Buffer& from_device, const Extent& to, uint64_t bytes,
                                   Completion done) {
  return enqueue({Link::kNvmeWrite, static_cast<const uint8_t*>(from_device.data), nullptr,
                  to.token, bytes, done, /*streamed=*/true});
}

Status FakeBackend::enqueue(Job job) {
  {
    std::lock_guard lock(mu_);
    if ((job.link == Link::kNvmeRead || job.link == Link::kNvmeWrite) &&
        (extents_.count(job.extent) == 0 || extents_[job.extent].size() < job.bytes)) {
      return invalid_argument("fake: transfer to or from an unknown or short extent");
    }
    jobs_.push_back(job);
  }
  wake_.notify_one();
  return Status::ok();
}

LinkCounters FakeBackend::link_counters(Link link) const {
  std::lock_guard lock(mu_);
  return counters_[static_cast<int>(link)];
}

void FakeBackend::fail_next(Link link, int code, uint32_t count) {
  std::lock_guard lock(mu_);
  fail_count_[static_cast<int>(link)] = count;
  fail_code_[static_cast<int>(link)] = code;
}

void FakeBackend::fail_next_extent_allocations(uint32_t count) {
  std::lock_guard lock(mu_);
  extent_failures_ = count;
}

void FakeBackend::pause(bool paused) {
  {
    std::lock_guard lock(mu_);
    paused_ = paused;
  }
  wake_.notify_all();
}

void FakeBackend::run() {
  std::minstd_rand random(7);
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [this] { return stop_ || (!paused_ && !jobs_.empty()); });
      if (jobs_.empty()) return;  // stopping with nothing queued
      job = jobs_.front();
      jobs_.pop_front();
    }
    if (max_delay_us_ > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(random() % (max_delay_us_ + 1)));
    }
    Status status;
    {
      std::lock_guard lock(mu_);
      const int l = static_cast<int>(job.link);
      const bool fail = fail_count_[l] > 0;
      if (fail) {
        --fail_count_[l];
        status = Status::error(fail_code_[l],
                               std::string("fake: injected failure on ") + to_string(job.link));
        ++failures_;
      }
      switch (job.link) {
        case Link::kNvmeRead:
          if (fail) {
            std::memset(job.destination, 0x5A, job.bytes);  // a torn read
          } else {
            std::memcpy(job.destination, extents_[job.extent].data(), job.bytes);
          }
          break;
        case Link::kNvmeWrite:
          if (fail) {
            std::memset(extents_[job.extent].data(), 0xA5, job.bytes);  // a torn write
          } else {
            std::memcpy(extents_[job.extent].data(), job.source, job.bytes);
          }
          break;
        case Link::kHostToDevice:
        case Link::kDeviceToHost:
          if (fail) {
            std::memset(job.destination, 0x3C, job.bytes);
          } else {
            std::memcpy(job.destination, job.source, job.bytes);
          }
          break;
      }
      if (!fail) {
        counters_[l].bytes += job.bytes;
        ++counters_[l].transfers;
        if (job.streamed) {
          const Link device =
              job.link == Link::kNvmeRead ? Link::kHostToDevice : Link::kDeviceToHost;
          counters_[static_cast<int>(device)].bytes += job.bytes;
          ++counters_[static_cast<int>(device)].transfers;
          ++streams_;
        }
      }
    }
    post_completion(job.done, std::move(status));
  }
}

}  // namespace strata::sched::testing
