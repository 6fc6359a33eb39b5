// Explicit limits shared by every engine, so that a request valid on one engine is valid on all
// of them and nothing grows without bound (TIGER_STYLE).
#pragma once

#include <cstdint>

#include "common/align.h"
#include "common/status.h"
#include "io/io_engine.h"

namespace strata::io {

// Offsets, lengths and buffer addresses of every request are multiples of this. 4096 covers the
// logical block size of the NVMe drives and file systems Strata targets, so one rule serves
// O_DIRECT everywhere instead of a per-file STATX_DIOALIGN query on the hot path.
inline constexpr uint64_t kIoAlignment = kPageSize;

// io_uring's fixed file table is allocated up front and capped by RLIMIT_NOFILE (often 1024).
inline constexpr uint32_t kMaxFiles = 256;
// Sparse registered-buffer table size; the kernel allows 16384, Strata needs a few per tier.
inline constexpr uint32_t kMaxBuffers = 1024;
// The kernel refuses a registered buffer larger than 1 GiB.
inline constexpr uint64_t kMaxRegisteredBufferBytes = 1ULL << 30;
// A block's byte count must fit the int result of pread and of an io_uring completion.
inline constexpr uint32_t kMaxBlockSize = 1U << 30;
inline constexpr uint32_t kMaxQueueDepth = 4096;
inline constexpr uint32_t kMaxThreads = 64;
// Blocks at least this large are handed to io_uring one per io_uring_enter, so the block layer
// does not merge adjacent blocks into larger requests (see UringEngine::start_attempt).
inline constexpr uint32_t kSubmitEachBlockBytes = 512U << 10;
// EAGAIN / EINTR on one block, back to back without a byte moving, before the engine gives up
// and fails the request with that errno rather than spinning forever.
inline constexpr uint32_t kMaxRetriesWithoutProgress = 64;

// STRATA_E_INVALID with the offending knob when options are out of range.
Status validate_options(const IoEngineOptions& options);

}  // namespace strata::io
