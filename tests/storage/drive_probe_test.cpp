// The drive probe (storage/drive_probe.h) against an engine that ends requests out of order, as
// the pread/pwrite engine's several workers do.
#include "storage/drive_probe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "storage/backing_device.h"
#include "storage_test_util.h"

namespace strata::storage {
namespace {

using testing::ForwardingEngine;
using testing::make_engine;
using testing::ScratchDir;

// Ends requests out of order: one that ends while another has yet to end is held until the next
// one has ended, and delivered after it. It also counts submissions of a request object still in
// flight, which the engine contract forbids (the caller owns the request until on_complete).
//
// "Yet to end" is the inner engine's view (outstanding_), not in_flight_, which also holds the
// requests ended and not yet delivered: held while the only other one was such a request (the
// caller had submitted its last request, which ended at once on another thread), a request was
// never delivered, and the probe waited for it until ctest's timeout (seen under TSan).
class ReorderingEngine final : public ForwardingEngine {
 public:
  using ForwardingEngine::ForwardingEngine;
  const char* name() const override { return "reordering"; }

  Status submit(io::IoRequest* request) override {
    {
      std::lock_guard lock(mutex_);
      if (!in_flight_.insert(request).second) ++reused_in_flight_;
      outstanding_.insert(request);
      Route& route = routes_[request];
      route = Route{request->on_complete, request->context};
    }
    request->on_complete = &ReorderingEngine::ended;
    request->context = this;
    return inner_.submit(request);
  }

  int reused_in_flight() {
    std::lock_guard lock(mutex_);
    return reused_in_flight_;
  }

 private:
  struct Route {
    void (*on_complete)(io::IoRequest* request, void* context) = nullptr;
    void* context = nullptr;
  };

  static void ended(io::IoRequest* request, void* context) {
    auto* self = static_cast<ReorderingEngine*>(context);
    std::vector<std::pair<io::IoRequest*, Route>> deliver;
    {
      std::lock_guard lock(self->mutex_);
      const Route route = self->routes_[request];
      self->outstanding_.erase(request);
      if (self->held_ == nullptr && !self->outstanding_.empty()) {
        self->held_ = request;  // another has yet to end: it is delivered first
        return;
      }
      deliver.emplace_back(request, route);
      if (self->held_ != nullptr) {
        deliver.emplace_back(self->held_, self->routes_[self->held_]);
        self->held_ = nullptr;
      }
    }
    for (auto& [ended_request, route] : deliver) {
      {
        std::lock_guard lock(self->mutex_);
        self->in_flight_.erase(ended_request);
      }
      ended_request->on_complete = route.on_complete;
      ended_request->context = route.context;
      route.on_complete(ended_request, route.context);
    }
  }

  std::mutex mutex_;
  std::set<io::IoRequest*> in_flight_;    // submitted, not yet delivered to the caller
  std::set<io::IoRequest*> outstanding_;  // submitted, not yet ended by the inner engine
  std::map<io::IoRequest*, Route> routes_;
  io::IoRequest* held_ = nullptr;
  int reused_in_flight_ = 0;
};

// A swap file of `capacity` bytes in a scratch directory, and a pread/pwrite engine to probe it
// through (wrapped by each test's own engine).
struct Drive {
  explicit Drive(uint64_t capacity)
      : device(BackingDevice::open({.swap_dir = dir.path(), .capacity_bytes = capacity})),
        engine(make_engine(io::IoEngineKind::kPsync)) {}
  ScratchDir dir;  // first: the device's file lives in it
  Result<BackingDevice> device;
  Result<std::unique_ptr<io::IoEngine>> engine;
};

// The probe used to reuse the request slot "issued % depth" as soon as any request had ended:
// with requests ending out of order it overwrote one still in flight (config_fuzz, psync engine:
// a null on_complete called). A slot is now free only when its own request has ended.
TEST(DriveProbe, RequestsEndingOutOfOrderNeverHaveTheirSlotReused) {
  Drive drive(16ull << 20);
  ASSERT_TRUE(drive.device.is_ok()) << drive.device.status().message();
  ASSERT_TRUE(drive.engine.is_ok()) << drive.engine.status().message();
  ReorderingEngine reordering(**drive.engine);

  DriveProbeOptions options;
  options.region_bytes = 4ull << 20;
  options.request_bytes = 256 << 10;
  options.max_queue_depth = 4;
  Result<DriveProbe> probe = probe_drive(*drive.device, reordering, options);
  ASSERT_TRUE(probe.is_ok()) << probe.status().message();
  EXPECT_EQ(reordering.reused_in_flight(), 0);
  EXPECT_GT(probe->write_bytes_per_s, 0);
  ASSERT_EQ(probe->levels.size(), 3u);  // depths 1, 2, 4
  for (const DriveProbe::Level& level : probe->levels) EXPECT_GT(level.read_bytes_per_s, 0);
}

// Counts the bytes registered as fixed buffers: the probe's slots, all resident while it runs.
class RegistrationCountingEngine final : public ForwardingEngine {
 public:
  using ForwardingEngine::ForwardingEngine;
  const char* name() const override { return "registration-counting"; }
  Result<int32_t> register_buffer(void* base, uint64_t bytes) override {
    largest_ = std::max(largest_, bytes);
    return ForwardingEngine::register_buffer(base, bytes);
  }
  uint64_t largest() const { return largest_; }

 private:
  uint64_t largest_ = 0;
};

// config_fuzz: block_size 64 MiB with queue_depth 64 had the probe map, write and register
// 4 GiB of slot buffers to create a runtime. The slots are now at most the region's requests
// and within max_buffer_bytes, and the levels stop at that depth.
TEST(DriveProbe, ItsBuffersStayWithinTheRegionAndTheirLimitWhateverTheBlock) {
  Drive drive(64ull << 20);
  ASSERT_TRUE(drive.device.is_ok()) << drive.device.status().message();
  ASSERT_TRUE(drive.engine.is_ok()) << drive.engine.status().message();
  struct Case {
    uint64_t request, max_buffer;
    uint32_t deepest;
  };
  // A 32 MiB region: 4 requests of 8 MiB; 8 of 4 MiB, but only 3 within 12 MiB of buffers.
  for (const Case c : {Case{8ull << 20, kMaxProbeBufferBytes, 4}, Case{4ull << 20, 12ull << 20, 3},
                       Case{32ull << 20, 1ull << 20, 1}}) {
    RegistrationCountingEngine counting(**drive.engine);
    DriveProbeOptions options;
    options.region_bytes = 32ull << 20;
    options.request_bytes = c.request;
    options.max_queue_depth = 64;
    options.max_buffer_bytes = c.max_buffer;
    Result<DriveProbe> probe = probe_drive(*drive.device, counting, options);
    ASSERT_TRUE(probe.is_ok()) << probe.status().message();
    ASSERT_FALSE(probe->levels.empty());
    EXPECT_EQ(probe->levels.back().queue_depth, c.deepest) << c.request;
    EXPECT_EQ(counting.largest(), c.request * c.deepest);  // one buffer, every slot's
  }
}

}  // namespace
}  // namespace strata::storage
