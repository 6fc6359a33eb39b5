#include "storage/drive_probe.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "common/align.h"

namespace strata::storage {
namespace {

using Clock = std::chrono::steady_clock;

// Keeps `depth` requests of the same size in flight over [0, region) until `count` have ended;
// the seconds it took.
class Runner {
 public:
  Runner(io::IoEngine& engine, uint32_t file, void* buffer, uint64_t request, uint64_t region)
      : engine_(engine), file_(file), buffer_(buffer), request_(request), region_(region) {}

  Result<double> run(io::IoOp op, uint32_t depth, uint32_t count) {
    std::vector<io::IoRequest> slots(depth);
    issued_ = done_ = 0;
    error_ = 0;
    const auto start = Clock::now();
    std::unique_lock lock(mutex_);
    for (;;) {
      while (issued_ < count && issued_ - done_ < depth && error_ == 0) {
        io::IoRequest& r = slots[issued_ % depth];
        r = io::IoRequest{};
        r.op = op;
        r.file = file_;
        r.buffer = buffer_;
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
    self->ended_.notify_one();
  }

  io::IoEngine& engine_;
  const uint32_t file_;
  void* const buffer_;
  const uint64_t request_;
  const uint64_t region_;
  std::mutex mutex_;
  std::condition_variable ended_;
  uint32_t issued_ = 0;
  uint32_t done_ = 0;
  int error_ = 0;
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
  const uint32_t deepest = std::max<uint32_t>(
      1, options.max_queue_depth != 0 ? options.max_queue_depth : engine_options.queue_depth);
  uint64_t region = std::min(options.region_bytes, device.capacity() / 2);
  region = region / out.request_bytes * out.request_bytes;
  if (region < out.request_bytes) {
    return invalid_argument("drive probe: the NVMe tier (" + std::to_string(device.capacity()) +
                            " bytes) is too small to measure");
  }
  STRATA_ASSIGN_OR_RETURN(uint32_t file, engine.register_file(device.fd()), "drive probe");
  void* raw = std::aligned_alloc(device.memory_alignment(), out.request_bytes);
  if (raw == nullptr) return Status::error(STRATA_E_NOMEM, "drive probe: no request buffer");
  const std::unique_ptr<void, decltype(&std::free)> buffer(raw, &std::free);
  std::memset(raw, 0x5A, out.request_bytes);  // written bytes, not a file's unwritten extents
  Runner runner(engine, file, raw, out.request_bytes, region);

  const auto requests = static_cast<uint32_t>(region / out.request_bytes);
  STRATA_ASSIGN_OR_RETURN(double wrote, runner.run(io::IoOp::kWrite, deepest, requests));
  out.write_bytes_per_s = static_cast<double>(region) / std::max(wrote, 1e-9);
  std::vector<uint32_t> depths;
  for (uint32_t depth = 1; depth < deepest; depth *= 2) depths.push_back(depth);
  depths.push_back(deepest);
  for (const uint32_t depth : depths) {
    // Enough requests that the queue is full most of the time, within the written region.
    const uint32_t count = std::min(requests, std::max<uint32_t>(16, 8 * depth));
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
