#include "storage/drive_probe.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "common/align.h"
#include "common/huge_page_mapping.h"

namespace strata::storage {
namespace {

using Clock = std::chrono::steady_clock;

// One buffer per request slot, made as the runtime's pinned memory is made
// (memory/pinned_arena.cpp): 2 MiB aligned, advised to transparent huge pages and registered
// with the engine as a fixed buffer. The drive is measured through the memory it will serve
// (common/huge_page_mapping.h says why that matters). The bytes are never looked at.
class SlotBuffers {
 public:
  SlotBuffers(io::IoEngine& engine, uint64_t request, uint32_t slots)
      : engine_(engine), bytes_(request * slots), memory_(bytes_, /*huge=*/true) {
    if (memory_.data() == nullptr) return;
    std::memset(memory_.data(), 0x5A, bytes_);  // written bytes, not a file's unwritten extents
    // Where the engine refuses (memlock accounting), requests go without a fixed buffer.
    Result<int32_t> index = engine.register_buffer(memory_.data(), bytes_);
    if (index) index_ = *index;
  }
  SlotBuffers(const SlotBuffers&) = delete;
  SlotBuffers& operator=(const SlotBuffers&) = delete;
  ~SlotBuffers() {
    if (index_ >= 0) (void)engine_.unregister_buffer(index_);
  }
  uint8_t* data() const { return memory_.data(); }
  int32_t index() const { return index_; }

 private:
  io::IoEngine& engine_;
  const uint64_t bytes_;
  HugePageMapping memory_;
  int32_t index_ = -1;
};

// Keeps `depth` requests of the same size in flight over [0, region) until `count` have ended;
// the seconds it took.
class Runner {
 public:
  Runner(io::IoEngine& engine, uint32_t file, const SlotBuffers& buffers, uint64_t request,
         uint64_t region)
      : engine_(engine), file_(file), buffers_(buffers), request_(request), region_(region) {}

  Result<double> run(io::IoOp op, uint32_t depth, uint32_t count) {
    std::vector<io::IoRequest> slots(depth);
    // A slot is free again when its own request has ended: an engine with several workers (the
    // pread/pwrite one) ends them out of order, and reusing slot issued % depth once any request
    // had ended overwrote one still in flight (config_fuzz: a null on_complete called).
    std::unique_lock lock(mutex_);
    free_slots_.clear();
    for (uint32_t slot = depth; slot-- > 0;) free_slots_.push_back(slot);
    slots_ = slots.data();
    issued_ = done_ = 0;
    error_ = 0;
    const auto start = Clock::now();
    for (;;) {
      while (issued_ < count && !free_slots_.empty() && error_ == 0) {
        const uint32_t slot = free_slots_.back();
        free_slots_.pop_back();
        io::IoRequest& r = slots[slot];
        r = io::IoRequest{};
        r.op = op;
        r.file = file_;
        r.buffer = buffers_.data() + uint64_t{slot} * request_;
        r.buffer_index = buffers_.index();
        r.length = request_;
        r.offset = (uint64_t{issued_} * request_) % region_;
        r.on_complete = &Runner::on_complete;
        r.context = this;
        ++issued_;
        lock.unlock();
        Status submitted = engine_.submit(&r);
        lock.lock();
        if (!submitted) {
          --issued_;
          free_slots_.push_back(slot);
          error_ = EIO;
          if (issued_ == done_) return submitted;
        }
      }
      if (done_ == issued_ && (issued_ == count || error_ != 0)) break;
      ended_.wait(lock);
    }
    if (error_ != 0) return errno_status(STRATA_E_IO, "drive probe", error_);
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

 private:
  static void on_complete(io::IoRequest* request, void* context) {
    auto* self = static_cast<Runner*>(context);
    // Notified under the lock: run() may return, and the Runner go, as soon as it sees the
    // last request ended.
    std::lock_guard lock(self->mutex_);
    if (request->error != 0 && self->error_ == 0) self->error_ = request->error;
    ++self->done_;
    self->free_slots_.push_back(static_cast<uint32_t>(request - self->slots_));
    self->ended_.notify_one();
  }

  io::IoEngine& engine_;
  const uint32_t file_;
  const SlotBuffers& buffers_;
  const uint64_t request_;
  const uint64_t region_;
  std::mutex mutex_;
  std::condition_variable ended_;
  uint32_t issued_ = 0;
  uint32_t done_ = 0;
  int error_ = 0;
  io::IoRequest* slots_ = nullptr;
  std::vector<uint32_t> free_slots_;  // slots whose request has ended (or never started)
};

}  // namespace

Result<DriveProbe> probe_drive(const BackingDevice& device, io::IoEngine& engine,
                               const DriveProbeOptions& options) {
  const io::IoEngineOptions& engine_options = engine.options();
  DriveProbe out;
  out.direct_io = device.direct_io();
  out.request_bytes =
      align_up(options.request_bytes != 0 ? options.request_bytes : engine_options.block_size,
               device.alignment());
  uint64_t region = std::min(options.region_bytes, device.capacity() / 2);
  region = region / out.request_bytes * out.request_bytes;
  if (region < out.request_bytes) {
    return invalid_argument("drive probe: the NVMe tier (" + std::to_string(device.capacity()) +
                            " bytes) is too small to measure");
  }
  // Capped as the runtime caps NVMe transfers in flight (api/runtime.cpp): deeper queues are
  // never used. Each slot has its own buffer, so also at the region's requests (a deeper queue
  // would read an offset already in flight) and at the buffers' limit (large blocks).
  const uint64_t by_region = region / out.request_bytes;
  const uint64_t by_bytes = std::max<uint64_t>(1, options.max_buffer_bytes / out.request_bytes);
  const auto deepest = static_cast<uint32_t>(std::min<uint64_t>(
      {std::clamp<uint32_t>(
           options.max_queue_depth != 0 ? options.max_queue_depth : engine_options.queue_depth, 1,
           kMaxProbeQueueDepth),
       by_region, by_bytes}));
  STRATA_ASSIGN_OR_RETURN(uint32_t file, engine.register_file(device.fd()), "drive probe");
  const SlotBuffers buffers(engine, out.request_bytes, deepest);
  if (buffers.data() == nullptr) {
    return errno_status(STRATA_E_NOMEM, "drive probe: mapping its request buffers", errno);
  }
  Runner runner(engine, file, buffers, out.request_bytes, region);

  const auto requests = static_cast<uint32_t>(region / out.request_bytes);
  STRATA_ASSIGN_OR_RETURN(double wrote, runner.run(io::IoOp::kWrite, deepest, requests));
  out.write_bytes_per_s = static_cast<double>(region) / std::max(wrote, 1e-9);
  std::vector<uint32_t> depths;
  for (uint32_t depth = 1; depth < deepest; depth *= 2) depths.push_back(depth);
  depths.push_back(deepest);
  for (const uint32_t depth : depths) {
    // Enough requests that the queue is full most of the time (reads wrap around the written
    // region): 16 per slot, at least 32, so that one slow request moves a level by a few percent.
    const uint32_t count = std::max<uint32_t>(32, 16 * depth);
    STRATA_ASSIGN_OR_RETURN(double took, runner.run(io::IoOp::kRead, depth, count));
    DriveProbe::Level level;
    level.queue_depth = depth;
    level.read_bytes_per_s = static_cast<double>(count) * out.request_bytes / std::max(took, 1e-9);
    level.latency_s = depth * static_cast<double>(out.request_bytes) / level.read_bytes_per_s;
    out.levels.push_back(level);
    out.read_bytes_per_s = std::max(out.read_bytes_per_s, level.read_bytes_per_s);
  }
  for (const DriveProbe::Level& level : out.levels) {
    if (level.read_bytes_per_s >= 0.9 * out.read_bytes_per_s) {
      out.knee_queue_depth = level.queue_depth;
      out.knee_latency_s = level.latency_s;
      break;
    }
  }
  return out;
}

}  // namespace strata::storage
