// ExtentStore: the NVMe tier as a set of checksummed extents inside one BackingDevice.
//
// The scheduler allocates an extent per spilled tensor, writes it, reads it back later and frees
// it. The store owns the space (ExtentAllocator) and what is known about each extent's content;
// the IoEngine it is given does the I/O. Data never goes through the store's own buffers: the
// caller's buffer goes straight to the engine (and, with O_DIRECT, to the drive).
//
// Content rules
//  - A write records the logical length and, with verify_checksums, the XXH3-64 of the logical
//    bytes - but only once the engine reports that the whole write succeeded. Until then, and
//    forever if it fails, the extent keeps its previous record.
//  - Every read of a checksummed extent verifies it: a mismatch is STRATA_E_CORRUPT naming the
//    extent, its offset and both hashes. Reading an extent that was never written successfully is
//    STRATA_E_STATE.
//  - A failed write may have overwritten part of the previous content on the device. With
//    checksums, the previous record stays, so a later read returns the previous content if it is
//    still intact and STRATA_E_CORRUPT if not - never wrong bytes. Without checksums that cannot be
//    told, so the extent becomes "failed" and reads are STRATA_E_STATE until a write succeeds.
//    Callers that must keep the last good copy write a new extent and free the old one after.
//  - One write, or any number of reads, may be in flight on an extent at a time; anything else
//    (a read during a write, two writes, a free with I/O in flight) is STRATA_E_STATE. Extent
//    handles carry an id that is never reused, so a freed handle is refused, even after its space
//    was handed out again.
//
// Buffers: aligned to memory_alignment(), and at least align_up(bytes, alignment()) long; the
// caller owns the padding after the logical bytes (it is written to the device but is not part
// of the content or the checksum).
//
// Thread rules: every member may be called from any thread concurrently. A mutex guards the
// allocator and the extent table; hashing and I/O run outside it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/status.h"
#include "io/io_engine.h"
#include "storage/backing_device.h"
#include "storage/extent_allocator.h"
#include "storage/swap_store.h"

namespace strata::storage {

struct ExtentStoreOptions {
  bool verify_checksums = true;
  uint64_t max_extents = ExtentAllocator::kDefaultMaxExtents;
};

class ExtentStore final : public SwapStore {
 public:
  // Registers the device with the engine. The engine must outlive the store.
  static Result<std::unique_ptr<ExtentStore>> open(BackingDevice device, io::IoEngine& engine,
                                                   const ExtentStoreOptions& options = {});
  ExtentStore(const ExtentStore&) = delete;
  ExtentStore& operator=(const ExtentStore&) = delete;
  // Waits for I/O in flight, then closes the device (removing the swap file unless kept).
  ~ExtentStore() override;
  // The same, reporting a failure to remove the swap file. The store must not be used after.
  Status close() override;

  // Reserves space for `bytes` (rounded up to alignment()). STRATA_E_NOSPACE says whether the
  // tier is full or only fragmented; STRATA_E_LIMIT at max_extents.
  Result<Extent> allocate(uint64_t bytes) override;
  // Returns the extent's space. STRATA_E_STATE for an unknown or already freed handle, or when
  // I/O on it is in flight.
  Status free(const Extent& extent) override;

  // Writes bytes (1 .. extent.capacity) from buffer to the extent. buffer_index: a buffer the
  // caller registered with the engine that holds the whole transfer, or -1.
  // Returns an error without calling on_complete when the request is refused up front.
  Status write_async(const Extent& extent, const void* buffer, uint64_t bytes, ExtentIo* io,
                     int32_t buffer_index = -1) override;
  // Reads the extent's recorded content into buffer, which holds buffer_bytes (at least the
  // content rounded up to alignment(); extent.capacity always suffices). io->bytes is the
  // logical length read.
  Status read_async(const Extent& extent, void* buffer, uint64_t buffer_bytes, ExtentIo* io,
                    int32_t buffer_index = -1) override;

  // Blocking forms of the above.
  Status write(const Extent& extent, const void* buffer, uint64_t bytes, int32_t buffer_index = -1);
  Result<uint64_t> read(const Extent& extent, void* buffer, uint64_t buffer_bytes,
                        int32_t buffer_index = -1);

  // The logical length of the extent's content; STRATA_E_STATE when it has none.
  Result<uint64_t> content_bytes(const Extent& extent) const;

  uint64_t alignment() const override { return device_.alignment(); }
  uint64_t memory_alignment() const override { return device_.memory_alignment(); }
  uint64_t capacity() const override { return device_.capacity(); }
  bool verify_checksums() const { return options_.verify_checksums; }
  const BackingDevice& device() const { return device_; }
  ExtentStoreStats stats() const override;

 private:
  enum class Content : uint8_t {
    kNone,     // never written successfully
    kWritten,  // length and checksum describe what is on the device
    kFailed,   // the last write failed and there is no checksum to tell what survived
  };
  struct Record {
    uint64_t offset = 0;
    uint64_t capacity = 0;
    uint64_t length = 0;
    uint64_t checksum = 0;
    uint32_t readers = 0;  // reads in flight
    bool writing = false;  // a write in flight
    bool last_write_failed = false;
    Content content = Content::kNone;
  };

  ExtentStore(BackingDevice device, io::IoEngine& engine, uint32_t file, ExtentAllocator allocator,
              const ExtentStoreOptions& options);

  // Requires mutex_. Finds the record a handle names, or says why it names none.
  Result<Record*> find_locked(const Extent& extent);
  Result<const Record*> find_locked(const Extent& extent) const;
  Status check_buffer(const void* buffer, const char* what) const;

  static void on_write_done(io::IoRequest* request, void* context);
  static void on_read_done(io::IoRequest* request, void* context);
  void finish_locked();  // one I/O fewer in flight

  BackingDevice device_;
  io::IoEngine& engine_;
  const uint32_t file_;
  const ExtentStoreOptions options_;

  mutable std::mutex mutex_;
  std::condition_variable idle_;  // signalled when in_flight_ drops to 0
  ExtentAllocator allocator_;
  std::unordered_map<uint64_t, Record> records_;
  uint64_t next_id_ = 1;
  uint64_t in_flight_ = 0;
  ExtentStoreStats stats_;
};

}  // namespace strata::storage
