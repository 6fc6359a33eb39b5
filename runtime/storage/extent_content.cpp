#include "storage/extent_content.h"

#include <algorithm>
#include <limits>
#include <new>
#include <utility>

#include "common/assert.h"

namespace strata::storage {

namespace {

// A block's state byte: what its record says, plus whether the last write over it failed.
enum BlockState : uint8_t {
  kNone = 0,     // no content: never written successfully, or no longer inside the content
  kWritten = 1,  // its recorded hash (with checksums) describes what was written last
  kFailed = 2,   // without checksums: a write over its content failed, nothing tells what is left
  kStateMask = 3,
  kWriteFailedBit = 4,
};

// "[a, b)"; an end past 2^64 (only arguments that are refused anyway) is written as a sum.
std::string range_text(uint64_t offset, uint64_t bytes) {
  if (bytes > std::numeric_limits<uint64_t>::max() - offset) {
    return "[" + std::to_string(offset) + ", " + std::to_string(offset) + " + " +
           std::to_string(bytes) + ")";
  }
  return "[" + std::to_string(offset) + ", " + std::to_string(offset + bytes) + ")";
}

std::string request_text(bool write, uint64_t id, uint64_t extent_offset, uint64_t offset,
                         uint64_t bytes, bool whole) {
  std::string text = (write ? "writing " : "reading ") + describe_extent(id, extent_offset);
  if (!whole) text += ", bytes " + range_text(offset, bytes);
  return text;
}

}  // namespace

std::string describe_extent(uint64_t id, uint64_t offset) {
  return "extent #" + std::to_string(id) + " at offset " + std::to_string(offset);
}

Result<ExtentContent> ExtentContent::create(uint64_t capacity, uint64_t block_bytes,
                                            bool checksums) {
  STRATA_ASSERT(capacity > 0 && block_bytes > 0);
  const uint64_t blocks = (capacity + block_bytes - 1) / block_bytes;
  std::unique_ptr<uint8_t[]> states(new (std::nothrow) uint8_t[blocks]());
  std::unique_ptr<uint64_t[]> hashes(checksums ? new (std::nothrow) uint64_t[2 * blocks]()
                                               : nullptr);
  if (states == nullptr || (checksums && hashes == nullptr)) {
    return Status::error(STRATA_E_NOMEM, "no host memory for the records of the " +
                                             std::to_string(blocks) + " blocks of an extent of " +
                                             std::to_string(capacity) + " bytes");
  }
  return ExtentContent(blocks, block_bytes, std::move(states), std::move(hashes));
}

ExtentContent::ExtentContent(uint64_t blocks, uint64_t block_bytes,
                             std::unique_ptr<uint8_t[]> states, std::unique_ptr<uint64_t[]> hashes)
    : blocks_(blocks),
      block_bytes_(block_bytes),
      states_(std::move(states)),
      hashes_(std::move(hashes)) {}

uint64_t ExtentContent::block_length(uint64_t index, uint64_t length) const {
  const uint64_t start = index * block_bytes_;
  return length <= start ? 0 : std::min(block_bytes_, length - start);
}

Status ExtentContent::check_range(const Extent& extent, uint64_t offset, uint64_t bytes,
                                  uint64_t end, bool write, bool whole) const {
  const auto refuse = [&](const std::string& why) {
    return invalid_argument(request_text(write, extent.id, extent.offset, offset, bytes, whole) +
                            ": " + why);
  };
  if (bytes == 0) return refuse("a range needs at least one byte");
  if (end > extent.capacity) {
    return refuse("a content of " + std::to_string(end) + " bytes does not fit the capacity of " +
                  std::to_string(extent.capacity));
  }
  if (offset > end || bytes > end - offset) {
    return refuse("the range ends past the content length of " + std::to_string(end) + " bytes" +
                  (write ? " it sets" : ""));
  }
  if (offset % block_bytes_ != 0) {
    return refuse("the offset is not a multiple of the block size " + std::to_string(block_bytes_));
  }
  if (bytes % block_bytes_ != 0 && offset + bytes != end) {
    return refuse(std::to_string(bytes) + " bytes is not a multiple of the block size " +
                  std::to_string(block_bytes_) + ", and the range does not end at the content's " +
                  "end (" + std::to_string(end) + " bytes)");
  }
  return Status::ok();
}

Status ExtentContent::check_write(const Extent& extent, uint64_t offset, uint64_t bytes,
                                  uint64_t content_bytes, bool whole) const {
  STRATA_TRY(check_range(extent, offset, bytes, content_bytes, /*write=*/true, whole));
  return check_overlap(extent, offset, bytes, /*write=*/true, whole);
}

Status ExtentContent::check_read(const Extent& extent, uint64_t offset, uint64_t bytes,
                                 bool whole) const {
  const auto name = [&] {
    return request_text(false, extent.id, extent.offset, offset, bytes, whole);
  };
  if (length_ == 0) {
    return Status::error(
        STRATA_E_STATE,
        name() + (last_write_failed_ ? ", whose only write failed" : ", which was never written"));
  }
  STRATA_TRY(check_range(extent, offset, bytes, length_, /*write=*/false, whole));
  const uint64_t end = end_block(offset + bytes);
  const uint64_t i = first_unreadable(first_block(offset), end);
  if (i < end) {
    const std::string block = "block " + range_text(i * block_bytes_, block_length(i, length_));
    if ((states_[i] & kStateMask) == kFailed) {
      return Status::error(STRATA_E_STATE, name() + ": the last write failed over " + block +
                                               " and, without checksums, what it holds is " +
                                               "unknown; write it again");
    }
    return Status::error(STRATA_E_STATE, name() + ": " + block + " was never written" +
                                             ((states_[i] & kWriteFailedBit) != 0
                                                  ? " successfully (the last write over it failed)"
                                                  : ""));
  }
  return check_overlap(extent, offset, bytes, /*write=*/false, whole);
}

uint64_t ExtentContent::first_unreadable(uint64_t first, uint64_t end) const {
  for (uint64_t i = first; i < end; ++i) {
    if ((states_[i] & kStateMask) != kWritten) return i;
  }
  return end;
}

bool ExtentContent::readable() const {
  const uint64_t end = end_block(length_);
  return length_ > 0 && first_unreadable(0, end) == end;
}

Status ExtentContent::check_overlap(const Extent& extent, uint64_t offset, uint64_t bytes,
                                    bool write, bool whole) const {
  const uint64_t first = first_block(offset);
  const uint64_t end = end_block(offset + bytes);
  for (const ExtentIo* other = in_flight_; other != nullptr; other = other->next_in_flight) {
    if (!write && !other->write) continue;  // reads may share blocks
    if (first < end_block(other->offset + other->bytes) && first_block(other->offset) < end) {
      // Both ranges, whole or not: the caller needs them to see which chunks collided.
      return Status::error(STRATA_E_STATE,
                           request_text(write, extent.id, extent.offset, offset, bytes, false) +
                               (whole ? " (the whole content)" : "") + ": " +
                               (other->write ? "a write" : "a read") + " of bytes " +
                               range_text(other->offset, other->bytes) +
                               " is in flight over the same blocks");
    }
  }
  return Status::ok();
}

void ExtentContent::start(ExtentIo* io, const Extent& extent, uint64_t offset, uint64_t bytes,
                          uint64_t content_bytes, bool write, bool whole) {
  io->extent_id = extent.id;
  io->content = this;
  io->offset = offset;
  io->bytes = bytes;
  io->content_bytes = content_bytes;
  io->write = write;
  io->whole = whole;
  io->prev_in_flight = nullptr;
  io->next_in_flight = in_flight_;
  if (in_flight_ != nullptr) in_flight_->prev_in_flight = io;
  in_flight_ = io;
}

void ExtentContent::withdraw(ExtentIo* io) {
  if (io->prev_in_flight != nullptr) {
    io->prev_in_flight->next_in_flight = io->next_in_flight;
  } else {
    STRATA_ASSERT(in_flight_ == io);
    in_flight_ = io->next_in_flight;
  }
  if (io->next_in_flight != nullptr) io->next_in_flight->prev_in_flight = io->prev_in_flight;
  io->next_in_flight = io->prev_in_flight = nullptr;
}

void ExtentContent::finish(ExtentIo* io, bool succeeded) {
  withdraw(io);
  if (!io->write) return;

  const uint64_t first = first_block(io->offset);
  const uint64_t end = end_block(io->offset + io->bytes);
  if (!succeeded) {
    // Some of the blocks may have been overwritten before the failure. A recorded hash still
    // tells whether a block's previous bytes survived; without one nothing can, so content is
    // given up rather than trusted.
    last_write_failed_ = true;
    for (uint64_t i = first; i < end; ++i) {
      if (hashes_ == nullptr && (states_[i] & kStateMask) == kWritten) states_[i] = kFailed;
      states_[i] |= kWriteFailedBit;
    }
    return;
  }
  for (uint64_t i = first; i < end; ++i) {
    states_[i] = kWritten;
    if (hashes_ != nullptr) hashes_[i] = hashes_[blocks_ + i];
  }
  // A record describes a block's logical bytes at the length it was written with. Blocks this
  // write did not cover whose logical bytes a new length changes - the old partial last block,
  // the blocks between the two lengths - have no valid record any more.
  const uint64_t old_length = length_;
  const uint64_t new_length = io->content_bytes;
  if (old_length != new_length) {
    const uint64_t from = first_block(std::min(old_length, new_length));
    const uint64_t to = std::max(end_block(old_length), end_block(new_length));
    for (uint64_t i = from; i < to; ++i) {
      if (i >= first && i < end) continue;
      if (block_length(i, old_length) != block_length(i, new_length)) states_[i] = kNone;
    }
  }
  length_ = new_length;
  last_write_failed_ = false;
}

std::span<uint64_t> ExtentContent::pending_hashes(const ExtentIo& io) {
  if (hashes_ == nullptr) return {};
  const uint64_t first = first_block(io.offset);
  return {hashes_.get() + blocks_ + first, end_block(io.offset + io.bytes) - first};
}

std::span<const uint64_t> ExtentContent::hashes(const ExtentIo& io) const {
  if (hashes_ == nullptr) return {};
  const uint64_t first = first_block(io.offset);
  return {hashes_.get() + first, end_block(io.offset + io.bytes) - first};
}

bool ExtentContent::write_failed_over(uint64_t index) const {
  STRATA_ASSERT(index < blocks_);
  return (states_[index] & kWriteFailedBit) != 0;
}

std::string ExtentContent::describe(const ExtentIo& io, uint64_t extent_offset) {
  return request_text(io.write, io.extent_id, extent_offset, io.offset, io.bytes, io.whole);
}

}  // namespace strata::storage
