// ExtentContent: what a store knows about one extent's content, block by block, and which of its
// requests are in flight - the content and concurrency rules of extent_store.h in one place, so
// that both layouts (ExtentStore, FilePerTensorStore) keep them alike.
//
// The content is `length` bytes cut into blocks of block_bytes (the last may be partial). Each
// block has a state byte and, with checksums, two XXH3-64 slots: the hash of its logical bytes as
// last written successfully, and the hash a write in flight over it will record if it succeeds.
// The second slot is what lets a write be hashed on the submitting thread, before it is issued,
// while the block keeps its previous record until the engine reports success (the io_uring engine
// completes everything on one thread; hashing writes there would halve its throughput).
//
// Memory: 1 byte per block without checksums, 17 with: for a TiB of extents with 1 MiB blocks,
// 1 MiB or 17 MiB of host memory (1,048,576 blocks), allocated when the extent is allocated and
// never on the I/O path.
//
// Requests in flight are chained through their own ExtentIo (its in-flight links), so admitting
// one allocates nothing; the overlap check walks that chain, which holds a handful of requests
// (the staging buffers of one tensor), not a table per block.
//
// Not thread-safe: the owning store calls every member under its own mutex, except where a
// member says otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "storage/swap_store.h"

namespace strata::storage {

// "extent #7 at offset 1048576": how storage messages name an extent.
std::string describe_extent(uint64_t id, uint64_t offset);

class ExtentContent {
 public:
  // Records for an extent of `capacity` bytes (a multiple of the device alignment) in blocks of
  // `block_bytes` (a power of two), with hash slots only when `checksums`. STRATA_E_NOMEM when
  // the host memory for them cannot be had.
  static Result<ExtentContent> create(uint64_t capacity, uint64_t block_bytes, bool checksums);

  // The content's logical length, as the last successful write set it; 0 until one succeeds.
  uint64_t length() const { return length_; }
  bool io_in_flight() const { return in_flight_ != nullptr; }
  // Whether every block of the content holds content, so that a whole read can be admitted
  // (overlap with requests in flight aside).
  bool readable() const;
  uint64_t block_bytes() const { return block_bytes_; }

  // Whether a request may start, checked before any I/O: STRATA_E_INVALID for arguments that
  // break the rules (with the numbers), STRATA_E_STATE for blocks not readable and for overlap
  // with a write (naming both ranges). `whole` marks write_async / read_async, whose messages
  // name the extent only.
  Status check_write(const Extent& extent, uint64_t offset, uint64_t bytes, uint64_t content_bytes,
                     bool whole) const;
  Status check_read(const Extent& extent, uint64_t offset, uint64_t bytes, bool whole) const;

  // Records an admitted request in io (extent_id, offset, bytes, content_bytes, write, whole)
  // and chains it in flight.
  void start(ExtentIo* io, const Extent& extent, uint64_t offset, uint64_t bytes,
             uint64_t content_bytes, bool write, bool whole);
  // Takes a completed request out of flight and, for a write, applies its outcome: on success
  // its blocks take their new hashes, the length becomes its content_bytes and blocks whose
  // logical bytes that changes (and it did not cover) are no longer content; on failure its
  // blocks keep their records, or, without checksums, those that held content become failed.
  void finish(ExtentIo* io, bool succeeded);
  // Takes a request the engine refused out of flight: nothing was transferred, nothing changes.
  void withdraw(ExtentIo* io);

  // The hash slots of the blocks a request covers, which the store uses outside its mutex: a
  // write in flight owns its blocks' pending slots, and no write can change the recorded hashes
  // of a read's blocks while that read is in flight (overlap is refused). Empty without
  // checksums.
  std::span<uint64_t> pending_hashes(const ExtentIo& io);
  std::span<const uint64_t> hashes(const ExtentIo& io) const;
  // Whether the last write over block `index` failed (for the messages of a mismatch).
  bool write_failed_over(uint64_t index) const;

  // "reading extent #7 at offset 0" for a whole request, "..., bytes [a, b)" for a ranged one.
  static std::string describe(const ExtentIo& io, uint64_t extent_offset);

 private:
  ExtentContent(uint64_t blocks, uint64_t block_bytes, std::unique_ptr<uint8_t[]> states,
                std::unique_ptr<uint64_t[]> hashes);

  uint64_t first_block(uint64_t offset) const { return offset / block_bytes_; }
  uint64_t end_block(uint64_t end) const { return (end + block_bytes_ - 1) / block_bytes_; }
  // The block's logical bytes when the content is `length` long.
  uint64_t block_length(uint64_t index, uint64_t length) const;
  // The first block of [first, end) that holds no readable content, or end.
  uint64_t first_unreadable(uint64_t first, uint64_t end) const;
  // The argument rules of a range that must end within a content of `end` bytes.
  Status check_range(const Extent& extent, uint64_t offset, uint64_t bytes, uint64_t end,
                     bool write, bool whole) const;
  Status check_overlap(const Extent& extent, uint64_t offset, uint64_t bytes, bool write,
                       bool whole) const;

  uint64_t blocks_ = 0;
  uint64_t block_bytes_ = 0;
  uint64_t length_ = 0;
  bool last_write_failed_ = false;      // for the message of an extent that never had content
  std::unique_ptr<uint8_t[]> states_;   // one per block: BlockState | kWriteFailedBit
  std::unique_ptr<uint64_t[]> hashes_;  // [0, blocks) recorded, [blocks, 2 blocks) pending
  ExtentIo* in_flight_ = nullptr;
};

}  // namespace strata::storage
