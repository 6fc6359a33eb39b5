// The narrow interface the scheduler issues work to (Seastar style: the scheduler decides what
// moves when; a backend only allocates and moves bytes). Two implementations: SimulatedBackend
// (modelled devices, virtual clock) and the real one over storage/ and memory/.
//
// Rules every backend follows:
//  - Every member is called with the scheduler's lock held, so none may block on anything that
//    needs that lock, and none may wait for a transfer to finish. Short waits for queue room
//    (io engine backpressure) are fine: completions never need the scheduler's lock to drain.
//  - A transfer either returns an error at once (the request is invalid: then its completion is
//    never delivered) or returns OK and later delivers exactly one completion through
//    post_completion(), never inline from inside the call.
//  - Buffers and extents are opaque to the scheduler except for Buffer::data, which it hands to
//    the framework. A backend may round sizes up; the scheduler does its own budget accounting.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>
#include <cstdint>
#include <utility>

#include "common/status.h"
#include "sched/residency.h"
#include "vocabulary/tensor_spec.h"

namespace strata::sched {

// A pinned or device buffer.
struct Buffer {
  void* data = nullptr;  // what acquire hands out (a fake address in simulation)
  uint64_t bytes = 0;    // as allocated (>= requested)
  uint64_t token = 0;    // the backend's own identifier (arena slot, CUDA event index, ...)
  bool valid() const { return bytes != 0; }
};

// Space for one tensor on the NVMe tier.
struct Extent {
  uint64_t token = 0;  // the backend's identifier (the extent store's id, ...)
  uint64_t place = 0;  // the backend's second word (the extent store's byte offset)
  uint64_t bytes = 0;  // the space held (>= the tensor's bytes): what the NVMe tier counts in use
  bool valid() const { return bytes != 0; }
};

// The links transfers travel on; each has its own in-flight limit and counters.
enum class Link : uint8_t { kNvmeRead = 0, kNvmeWrite = 1, kHostToDevice = 2, kDeviceToHost = 3 };
inline constexpr int kLinkCount = 4;
const char* to_string(Link link);

// What a backend measured on one link. busy_seconds is the time during which at least one
// transfer was in flight on the link (not the sum of transfer times), so bytes / busy_seconds
// is the rate the link delivered: the number a simulator's device model is calibrated with.
struct LinkCounters {
  uint64_t bytes = 0;
  uint64_t transfers = 0;
  double busy_seconds = 0;
};

// Receives completions. Implemented by the Scheduler.
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // Runs on the sink's executor, never inline in a backend call.
  virtual void on_transfer_complete(uint32_t op, Status status) = 0;
  // Where completion handlers run: a Boost.Asio io_context (simulation, tests) or thread pool.
  virtual boost::asio::any_io_executor completion_executor() const = 0;
};

// Identifies a transfer to its sink. Trivially copyable: backends store it in their requests.
struct Completion {
  CompletionSink* sink = nullptr;
  uint32_t op = 0;
};

// Delivers a completion: posts the sink's handler to the sink's executor. Asio recycles handler
// memory per thread, so a steady stream of completions does not allocate.
inline void post_completion(const Completion& completion, Status status) {
  CompletionSink* sink = completion.sink;
  const uint32_t op = completion.op;
  boost::asio::post(sink->completion_executor(), [sink, op, status = std::move(status)]() mutable {
    sink->on_transfer_complete(op, std::move(status));
  });
}

class TierBackend {
 public:
  virtual ~TierBackend() = default;
  virtual const char* name() const = 0;

  // Memory on the pinned or device tier, for a tensor of `kind` (which a backend may record in a
  // trace; what is in use is the scheduler's record, not the backend's). Fails with
  // STRATA_E_PINNED_BUDGET / STRATA_E_DEVICE_BUDGET when the backend's own limit (or fragmentation)
  // refuses, STRATA_E_NOMEM when the OS does; the scheduler then evicts more or reports the error.
  virtual Result<Buffer> allocate(Tier tier, uint64_t bytes, TensorKind kind) = 0;
  virtual void free(Tier tier, const Buffer& buffer) = 0;

  // NVMe space for `bytes` (the extent may be larger). STRATA_E_NOSPACE when the tier is full.
  virtual Result<Extent> allocate_extent(uint64_t bytes) = 0;
  virtual void free_extent(const Extent& extent) = 0;

  // Asynchronous transfers of `bytes` (<= both sides' sizes). OK means the completion will come.
  virtual Status read(const Extent& from, const Buffer& to_pinned, uint64_t bytes,
                      Completion done) = 0;
  virtual Status write(const Buffer& from_pinned, const Extent& to, uint64_t bytes,
                       Completion done) = 0;
  virtual Status copy_to_device(const Buffer& from_pinned, const Buffer& to_device, uint64_t bytes,
                                Completion done) = 0;
  virtual Status copy_to_host(const Buffer& from_device, const Buffer& to_pinned, uint64_t bytes,
                              Completion done) = 0;
  // A byte range between a device buffer and a pinned buffer (link kHostToDevice: pinned ->
  // device, kDeviceToHost: device -> pinned), for a consumer that works through a device tensor
  // in pinned pieces. Offsets plus bytes lie within both buffers.
  virtual Status copy_range(Link link, const Buffer& from, uint64_t from_offset, const Buffer& to,
                            uint64_t to_offset, uint64_t bytes, Completion done) = 0;
  // Streamed transfers between NVMe and the device, chunk by chunk through the backend's own
  // staging buffers (MemoryPlan::stream_staging_bytes of pinned memory, held from start to end):
  // no pinned buffer of the tensor's size exists at any moment. A stream is one transfer to the
  // scheduler (one completion, after its last chunk; a failed chunk fails it, and it completes
  // only once no chunk of it is in flight). It occupies the NVMe link of its direction and the
  // device link beside it; the link counters count its bytes on both.
  virtual Status stream_to_device(const Extent& from, const Buffer& to_device, uint64_t bytes,
                                  Completion done) = 0;
  virtual Status stream_to_nvme(const Buffer& from_device, const Extent& to, uint64_t bytes,
                                Completion done) = 0;

  // The framework released a buffer it used on `tier`. On CUDA, device_stream is the
  // cudaStream_t whose queued work still reads or writes the buffer (nullptr: CUDA's default
  // stream): a backend records an event there and orders any later copy out of, or reuse of,
  // the buffer after it. Elsewhere nullptr means none.
  virtual void on_release(Tier tier, const Buffer& buffer, void* device_stream) {
    (void)tier;
    (void)buffer;
    (void)device_stream;
  }

  // What the backend measured per link since it was created (for calibration).
  virtual LinkCounters link_counters(Link link) const = 0;
};

}  // namespace strata::sched
