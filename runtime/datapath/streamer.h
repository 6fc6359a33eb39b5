// Streams tensors between NVMe and the device chunk by chunk through a fixed ring of pinned
// staging buffers per direction, so that no pinned buffer the size of a tensor ever exists
// (TierBackend::stream_to_device / stream_to_nvme):
//
//   in:   NVMe --read_range--> staging buffer --H2D copy--> device buffer + offset
//   out:  device buffer + offset --D2H copy--> staging buffer --write_range--> NVMe
//
// Each staging buffer carries one chunk at a time through its two legs; a stream's chunks go out
// over every free buffer of its direction, oldest stream first, so one stream gets the whole ring
// and the drive sees buffers_per_direction requests at once. A stream completes (one completion to
// the scheduler) after its last chunk; a failed chunk fails it, and no later chunk starts, but it
// completes only once none of its chunks is moving. Every read verifies the blocks it covers
// before the bytes go on to the device (the extent store's content rules), so a stream never
// leaves unverified data on the device as valid.
//
// Like the io_uring engine: one owner thread issues every read, write and copy; the store's I/O
// threads and the copy lanes only report to it; every buffer, stream record and I/O request is
// preallocated. Nothing is issued while the streamer's lock is held: a submission may wait for
// queue room, and room comes from completions that take the lock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"
#include "datapath/copy_lane.h"
#include "datapath/link_meter.h"
#include "memory/pinned_arena.h"
#include "sched/tier_backend.h"
#include "sched/transfer_label.h"
#include "storage/swap_store.h"

namespace strata::datapath {

struct StreamerOptions {
  // Bytes per staging buffer and per ranged request: a multiple of the store's block_bytes()
  // (ranged I/O starts on a block) and of its alignment.
  uint64_t chunk_bytes = uint64_t{4} << 20;
  uint32_t buffers_per_direction = 4;
  // Streams queued or moving at once per direction (the scheduler's in-flight limits stay below).
  uint32_t max_streams = 256;
};

class Streamer {
 public:
  // Maps the staging buffers (2 x buffers_per_direction x chunk_bytes of the arena's budget).
  static Result<std::unique_ptr<Streamer>> create(storage::SwapStore& store,
                                                  memory::PinnedArena& arena,
                                                  memory::Device& device, CopyLane& to_device,
                                                  CopyLane& to_host, LinkMeter& meter,
                                                  const StreamerOptions& options);
  // Waits for the streams in flight, then stops the owner thread.
  ~Streamer();
  Streamer(const Streamer&) = delete;
  Streamer& operator=(const Streamer&) = delete;

  // Queues a stream; OK means its completion will come. STRATA_E_INVALID for a bad request,
  // STRATA_E_LIMIT past max_streams.
  Status stream_in(const storage::Extent& from, void* to_device, uint64_t bytes,
                   sched::Completion done);
  Status stream_out(const void* from_device, const storage::Extent& to, uint64_t bytes,
                    sched::Completion done);

  // The pinned memory the staging buffers hold.
  uint64_t staging_bytes() const;
  static uint64_t staging_bytes(const StreamerOptions& options) {
    return 2 * uint64_t{options.buffers_per_direction} * options.chunk_bytes;
  }

 private:
  static constexpr int kDirections = 2;
  enum Direction : uint8_t { kIn = 0, kOut = 1 };
  // A staging buffer's leg: in goes kReading then kCopying, out kCopying then kWriting.
  enum class Leg : uint8_t { kIdle, kReading, kCopying, kWriting };

  struct Buffer {
    Streamer* owner = nullptr;
    Direction direction = kIn;
    memory::PinnedBuffer memory;
    int32_t io_index = -1;
    Leg leg = Leg::kIdle;
    uint32_t stream = 0;  // whose chunk it carries
    uint64_t offset = 0;  // of the chunk in the tensor
    uint64_t bytes = 0;
    uint64_t nvme_begin_us = 0;
    storage::ExtentIo io;
    // Set by the leg's report (an I/O thread or a copy lane), acted on by the owner thread.
    bool reported = false;
    Status result;
  };
  struct Stream {
    bool active = false;
    Direction direction = kIn;
    storage::Extent extent;
    std::byte* device = nullptr;
    uint64_t bytes = 0;
    uint64_t next_offset = 0;  // the first byte no chunk has started
    uint32_t chunks_moving = 0;
    Status failure;  // the first chunk's; no chunk starts after it
    sched::Completion done;
    sched::TransferLabel label;
  };
  // What the owner thread issues once it has let go of the lock.
  struct Action {
    enum Kind : uint8_t { kRead, kWrite, kCopy } kind = kRead;
    Buffer* buffer = nullptr;
  };

  Streamer(storage::SwapStore& store, memory::Device& device, CopyLane& to_device,
           CopyLane& to_host, LinkMeter& meter, const StreamerOptions& options);
  Status submit(Direction direction, const storage::Extent& extent, std::byte* device,
                uint64_t bytes, sched::Completion done);
  void run();
  // Requires mutex_. Moves reported buffers on to their next leg and starts chunks on idle
  // buffers; fills actions_ and finished_.
  void plan_locked();
  void finish_chunk_locked(Buffer& buffer, Status status);
  Status issue(const Action& action);
  static void on_io_done(storage::ExtentIo* io, void* context);
  static void on_copy_done(void* context, Status status);
  void report(Buffer& buffer, Status status);

  storage::SwapStore& store_;
  memory::Device& device_;
  CopyLane* lanes_[kDirections];  // the lane each direction copies on
  LinkMeter& meter_;
  const StreamerOptions options_;

  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Buffer>> buffers_[kDirections];  // fixed at creation
  std::vector<Stream> streams_[kDirections];                   // fixed at creation
  std::vector<uint32_t> free_streams_[kDirections];
  std::vector<uint32_t> order_[kDirections];  // active streams, oldest first
  uint32_t active_streams_ = 0;
  // The owner thread's scratch, reserved at creation.
  std::vector<Action> actions_;
  std::vector<Stream> finished_;
  std::thread thread_;
};

}  // namespace strata::datapath
