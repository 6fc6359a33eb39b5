// One block of a request on its way through the kernel, and the one rule, shared by every engine,
// for what a transfer result means for it: short transfers continue where they stopped, EAGAIN
// and EINTR retry (bounded), zero bytes before the end is an error, anything else fails.
#pragma once

#include <cerrno>
#include <cstdint>

#include "common/assert.h"
#include "io/io_engine.h"
#include "io/io_limits.h"
#include "io/transfer_hook.h"

namespace strata::io {

struct BlockCursor {
  IoOp op = IoOp::kRead;
  uint32_t file = 0;
  char* buffer = nullptr;  // next byte to move
  uint64_t offset = 0;     // its file offset
  uint64_t remaining = 0;  // bytes of the block still to move
  uint32_t retries = 0;    // EAGAIN / EINTR attempts since the last byte moved

  TransferAttempt attempt() const { return {op, file, buffer, offset, remaining}; }
};

enum class BlockStep : uint8_t { kFinished, kResubmit, kFailed };

// Applies one attempt's result (bytes moved or -errno) to the block. Bytes moved are added to
// *moved; on kFailed, *error is the positive errno to report.
inline BlockStep advance_block(BlockCursor& block, int result, uint64_t* moved, int* error) {
  if (result > 0) {
    const auto bytes = static_cast<uint64_t>(result);
    STRATA_ASSERT(bytes <= block.remaining);  // neither the kernel nor a hook may grow a transfer
    block.buffer += bytes;
    block.offset += bytes;
    block.remaining -= bytes;
    block.retries = 0;
    *moved += bytes;
    return block.remaining == 0 ? BlockStep::kFinished : BlockStep::kResubmit;
  }
  if (result == 0) {
    // A read that hits end of file before the end of the block would otherwise loop forever;
    // a write that moves nothing has no better name than EIO.
    *error = block.op == IoOp::kRead ? ENODATA : EIO;
    return BlockStep::kFailed;
  }
  const int errno_value = -result;
  if (errno_value == EAGAIN || errno_value == EINTR) {
    if (++block.retries <= kMaxRetriesWithoutProgress) {
      return BlockStep::kResubmit;
    }
  }
  *error = errno_value;
  return BlockStep::kFailed;
}

}  // namespace strata::io
