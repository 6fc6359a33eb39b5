// A modelled drive over a real engine: every request still does its real I/O, but completes no
// earlier than a drive with the given read and write rates would have finished it. Each
// direction is its own lane (full duplex, as NVMe drives nearly are), served in submission
// order. Used to measure how Strata's pipelines behave on a drive unlike the one at hand - e.g.
// that the optimizer step runs at the pace of its slowest stage when reads and writes do not
// share one disk's time, which this project's development VM cannot show. Off unless
// STRATA_PACED_DRIVE asks for it:
//
//   STRATA_PACED_DRIVE="read=0.3G,write=0.25G"   (bytes per second; K/M/G decimal suffixes)
//
// The modelled rates must be below what the real device delivers, or the real device sets the
// pace. Completions run on the engine's pacing thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "io/io_engine.h"

namespace strata::io {

struct DriveModel {
  double read_bytes_per_s = 0;   // > 0
  double write_bytes_per_s = 0;  // > 0
};

// "read=R,write=W" with K/M/G (decimal) suffixes; both keys required.
Result<DriveModel> parse_drive_model(std::string_view spec);
// From STRATA_PACED_DRIVE: nullopt when unset or empty.
Result<std::optional<DriveModel>> drive_model_from_env();

class PacedEngine final : public IoEngine {
 public:
  static Result<std::unique_ptr<PacedEngine>> wrap(std::unique_ptr<IoEngine> inner,
                                                   const DriveModel& model);
  ~PacedEngine() override;
  PacedEngine(const PacedEngine&) = delete;
  PacedEngine& operator=(const PacedEngine&) = delete;

  const char* name() const override { return name_.c_str(); }
  const IoEngineOptions& options() const override { return inner_->options(); }
  Result<uint32_t> register_file(int fd) override { return inner_->register_file(fd); }
  Result<int32_t> register_buffer(void* base, uint64_t bytes) override {
    return inner_->register_buffer(base, bytes);
  }
  Status unregister_buffer(int32_t index) override { return inner_->unregister_buffer(index); }
  Status submit(IoRequest* request) override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    void (*on_complete)(IoRequest*, void*) = nullptr;
    void* context = nullptr;
    Clock::time_point due;
  };
  struct Due {
    Clock::time_point at;
    IoRequest* request;
    bool operator>(const Due& other) const { return at > other.at; }
  };

  PacedEngine(std::unique_ptr<IoEngine> inner, const DriveModel& model);
  static void on_inner_complete(IoRequest* request, void* context);
  void run();

  std::unique_ptr<IoEngine> inner_;
  const DriveModel model_;
  std::string name_;

  std::mutex mutex_;
  std::condition_variable changed_;
  // Guarded by mutex_: when each direction's lane is next free, the requests in flight, and
  // those whose real I/O is done, waiting for their modelled completion time.
  Clock::time_point lane_free_[2];
  std::unordered_map<IoRequest*, Pending> pending_;
  std::priority_queue<Due, std::vector<Due>, std::greater<>> due_;
  bool stopping_ = false;
  std::thread pacer_;
};

}  // namespace strata::io
