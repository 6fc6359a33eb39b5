// SwapStore: the NVMe tier as the runtime sees it - space for a tensor's bytes that it
// allocates, writes, reads back and frees, asynchronously, in units of Extent.
//
// Two layouts implement it:
//  - ExtentStore (the default): Strata manages the space inside one preallocated swap file or a
//    raw block device itself, through the io_uring engine, checksummed.
//  - FilePerTensorStore: one file per tensor on the file system, opened, stat'ed and closed
//    around every request - the way DeepSpeed's ZeRO-Infinity swaps (its aio swapper). It exists
//    so that the zero-infinity baseline of `strata bench finetune` pays the costs the real one
//    does; Strata itself never uses it.
//
// The content and concurrency rules are ExtentStore's (extent_store.h): a write records content
// only once it has fully succeeded; one write or any number of reads may be in flight on an
// extent; a freed or unknown handle is STRATA_E_STATE. Buffers are aligned to memory_alignment()
// and at least align_up(bytes, alignment()) long.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "io/io_engine.h"
#include "storage/extent_allocator.h"

namespace strata::storage {

class SwapStore;

// A handle to allocated space. Plain data: copy it freely; the store validates it on each call.
struct Extent {
  uint64_t id = 0;        // unique within the store, never reused; 0 is no extent
  uint64_t offset = 0;    // byte offset in the backing device
  uint64_t capacity = 0;  // bytes reserved: the allocated size rounded up to alignment()
};

// What a store has done, for stats and benchmarks.
struct ExtentStoreStats {
  uint64_t writes = 0;         // successful writes
  uint64_t reads = 0;          // successful (and verified) reads
  uint64_t bytes_written = 0;  // logical bytes of successful writes
  uint64_t bytes_read = 0;     // logical bytes of successful reads
  uint64_t write_errors = 0;
  uint64_t read_errors = 0;        // I/O errors and checksum mismatches
  uint64_t checksum_failures = 0;  // reads whose content did not match its checksum
  uint64_t extents = 0;            // live extents
  AllocatorStats space;            // bytes used and free of the capacity
};

// The caller-owned state of one asynchronous write or read, so that keeping many in flight costs
// no allocation. Like io::IoRequest it must stay alive and untouched from the *_async call that
// accepted it until on_complete has run. It may be reused after that.
struct ExtentIo {
  // Set by the caller. Runs exactly once, on an I/O thread, when the *_async call returned OK;
  // must not block for long. The store does not touch `io` after calling it.
  void (*on_complete)(ExtentIo* io, void* context) = nullptr;
  void* context = nullptr;

  // Set by the store before on_complete: the outcome and the logical bytes written or read.
  Status status;
  uint64_t bytes = 0;

  // The store's own; do not touch.
  io::IoRequest request;
  SwapStore* store = nullptr;
  uint64_t extent_id = 0;
  uint64_t expected_checksum = 0;
};

class SwapStore {
 public:
  virtual ~SwapStore() = default;

  // Waits for I/O in flight, then releases the space (removing files unless kept). The store
  // must not be used after.
  virtual Status close() = 0;

  // Reserves space for `bytes` (rounded up to alignment()). STRATA_E_NOSPACE when the capacity
  // cannot hold it, with the numbers.
  virtual Result<Extent> allocate(uint64_t bytes) = 0;
  // Returns the extent's space. STRATA_E_STATE for an unknown or already freed handle, or when
  // I/O on it is in flight.
  virtual Status free(const Extent& extent) = 0;

  // Writes bytes (1 .. extent.capacity) from buffer to the extent. buffer_index: a buffer the
  // caller registered with the I/O engine that holds the whole transfer, or -1. Returns an error
  // without calling on_complete when the request is refused up front.
  virtual Status write_async(const Extent& extent, const void* buffer, uint64_t bytes, ExtentIo* io,
                             int32_t buffer_index = -1) = 0;
  // Reads the extent's recorded content into buffer, which holds buffer_bytes (at least the
  // content rounded up to alignment()). io->bytes is the logical length read.
  virtual Status read_async(const Extent& extent, void* buffer, uint64_t buffer_bytes, ExtentIo* io,
                            int32_t buffer_index = -1) = 0;

  virtual uint64_t alignment() const = 0;
  virtual uint64_t memory_alignment() const = 0;
  virtual uint64_t capacity() const = 0;
  virtual ExtentStoreStats stats() const = 0;
};

}  // namespace strata::storage
