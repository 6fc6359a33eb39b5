// Anonymous memory for I/O buffers, 2 MiB aligned and, when asked, advised to transparent huge
// pages. Physically contiguous buffers matter: a device (or a hypervisor's virtio back end)
// walks one segment per contiguous run, and on a Firecracker guest 1 MiB requests into 4 KiB
// pages ran at 1.6-1.8 GB/s where huge pages got 9-11 (docs/tuning.md). Pages are faulted in by
// the owner's first write. Used where the memory is not pinned-pool memory but must be served
// like it: `strata bench io`'s buffers and the drive probe's (storage/drive_probe.h).
#pragma once

#include <sys/mman.h>

#include <cstdint>

#include "common/align.h"

namespace strata {

class HugePageMapping {
 public:
  static constexpr uint64_t kHugePage = uint64_t{2} << 20;

  // data() is null when the mapping failed (errno says why).
  HugePageMapping(uint64_t bytes, bool huge) : mapped_bytes_(bytes + kHugePage) {
    void* p =
        ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    mapped_ = static_cast<uint8_t*>(p);
    const auto address = reinterpret_cast<uintptr_t>(p);
    data_ = mapped_ + (align_up(address, kHugePage) - address);
    // Advisory: where THP is off, the buffers are simply made of 4 KiB pages.
    if (huge) (void)::madvise(data_, bytes, MADV_HUGEPAGE);
  }
  ~HugePageMapping() {
    if (mapped_ != nullptr) ::munmap(mapped_, mapped_bytes_);
  }
  HugePageMapping(const HugePageMapping&) = delete;
  HugePageMapping& operator=(const HugePageMapping&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint64_t mapped_bytes_;
  uint8_t* mapped_ = nullptr;
  uint8_t* data_ = nullptr;
};

}  // namespace strata
