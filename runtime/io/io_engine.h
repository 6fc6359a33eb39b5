// The narrow interface every I/O backend implements (io_uring, pread/pwrite, fault injection).
// Scheduling decisions (what to read when) live above it; the engine only issues requests.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"

namespace strata::io {

enum class IoOp : uint8_t { kRead, kWrite };

// A caller-owned request. It must stay alive and untouched from submit() until on_complete has
// been called. The engine splits it into blocks of IoEngineOptions::block_size, keeps up to
// queue_depth blocks in flight, resubmits short transfers and retries EAGAIN / EINTR itself;
// on_complete runs exactly once, on an engine thread, after every block has finished.
struct IoRequest {
  IoOp op = IoOp::kRead;
  uint32_t file = 0;          // index from IoEngine::register_file
  void* buffer = nullptr;     // aligned to the file's direct-I/O memory alignment
  uint64_t length = 0;        // a multiple of the file's direct-I/O alignment
  uint64_t offset = 0;        // ditto
  int32_t buffer_index = -1;  // registered buffer holding [buffer, buffer + length), or -1

  void (*on_complete)(IoRequest* request, void* context) = nullptr;
  void* context = nullptr;

  // Set by the engine before on_complete. error is 0 or a positive errno; on error, transferred
  // counts the bytes known to have moved (their content is not to be trusted for writes).
  int error = 0;
  uint64_t transferred = 0;
};

struct IoEngineOptions {
  uint32_t queue_depth = 32;       // blocks in flight
  uint32_t block_size = 1u << 20;  // bytes per block; a multiple of 4096
  uint32_t threads = 2;            // pread/pwrite engine worker threads
};

// Thread rules: every member may be called from any thread, concurrently. on_complete callbacks
// run on engine threads and must not block for long (signal a waiter and return).
class IoEngine {
 public:
  virtual ~IoEngine() = default;

  // "io_uring", "psync", ... and, for io_uring, the setup flags that were accepted.
  virtual const char* name() const = 0;
  virtual const IoEngineOptions& options() const = 0;

  // Registers an open file (opened with O_DIRECT where the file system allows it); the returned
  // index names it in requests. The engine does not take ownership of fd.
  virtual Result<uint32_t> register_file(int fd) = 0;

  // Registers [base, base + bytes) for fixed-buffer I/O (bytes <= 1 GiB). The index is passed in
  // IoRequest::buffer_index. Engines without fixed buffers still hand out indices.
  virtual Result<int32_t> register_buffer(void* base, uint64_t bytes) = 0;
  virtual Status unregister_buffer(int32_t index) = 0;

  // Queues a request. Blocks (backpressure) while the engine's queue is full; never drops one.
  // Returns an error only for an invalid request (bad file index, misaligned, zero length), in
  // which case on_complete is not called.
  virtual Status submit(IoRequest* request) = 0;
};

// Converts a finished request into a Status with context ("write of 1048576 bytes at 4096").
Status request_status(const IoRequest& request);

// Submits and waits for one request. For tests, tools and cold paths.
Status read_sync(IoEngine& engine, uint32_t file, void* buffer, uint64_t length, uint64_t offset,
                 int32_t buffer_index = -1);
Status write_sync(IoEngine& engine, uint32_t file, const void* buffer, uint64_t length,
                  uint64_t offset, int32_t buffer_index = -1);

}  // namespace strata::io
