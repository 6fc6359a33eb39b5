// SwapStore: the NVMe tier as the runtime sees it - space for a tensor's bytes that it
// allocates, writes, reads back and frees, asynchronously, in units of Extent, whole or a range
// of blocks at a time (so that a large tensor can stream through a few small staging buffers).
//
// Two layouts implement it:
//  - ExtentStore (the default): Strata manages the space inside one preallocated swap file or a
//    raw block device itself, through the io_uring engine, checksummed block by block.
//  - FilePerTensorStore: one file per tensor on the file system, opened, stat'ed and closed
//    around every request - the way DeepSpeed's ZeRO-Infinity swaps (its aio swapper). It exists
//    so that the zero-infinity baseline of `strata bench finetune` pays the costs the real one
//    does; Strata itself never uses it.
//
// The content and concurrency rules are ExtentStore's (extent_store.h), kept for both layouts by
// ExtentContent (extent_content.h): an extent's content is a sequence of blocks of
// block_bytes(); a write records the blocks it covers only once it has fully succeeded; any
// number of requests may be in flight on an extent as long as no write's blocks overlap another
// request's; a freed or unknown handle is STRATA_E_STATE. Buffers are aligned to
// memory_alignment() and at least align_up(bytes, alignment()) long.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "io/io_engine.h"
#include "storage/extent_allocator.h"

namespace strata::storage {

class SwapStore;
class ExtentContent;

// A handle to allocated space. Plain data: copy it freely; the store validates it on each call.
struct Extent {
  uint64_t id = 0;        // unique within the store, never reused; 0 is no extent
  uint64_t offset = 0;    // byte offset in the backing device
  uint64_t capacity = 0;  // bytes reserved: the allocated size rounded up to alignment()
};

// What a store has done, for stats and benchmarks.
// A ranged request counts as one read or write, with its logical bytes.
struct ExtentStoreStats {
  uint64_t writes = 0;         // successful writes
  uint64_t reads = 0;          // successful (and verified) reads
  uint64_t bytes_written = 0;  // logical bytes of successful writes
  uint64_t bytes_read = 0;     // logical bytes of successful reads
  uint64_t write_errors = 0;
  uint64_t read_errors = 0;  // reads that failed: I/O errors and checksum mismatches
  // Blocks whose bytes did not match their checksum: one failed read counts every block of its
  // range that mismatched, so this can exceed read_errors.
  uint64_t checksum_failures = 0;
  uint64_t extents = 0;  // live extents
  AllocatorStats space;  // bytes used and free of the capacity
};

// The caller-owned state of one asynchronous write or read, so that keeping many in flight costs
// no allocation. Like io::IoRequest it must stay alive and untouched from the *_async call that
// accepted it until on_complete has run. It may be reused after that.
struct ExtentIo {
  // Set by the caller. Runs exactly once, on one of the store's I/O threads (the engine's, or the
  // extent store's content thread), when the *_async call returned OK;
  // must not block for long. The store does not touch `io` after calling it.
  void (*on_complete)(ExtentIo* io, void* context) = nullptr;
  void* context = nullptr;

  // Set by the store before on_complete: the outcome and the logical bytes written or read.
  Status status;
  uint64_t bytes = 0;

  // The store's own; do not touch. The in-flight links chain the extent's requests in flight
  // through the requests themselves, so that checking a new request for overlap allocates nothing.
  io::IoRequest request;
  SwapStore* store = nullptr;
  uint64_t extent_id = 0;
  ExtentContent* content = nullptr;  // the extent's record: free refuses it while this is in flight
  uint64_t offset = 0;               // where the range starts in the extent's content
  uint64_t content_bytes = 0;        // a write's content length once it succeeds
  bool write = false;
  bool whole = false;  // a whole-content request (write_async / read_async), for its messages
  ExtentIo* next_in_flight = nullptr;
  ExtentIo* prev_in_flight = nullptr;
  ExtentIo* next_in_content_queue =
      nullptr;  // its place in the extent store's content-thread queue
};

class SwapStore {
 public:
  virtual ~SwapStore() = default;

  // Waits for I/O in flight, then releases the space (removing files unless kept). The store
  // must not be used after.
  virtual Status close() = 0;

  // Reserves space for `bytes` (rounded up to alignment()) and the records of its blocks.
  // STRATA_E_NOSPACE when the capacity cannot hold it, with the numbers; STRATA_E_NOMEM when
  // host memory for the records cannot be had.
  virtual Result<Extent> allocate(uint64_t bytes) = 0;
  // Returns the extent's space. STRATA_E_STATE for an unknown or already freed handle, or when
  // I/O on it is in flight.
  virtual Status free(const Extent& extent) = 0;

  // The checksum block, a power of two and a multiple of alignment(): ranged I/O starts at a
  // multiple of it and covers whole blocks, except a range that ends at the content's end.
  virtual uint64_t block_bytes() const = 0;

  // Writes bytes (1 .. extent.capacity) from buffer to the extent as its whole content: the
  // ranged write of [0, bytes) with content_bytes = bytes. buffer_index: a buffer the caller
  // registered with the I/O engine that holds the whole transfer, or -1. Every *_async call
  // returns an error without calling on_complete when the request is refused up front.
  virtual Status write_async(const Extent& extent, const void* buffer, uint64_t bytes, ExtentIo* io,
                             int32_t buffer_index = -1) = 0;
  // Reads the extent's whole recorded content into buffer, which holds buffer_bytes (at least
  // the content rounded up to alignment()). io->bytes is the logical length read.
  virtual Status read_async(const Extent& extent, void* buffer, uint64_t buffer_bytes, ExtentIo* io,
                            int32_t buffer_index = -1) = 0;

  // Writes [offset, offset + bytes) of the extent's content from buffer, and makes the content
  // content_bytes long once it succeeds: offset + bytes <= content_bytes <= extent.capacity,
  // offset a multiple of block_bytes(), bytes (>= 1) a multiple of block_bytes() unless
  // offset + bytes == content_bytes (the tail). The buffer holds align_up(bytes, alignment());
  // the padding after the logical bytes is the caller's.
  virtual Status write_range_async(const Extent& extent, uint64_t offset, const void* buffer,
                                   uint64_t bytes, uint64_t content_bytes, ExtentIo* io,
                                   int32_t buffer_index = -1) = 0;
  // Reads [offset, offset + bytes) of the recorded content into buffer, which holds
  // align_up(bytes, alignment()): offset a multiple of block_bytes(), bytes (>= 1) a multiple
  // of block_bytes() unless the range ends at the content's end. io->bytes = bytes.
  virtual Status read_range_async(const Extent& extent, uint64_t offset, void* buffer,
                                  uint64_t bytes, ExtentIo* io, int32_t buffer_index = -1) = 0;

  virtual uint64_t alignment() const = 0;
  virtual uint64_t memory_alignment() const = 0;
  virtual uint64_t capacity() const = 0;
  virtual ExtentStoreStats stats() const = 0;
};

}  // namespace strata::storage
