// Fault injection for tests, in the spirit of RocksDB's FaultInjectionFileSystem: a FaultPlan
// says which transfers go wrong and how; a FaultInjectingEngine wraps a real engine and applies
// the plan through the engine's TransferHook, so that EAGAIN and short transfers go through the
// real engine's resubmission code and errors through its real error path. Off unless a test (or
// STRATA_FAULTS) asks for it.
//
// Spec: rules separated by ';', each "op:kind[:key=value]...":
//   op    read | write | any
//   kind  eio | enospc   the attempt fails with that errno, without doing its I/O; the request
//                        completes with it once its other blocks drain
//         eagain         the attempt fails with EAGAIN without doing its I/O; the engine retries
//         short          a transfer of 8 KiB or more reports half its bytes (4 KiB multiple);
//                        the engine must continue with the rest
//         stall          the attempt waits ms=N milliseconds (default 50) before it is issued
//         corrupt        (reads) after a successful transfer, a run of bytes=N bytes (default
//                        1) of the buffer is flipped, for checksum tests above the engine
//   every=N              fire on every Nth matching attempt only (default: every one)
//   p=X                  fire with probability X in [0, 1] (after every=), from seed=S
//   offset=A-B           only attempts overlapping file bytes [A, B) (K/M/G suffixes; B optional)
//   count=N              fire at most N times (default: unlimited)
// Example: "write:eio:every=5;read:short:p=0.1;read:corrupt:count=3".
// Matching counts transfer attempts: one per block, plus one per resubmission.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "io/io_engine.h"
#include "io/transfer_hook.h"

namespace strata::io {

enum class FaultOp : uint8_t { kRead, kWrite, kAny };
enum class FaultKind : uint8_t { kEio, kEnospc, kEagain, kShort, kStall, kCorrupt };
inline constexpr size_t kFaultKindCount = 6;

const char* fault_kind_name(FaultKind kind);

struct FaultRule {
  FaultOp op = FaultOp::kAny;
  FaultKind kind = FaultKind::kEio;
  uint64_t every = 1;
  double probability = 1.0;
  uint64_t seed = 1;
  uint64_t offset_begin = 0;
  uint64_t offset_end = std::numeric_limits<uint64_t>::max();
  uint64_t count = 0;  // 0 = unlimited
  uint32_t stall_ms = 50;
  uint32_t corrupt_bytes = 1;
};

struct FaultPlan {
  std::vector<FaultRule> rules;

  bool empty() const { return rules.empty(); }
  // STRATA_E_INVALID naming the offending rule and key.
  static Result<FaultPlan> parse(std::string_view spec);
  // The plan as a spec parse() accepts.
  std::string to_string() const;
};

// The plan in the environment variable (STRATA_FAULTS by default); empty when it is unset.
Result<FaultPlan> fault_plan_from_env(const char* variable = "STRATA_FAULTS");

class FaultInjectingEngine final : public IoEngine, private TransferHook {
 public:
  // STRATA_E_UNSUPPORTED when `inner` has no transfer hook (it is not a Strata engine).
  static Result<std::unique_ptr<FaultInjectingEngine>> wrap(std::unique_ptr<IoEngine> inner,
                                                            FaultPlan plan);
  // Drains and destroys the inner engine first: its threads call this object's hook.
  ~FaultInjectingEngine() override;

  const char* name() const override { return name_.c_str(); }
  const IoEngineOptions& options() const override { return inner_->options(); }
  Result<uint32_t> register_file(int fd) override { return inner_->register_file(fd); }
  Result<int32_t> register_buffer(void* base, uint64_t bytes) override {
    return inner_->register_buffer(base, bytes);
  }
  Status unregister_buffer(int32_t index) override { return inner_->unregister_buffer(index); }
  Status submit(IoRequest* request) override { return inner_->submit(request); }

  // Faults injected so far, by kind: tests compare them with the faults they detected.
  uint64_t injected(FaultKind kind) const {
    return injected_[static_cast<size_t>(kind)].load(std::memory_order_relaxed);
  }
  uint64_t injected_total() const;
  const FaultPlan& plan() const { return plan_; }
  IoEngine& inner() { return *inner_; }

 private:
  struct RuleState {
    uint64_t matches = 0;
    uint64_t fired = 0;
    std::mt19937_64 random;
  };

  explicit FaultInjectingEngine(FaultPlan plan);
  int before_transfer(const TransferAttempt& attempt) override;
  int after_transfer(const TransferAttempt& attempt, int result) override;
  // Whether rule i fires for this attempt; counts the match. Called with mutex_ held.
  bool fires(size_t i, const TransferAttempt& attempt);
  void count(FaultKind kind) {
    injected_[static_cast<size_t>(kind)].fetch_add(1, std::memory_order_relaxed);
  }

  const FaultPlan plan_;
  std::string name_;
  std::mutex mutex_;  // rule states: engines call the hook from several threads
  std::vector<RuleState> states_;
  std::array<std::atomic<uint64_t>, kFaultKindCount> injected_{};
  std::unique_ptr<IoEngine> inner_;
};

}  // namespace strata::io
