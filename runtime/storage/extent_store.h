// ExtentStore: the NVMe tier as a set of checksummed extents inside one BackingDevice.
//
// The scheduler allocates an extent per spilled tensor, writes it, reads it back later and frees
// it. The store owns the space (ExtentAllocator) and what is known about each extent's content;
// the IoEngine it is given does the I/O. Data never goes through the store's own buffers: the
// caller's buffer goes straight to the engine (and, with O_DIRECT, to the drive).
//
// Content rules
//  - An extent's content is a logical length and a sequence of blocks of block_bytes()
//    (ExtentStoreOptions::block_bytes, default 1 MiB), the last of which may be partial. Each
//    block has its own record: a state and, with verify_checksums, the XXH3-64 of its logical
//    bytes.
//  - A write is write_async (the whole content: [0, bytes) with content_bytes = bytes) or
//    write_range_async ([offset, offset + bytes) with content_bytes). Only once the engine
//    reports that the whole request succeeded does each block it covers record its new hash and
//    the length become the write's content_bytes. Until then, and forever if it fails, its
//    blocks keep their previous records (without checksums, see failed writes below) and the
//    length stays.
//  - A successful write that changes the length drops the record of every block it did not
//    cover whose logical bytes the new length changes: blocks past a shorter length are no
//    longer content, and an old partial last block must be written again once the length grows
//    past it or shrinks into it.
//  - A read is read_async (the whole recorded content) or read_range_async ([offset, offset +
//    bytes)). It verifies every block it covers before it reports success: a mismatch is
//    STRATA_E_CORRUPT naming the extent, the first mismatching block ([start, end) within the
//    extent's content) and both hashes; every mismatching block counts in checksum_failures.
//    Reading an extent no write has succeeded on, a block with no content (never written
//    successfully, or dropped by a new length) or a failed block (below) is STRATA_E_STATE.
//  - Ranged arguments: offset a multiple of block_bytes(); bytes >= 1 and a multiple of
//    block_bytes() unless the range ends at the content's end (a write's content_bytes, the
//    recorded length for a read); for a write offset + bytes <= content_bytes <= capacity, for a
//    read offset + bytes <= the recorded length. Anything else is STRATA_E_INVALID with the
//    numbers, before any I/O. A write's padding stays inside its last block, so it never
//    touches a block it does not cover.
//  - A failed write may have overwritten some of its blocks on the device. With checksums they
//    keep their previous records, so a later read returns a block's previous bytes if they are
//    still intact and STRATA_E_CORRUPT if not - never wrong bytes. Without checksums that cannot
//    be told, so every block it covered that held content becomes "failed" and reads of it are
//    STRATA_E_STATE until a write over it succeeds. Callers that must keep the last good copy
//    write a new extent and free the old one after.
//  - Any number of reads and writes may be in flight on an extent at once as long as no write's
//    blocks overlap the blocks of another request in flight (reads may share blocks); a request
//    that would overlap is STRATA_E_STATE naming both ranges. A write that changes the length
//    may drop blocks of a read in flight; that read still returns the bytes it verified, as if
//    it had completed before the write. A free with any I/O in flight is STRATA_E_STATE. Extent
//    handles carry an id that is never reused, so a freed handle is refused, even after its
//    space was handed out again.
//  - Block records are allocated with the extent, never on the I/O path: 17 bytes per block
//    with checksums (state, recorded hash, the hash of a write in flight), 1 without - 17 MiB
//    (1 MiB) of host memory per TiB of extents with 1 MiB blocks (extent_content.h).
//
// Buffers: aligned to memory_alignment(), and at least align_up(bytes, alignment()) long; the
// caller owns the padding after the logical bytes (it is written to the device but is not part
// of the content or the checksum).
//
// Thread rules: every member may be called from any thread concurrently. A mutex guards the
// allocator and the extent table; hashing and I/O run outside it. A write's blocks are hashed on
// the submitting thread before it is issued, a read's on the engine thread that completes it,
// before it is reported.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/status.h"
#include "io/io_engine.h"
#include "storage/backing_device.h"
#include "storage/content_thread.h"
#include "storage/extent_allocator.h"
#include "storage/extent_content.h"
#include "storage/swap_store.h"

namespace strata::storage {

struct ExtentStoreOptions {
  bool verify_checksums = true;
  uint64_t max_extents = ExtentAllocator::kDefaultMaxExtents;
  // The checksum block: a power of two, at least the device's alignment (else open() is
  // STRATA_E_INVALID). Smaller blocks let ranged I/O start at finer offsets and cost more host
  // memory (17 bytes each with checksums); 1 MiB matches the chunks the scheduler streams.
  uint64_t block_bytes = uint64_t{1} << 20;
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

  // Reserves space for `bytes` (rounded up to alignment()) and its block records.
  // STRATA_E_NOSPACE says whether the tier is full or only fragmented; STRATA_E_LIMIT at
  // max_extents; STRATA_E_NOMEM when host memory for the records cannot be had.
  Result<Extent> allocate(uint64_t bytes) override;
  // Returns the extent's space. STRATA_E_STATE for an unknown or already freed handle, or when
  // I/O on it is in flight.
  Status free(const Extent& extent) override;

  // Writes bytes (1 .. extent.capacity) from buffer to the extent as its whole content.
  // buffer_index: a buffer the caller registered with the engine that holds the whole transfer,
  // or -1. Every *_async call returns an error without calling on_complete when the request is
  // refused up front.
  Status write_async(const Extent& extent, const void* buffer, uint64_t bytes, ExtentIo* io,
                     int32_t buffer_index = -1) override;
  // Reads the extent's whole recorded content into buffer, which holds buffer_bytes (at least
  // the content rounded up to alignment(); extent.capacity always suffices). io->bytes is the
  // logical length read.
  Status read_async(const Extent& extent, void* buffer, uint64_t buffer_bytes, ExtentIo* io,
                    int32_t buffer_index = -1) override;
  // Writes [offset, offset + bytes) of the content and makes it content_bytes long once that
  // succeeds; reads [offset, offset + bytes) of the recorded content. The arguments' rules are
  // the "Ranged arguments" above; buffers hold align_up(bytes, alignment()).
  Status write_range_async(const Extent& extent, uint64_t offset, const void* buffer,
                           uint64_t bytes, uint64_t content_bytes, ExtentIo* io,
                           int32_t buffer_index = -1) override;
  Status read_range_async(const Extent& extent, uint64_t offset, void* buffer, uint64_t bytes,
                          ExtentIo* io, int32_t buffer_index = -1) override;

  // Blocking forms of the above.
  Status write(const Extent& extent, const void* buffer, uint64_t bytes, int32_t buffer_index = -1);
  Result<uint64_t> read(const Extent& extent, void* buffer, uint64_t buffer_bytes,
                        int32_t buffer_index = -1);
  Status write_range(const Extent& extent, uint64_t offset, const void* buffer, uint64_t bytes,
                     uint64_t content_bytes, int32_t buffer_index = -1);
  Result<uint64_t> read_range(const Extent& extent, uint64_t offset, void* buffer, uint64_t bytes,
                              int32_t buffer_index = -1);

  // The logical length of the extent's content, as the last successful write set it - what a
  // whole read returns; STRATA_E_STATE when a whole read would be refused for want of content
  // (no write has succeeded, or a block of the content was never written or is failed).
  Result<uint64_t> content_bytes(const Extent& extent) const;

  uint64_t alignment() const override { return device_.alignment(); }
  uint64_t memory_alignment() const override { return device_.memory_alignment(); }
  uint64_t capacity() const override { return device_.capacity(); }
  uint64_t block_bytes() const override { return options_.block_bytes; }
  bool verify_checksums() const { return options_.verify_checksums; }
  const BackingDevice& device() const { return device_; }
  ExtentStoreStats stats() const override;

 private:
  struct Record {
    uint64_t offset = 0;
    uint64_t capacity = 0;
    ExtentContent content;  // its blocks and its requests in flight
  };

  ExtentStore(BackingDevice device, io::IoEngine& engine, uint32_t file, ExtentAllocator allocator,
              const ExtentStoreOptions& options);

  // Requires mutex_. Finds the record a handle names, or says why it names none.
  Result<Record*> find_locked(const Extent& extent);
  Result<const Record*> find_locked(const Extent& extent) const;
  Status check_request(const ExtentIo* io, const void* buffer, const char* what) const;
  // Admit under the mutex, then issue(). `whole` marks the whole-content calls; a whole read
  // takes the recorded length and checks buffer_bytes against it.
  Status submit_write(const Extent& extent, uint64_t offset, const void* buffer, uint64_t bytes,
                      uint64_t content_bytes, ExtentIo* io, int32_t buffer_index, bool whole);
  Status submit_read(const Extent& extent, uint64_t offset, void* buffer, uint64_t bytes,
                     uint64_t buffer_bytes, ExtentIo* io, int32_t buffer_index, bool whole);
  // Fills an admitted request's engine request; submit_prepared() hands it to the engine and
  // takes it back out of flight if the engine refuses.
  void prepare(const Extent& extent, ExtentIo* io, void* buffer, int32_t buffer_index);
  Status submit_prepared(ExtentIo* io);
  // A write's block hashes into its pending slots (the write's own once admitted).
  void hash_write(ExtentIo* io) const;
  // The content thread's work: a write is hashed and submitted, a read verified and finished.
  static void on_content_thread(ExtentIo* io, void* context);

  static void on_write_done(io::IoRequest* request, void* context);
  static void on_read_done(io::IoRequest* request, void* context);
  // Checks a finished read's blocks against their recorded hashes (with checksums), settles its
  // record and calls on_complete: on the content thread, or the engine's without one.
  static void finish_read(ExtentIo* io, void* context);
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
  // With checksums: where writes are hashed and reads verified (content_thread.h). Last, so that
  // it is stopped first, after the destructor's close() has waited for all I/O in flight.
  std::unique_ptr<ContentThread> content_thread_;
};

}  // namespace strata::storage
