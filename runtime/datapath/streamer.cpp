#include "datapath/streamer.h"

#include <algorithm>
#include <utility>

#include "common/align.h"
#include "common/assert.h"
#include "common/units.h"

namespace strata::datapath {
namespace {

constexpr sched::Link kNvmeLink[2] = {sched::Link::kNvmeRead, sched::Link::kNvmeWrite};

}  // namespace

Result<std::unique_ptr<Streamer>> Streamer::create(storage::SwapStore& store,
                                                   memory::PinnedArena& arena,
                                                   memory::Device& device, CopyLane& to_device,
                                                   CopyLane& to_host, LinkMeter& meter,
                                                   const StreamerOptions& options) {
  const uint64_t block = store.block_bytes();
  if (options.chunk_bytes == 0 || options.chunk_bytes % block != 0 ||
      options.chunk_bytes % store.alignment() != 0) {
    return invalid_argument("streamer: a chunk of " + format_bytes(options.chunk_bytes) +
                            " is not a multiple of the NVMe tier's block (" + format_bytes(block) +
                            ")");
  }
  if (options.buffers_per_direction == 0 || options.max_streams == 0) {
    return invalid_argument("streamer: needs at least one staging buffer and one stream");
  }
  std::unique_ptr<Streamer> streamer(
      new Streamer(store, device, to_device, to_host, meter, options));
  for (int d = 0; d < kDirections; ++d) {
    for (uint32_t i = 0; i < options.buffers_per_direction; ++i) {
      auto buffer = std::make_unique<Buffer>();
      buffer->owner = streamer.get();
      buffer->direction = static_cast<Direction>(d);
      STRATA_ASSIGN_OR_RETURN(buffer->memory, arena.allocate(options.chunk_bytes),
                              "streaming staging buffer");
      buffer->io_index = buffer->memory.io_buffer_index(0, options.chunk_bytes);
      buffer->io.on_complete = &Streamer::on_io_done;
      buffer->io.context = buffer.get();
      streamer->buffers_[d].push_back(std::move(buffer));
    }
  }
  streamer->thread_ = std::thread([s = streamer.get()] { s->run(); });
  return streamer;
}

Streamer::Streamer(storage::SwapStore& store, memory::Device& device, CopyLane& to_device,
                   CopyLane& to_host, LinkMeter& meter, const StreamerOptions& options)
    : store_(store),
      device_(device),
      lanes_{&to_device, &to_host},
      meter_(meter),
      options_(options) {
  for (int d = 0; d < kDirections; ++d) {
    streams_[d].resize(options_.max_streams);
    free_streams_[d].reserve(options_.max_streams);
    for (uint32_t i = options_.max_streams; i > 0; --i) free_streams_[d].push_back(i - 1);
    order_[d].reserve(options_.max_streams);
  }
  actions_.reserve(size_t{kDirections} * options_.buffers_per_direction);
  finished_.reserve(size_t{kDirections} * options_.max_streams);
}

Streamer::~Streamer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t Streamer::staging_bytes() const {
  return staging_bytes(options_);
}

Status Streamer::stream_in(const storage::Extent& from, void* to_device, uint64_t bytes,
                           sched::Completion done) {
  return submit(kIn, from, static_cast<std::byte*>(to_device), bytes, done);
}

Status Streamer::stream_out(const void* from_device, const storage::Extent& to, uint64_t bytes,
                            sched::Completion done) {
  // The device buffer is only read on the way out; one record type serves both directions.
  return submit(kOut, to, static_cast<std::byte*>(const_cast<void*>(from_device)), bytes, done);
}

Status Streamer::submit(Direction direction, const storage::Extent& extent, std::byte* device,
                        uint64_t bytes, sched::Completion done) {
  if (device == nullptr || bytes == 0 || extent.id == 0 || bytes > extent.capacity) {
    return invalid_argument("streamer: bad request (" + format_bytes(bytes) + " for an extent of " +
                            format_bytes(extent.capacity) + ")");
  }
  {
    std::lock_guard lock(mutex_);
    if (free_streams_[direction].empty()) {
      return Status::error(STRATA_E_LIMIT, "streamer: more than " +
                                               std::to_string(options_.max_streams) +
                                               " streams in one direction at once");
    }
    const uint32_t index = free_streams_[direction].back();
    free_streams_[direction].pop_back();
    Stream& s = streams_[direction][index];
    s = Stream{};
    s.active = true;
    s.direction = direction;
    s.extent = extent;
    s.device = device;
    s.bytes = bytes;
    s.done = done;
    s.label = sched::TransferLabel::current();
    order_[direction].push_back(index);
    ++active_streams_;
    changed_.notify_one();
  }
  return Status::ok();
}

// ---- The owner thread ----

void Streamer::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    plan_locked();
    if (actions_.empty() && finished_.empty()) {
      if (stopping_ && active_streams_ == 0) return;
      changed_.wait(lock);
      continue;
    }
    std::vector<Action> actions;
    actions.swap(actions_);
    std::vector<Stream> finished;
    finished.swap(finished_);
    lock.unlock();
    // Issued and completed without the lock: a submission may wait for queue room.
    for (const Action& action : actions) {
      Status issued = issue(action);
      if (!issued) report(*action.buffer, std::move(issued));
    }
    for (Stream& s : finished) sched::post_completion(s.done, std::move(s.failure));
    lock.lock();
    // The scratch vectors go back, keeping what they reserved.
    actions.clear();
    actions_.swap(actions);
    finished.clear();
    finished_.swap(finished);
  }
}

void Streamer::plan_locked() {
  actions_.clear();
  finished_.clear();
  for (int d = 0; d < kDirections; ++d) {
    // Buffers whose leg has finished go on to the next leg, or finish their chunk.
    for (const std::unique_ptr<Buffer>& owned : buffers_[d]) {
      Buffer& b = *owned;
      if (!b.reported) continue;
      b.reported = false;
      Status status = std::move(b.result);
      b.result = Status::ok();
      const bool nvme_leg = b.leg == Leg::kReading || b.leg == Leg::kWriting;
      if (nvme_leg) {
        // Each chunk's request is a span of its own, named by the tensor: the trace shows what
        // is in flight on the drive, chunk by chunk.
        meter_.finished(kNvmeLink[d], status.is_ok() ? b.bytes : 0, b.nvme_begin_us,
                        sched::link_word(kNvmeLink[d]), &streams_[d][b.stream].label);
      }
      const bool last_leg = b.direction == kIn ? b.leg == Leg::kCopying : b.leg == Leg::kWriting;
      Stream& s = streams_[d][b.stream];
      if (!status.is_ok() || last_leg || !s.failure.is_ok()) {
        finish_chunk_locked(b, std::move(status));
        continue;
      }
      if (b.direction == kIn) {
        b.leg = Leg::kCopying;
        actions_.push_back({Action::kCopy, &b});
      } else {
        b.leg = Leg::kWriting;
        b.nvme_begin_us = meter_.now_us();
        meter_.started(kNvmeLink[d]);
        actions_.push_back({Action::kWrite, &b});
      }
    }
    // Idle buffers take the next chunks, oldest stream first.
    size_t next = 0;
    for (const std::unique_ptr<Buffer>& owned : buffers_[d]) {
      Buffer& b = *owned;
      if (b.leg != Leg::kIdle) continue;
      while (next < order_[d].size()) {
        const Stream& s = streams_[d][order_[d][next]];
        if (s.failure.is_ok() && s.next_offset < s.bytes) break;
        ++next;
      }
      if (next == order_[d].size()) break;
      Stream& s = streams_[d][order_[d][next]];
      b.stream = order_[d][next];
      b.offset = s.next_offset;
      b.bytes = std::min(options_.chunk_bytes, s.bytes - s.next_offset);
      s.next_offset += b.bytes;
      ++s.chunks_moving;
      if (d == kIn) {
        b.leg = Leg::kReading;
        b.nvme_begin_us = meter_.now_us();
        meter_.started(kNvmeLink[d]);
        actions_.push_back({Action::kRead, &b});
      } else {
        b.leg = Leg::kCopying;
        actions_.push_back({Action::kCopy, &b});
      }
    }
    // Streams with no chunk moving and none left to start (or a failure) are done.
    auto& order = order_[d];
    for (size_t i = 0; i < order.size();) {
      Stream& s = streams_[d][order[i]];
      const bool started_all = s.next_offset == s.bytes || !s.failure.is_ok();
      if (!started_all || s.chunks_moving > 0) {
        ++i;
        continue;
      }
      s.active = false;
      finished_.push_back(std::move(s));
      free_streams_[d].push_back(order[i]);
      order.erase(order.begin() + static_cast<std::ptrdiff_t>(i));
      STRATA_ASSERT(active_streams_ > 0);
      --active_streams_;
    }
  }
}

void Streamer::finish_chunk_locked(Buffer& buffer, Status status) {
  Stream& s = streams_[buffer.direction][buffer.stream];
  STRATA_ASSERT(s.active && s.chunks_moving > 0);
  --s.chunks_moving;
  if (!status.is_ok() && s.failure.is_ok()) {
    s.failure = std::move(status).with_context(
        std::string("chunk at ") + format_bytes(buffer.offset) + " of a stream " +
        (buffer.direction == kIn ? "to the device" : "to NVMe"));
  }
  buffer.leg = Leg::kIdle;
}

Status Streamer::issue(const Action& action) {
  Buffer& b = *action.buffer;
  // The record of the buffer's stream is stable while a chunk of it moves: only the owner thread
  // frees it, once no chunk moves.
  const Stream& s = streams_[b.direction][b.stream];
  std::byte* device = s.device + b.offset;
  switch (action.kind) {
    case Action::kRead:
      return store_.read_range_async(s.extent, b.offset, b.memory.data(), b.bytes, &b.io,
                                     b.io_index);
    case Action::kWrite:
      return store_.write_range_async(s.extent, b.offset, b.memory.data(), b.bytes, s.bytes, &b.io,
                                      b.io_index);
    case Action::kCopy:
      return b.direction == kIn
                 ? lanes_[kIn]->copy(device, b.memory.data(), b.bytes, &Streamer::on_copy_done, &b)
                 : lanes_[kOut]->copy(b.memory.data(), device, b.bytes, &Streamer::on_copy_done,
                                      &b);
  }
  return Status::error(STRATA_E_INTERNAL, "streamer: unknown action");
}

void Streamer::on_io_done(storage::ExtentIo* io, void* context) {
  auto* buffer = static_cast<Buffer*>(context);
  buffer->owner->report(*buffer, std::move(io->status));
}

void Streamer::on_copy_done(void* context, Status status) {
  auto* buffer = static_cast<Buffer*>(context);
  buffer->owner->report(*buffer, std::move(status));
}

void Streamer::report(Buffer& buffer, Status status) {
  // Notified under the lock: once the owner thread sees the report it may finish the last
  // stream, and the destructor may then destroy the condition variable; a notify after unlocking
  // could touch it after that (ThreadSanitizer found it).
  std::lock_guard lock(mutex_);
  STRATA_ASSERT(!buffer.reported && buffer.leg != Leg::kIdle);
  buffer.result = std::move(status);
  buffer.reported = true;
  changed_.notify_one();
}

}  // namespace strata::datapath
