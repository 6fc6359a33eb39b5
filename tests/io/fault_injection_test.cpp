// Fault injection drives the engines' real error and resubmission paths: injected errors reach
// the caller with the right errno and code, injected EAGAIN and short transfers are retried until
// every byte has moved, corruption is visible to whoever checks, and the counters say how many
// faults went in so that tests above can compare injected with detected.
#include "io/fault_injection.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <vector>

#include "io/io_limits.h"
#include "io_test_util.h"

namespace strata::io {
namespace {

using testing::AlignedBuffer;
using testing::CompletionCounter;
using testing::EngineTest;
using testing::ScratchFile;
using testing::small_options;

TEST(FaultPlanSpec, ParsesEveryKindAndKey) {
  auto plan = FaultPlan::parse(
      "write:eio:every=5; read:short:p=0.1:seed=9 ;read:corrupt:count=3:bytes=4;"
      "any:stall:ms=7:offset=1M-2M;any:eagain:offset=4K-;write:enospc;");
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  ASSERT_EQ(plan->rules.size(), 6u);
  const auto& r = plan->rules;
  EXPECT_EQ(r[0].op, FaultOp::kWrite);
  EXPECT_EQ(r[0].kind, FaultKind::kEio);
  EXPECT_EQ(r[0].every, 5u);
  EXPECT_EQ(r[1].kind, FaultKind::kShort);
  EXPECT_DOUBLE_EQ(r[1].probability, 0.1);
  EXPECT_EQ(r[1].seed, 9u);
  EXPECT_EQ(r[2].kind, FaultKind::kCorrupt);
  EXPECT_EQ(r[2].count, 3u);
  EXPECT_EQ(r[2].corrupt_bytes, 4u);
  EXPECT_EQ(r[3].op, FaultOp::kAny);
  EXPECT_EQ(r[3].stall_ms, 7u);
  EXPECT_EQ(r[3].offset_begin, 1u << 20);
  EXPECT_EQ(r[3].offset_end, 2u << 20);
  EXPECT_EQ(r[4].offset_begin, 4096u);
  EXPECT_EQ(r[5].kind, FaultKind::kEnospc);

  // to_string() gives a spec that parses back to the same plan.
  auto again = FaultPlan::parse(plan->to_string());
  ASSERT_TRUE(again.is_ok()) << plan->to_string();
  EXPECT_EQ(again->to_string(), plan->to_string());
  EXPECT_TRUE(FaultPlan::parse("").value().empty());
}

TEST(FaultPlanSpec, RejectsMalformedRulesNamingThem) {
  for (const char* spec :
       {"write", "write:boom", "sideways:eio", "read:eio:every=0", "read:eio:p=1.5", "read:eio:p=x",
        "write:corrupt", "read:eio:offset=2M-1M", "read:eio:colour=red", "read:eio:count",
        "read:stall:ms=999999"}) {
    auto plan = FaultPlan::parse(spec);
    ASSERT_FALSE(plan.is_ok()) << spec;
    EXPECT_EQ(plan.status().code(), STRATA_E_INVALID) << spec;
    EXPECT_NE(plan.status().message().find("fault rule"), std::string::npos) << spec;
  }
}

// setenv is not thread-safe; this test runs before any engine thread exists.
// NOLINTBEGIN(concurrency-mt-unsafe)
TEST(FaultPlanSpec, ReadsTheEnvironment) {
  ::unsetenv("STRATA_FAULTS_TEST");
  EXPECT_TRUE(fault_plan_from_env("STRATA_FAULTS_TEST").value().empty());
  ::setenv("STRATA_FAULTS_TEST", "read:eio:count=2", 1);
  auto plan = fault_plan_from_env("STRATA_FAULTS_TEST");
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(plan->rules.size(), 1u);
  ::setenv("STRATA_FAULTS_TEST", "read:nope", 1);
  auto bad = fault_plan_from_env("STRATA_FAULTS_TEST");
  EXPECT_EQ(bad.status().code(), STRATA_E_INVALID);
  EXPECT_NE(bad.status().message().find("$STRATA_FAULTS_TEST"), std::string::npos);
  ::unsetenv("STRATA_FAULTS_TEST");
}
// NOLINTEND(concurrency-mt-unsafe)

TEST(FaultInjectingEngineWrap, RefusesAnEngineWithoutTransferHook) {
  class Opaque final : public IoEngine {
   public:
    const char* name() const override { return "opaque"; }
    const IoEngineOptions& options() const override { return options_; }
    Result<uint32_t> register_file(int) override { return 0u; }
    Result<int32_t> register_buffer(void*, uint64_t) override { return 0; }
    Status unregister_buffer(int32_t) override { return Status::ok(); }
    Status submit(IoRequest*) override { return Status::ok(); }

   private:
    IoEngineOptions options_;
  };
  auto wrapped = FaultInjectingEngine::wrap(std::make_unique<Opaque>(), FaultPlan{});
  EXPECT_EQ(wrapped.status().code(), STRATA_E_UNSUPPORTED);
}

// Fault tests run on both engines: each has its own resubmission code to exercise.
class FaultInjection : public EngineTest {
 protected:
  std::unique_ptr<FaultInjectingEngine> make_faulty(const char* spec,
                                                    const IoEngineOptions& options) {
    auto plan = FaultPlan::parse(spec);
    EXPECT_TRUE(plan.is_ok()) << plan.status().message();
    auto wrapped = FaultInjectingEngine::wrap(make(options), std::move(plan).value());
    EXPECT_TRUE(wrapped.is_ok()) << wrapped.status().message();
    return std::move(wrapped).value();
  }
};

TEST_P(FaultInjection, InjectedEioFailsExactlyThoseWritesWithEIO) {
  auto engine = make_faulty("write:eio:every=3", small_options(64 * 1024));
  EXPECT_NE(std::string(engine->name()).find("faults("), std::string::npos);
  ScratchFile file;
  const uint32_t index = engine->register_file(file.fd()).value();
  AlignedBuffer data(64 * size_t{1024});  // one block per request: one attempt per request
  data.fill_random(3);
  int failed = 0;
  for (int i = 0; i < 9; ++i) {
    const Status status = write_sync(*engine, index, data.data(), data.size(), i * data.size());
    if (!status) {
      ++failed;
      EXPECT_EQ(status.code(), STRATA_E_IO);
      EXPECT_NE(status.message().find("errno 5"), std::string::npos) << status.message();
      EXPECT_EQ(i % 3, 2) << "every=3 fires on the 3rd, 6th, 9th write";
    }
  }
  EXPECT_EQ(failed, 3);
  EXPECT_EQ(engine->injected(FaultKind::kEio), 3u);
  EXPECT_EQ(engine->injected_total(), 3u);
}

TEST_P(FaultInjection, InjectedEnospcSurfacesAsNoSpaceWithErrno) {
  auto engine = make_faulty("write:enospc:count=1", small_options());
  ScratchFile file;
  const uint32_t index = engine->register_file(file.fd()).value();
  AlignedBuffer data(8192);
  CompletionCounter done;
  IoRequest r;
  r.op = IoOp::kWrite;
  r.file = index;
  r.buffer = data.data();
  r.length = data.size();
  done.prepare(r);
  ASSERT_TRUE(engine->submit(&r).is_ok());
  done.wait_for(1);
  EXPECT_EQ(r.error, ENOSPC);
  EXPECT_EQ(r.transferred, 0u);  // the failing attempt did no I/O
  EXPECT_EQ(request_status(r).code(), STRATA_E_NOSPACE);
  // count=1: the next write goes through.
  EXPECT_TRUE(write_sync(*engine, index, data.data(), data.size(), 0).is_ok());
  EXPECT_EQ(engine->injected(FaultKind::kEnospc), 1u);
}

TEST_P(FaultInjection, ErrorInOneBlockFailsTheRequestAfterItsOtherBlocksDrain) {
  // 1 MiB in 64 KiB blocks; the block at 512 KiB fails.
  auto engine = make_faulty("read:eio:offset=512K-576K", small_options(64 * 1024, 8));
  ScratchFile file(1 << 20);
  const uint32_t index = engine->register_file(file.fd()).value();
  AlignedBuffer buffer(1 << 20);
  std::atomic<int> calls{0};
  IoRequest r;
  r.op = IoOp::kRead;
  r.file = index;
  r.buffer = buffer.data();
  r.length = 1 << 20;
  r.context = &calls;
  r.on_complete = [](IoRequest*, void* c) { ++*static_cast<std::atomic<int>*>(c); };
  ASSERT_TRUE(engine->submit(&r).is_ok());
  while (calls.load() == 0) {
    std::this_thread::yield();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a second callback would land
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(r.error, EIO);
  // Blocks before the failure may have moved; the failing one and those never issued did not.
  EXPECT_GE(r.transferred, 0u);
  EXPECT_LE(r.transferred, (1u << 20) - 64 * 1024);
  EXPECT_EQ(r.transferred % 4096, 0u);
  EXPECT_EQ(engine->injected(FaultKind::kEio), 1u);
}

// Writes then reads a pattern through `engine` in requests of several blocks; checks every byte.
void round_trip_through(IoEngine& engine, uint64_t seed) {
  ScratchFile file;
  const uint32_t index = engine.register_file(file.fd()).value();
  constexpr uint64_t kBytes = 3 << 20;
  AlignedBuffer out(kBytes);
  AlignedBuffer in(kBytes);
  out.fill_random(seed);
  const uint64_t piece = 768 * uint64_t{1024};
  std::vector<IoRequest> requests(kBytes / piece);
  for (IoOp op : {IoOp::kWrite, IoOp::kRead}) {
    CompletionCounter counter;
    for (size_t i = 0; i < requests.size(); ++i) {
      IoRequest& r = requests[i];
      r = IoRequest{};
      r.op = op;
      r.file = index;
      r.buffer = (op == IoOp::kWrite ? out.data() : in.data()) + i * piece;
      r.length = piece;
      r.offset = i * piece;
      counter.prepare(r);
      ASSERT_TRUE(engine.submit(&r).is_ok());
    }
    counter.wait_for(requests.size());
    for (const IoRequest& r : requests) {
      ASSERT_EQ(r.error, 0) << std::system_category().message(r.error);
      ASSERT_EQ(r.transferred, piece);
    }
  }
  ASSERT_EQ(std::memcmp(out.data(), in.data(), kBytes), 0);
}

TEST_P(FaultInjection, ShortTransfersAreContinuedUntilEveryByteMoved) {
  // Every attempt of 8 KiB or more reports half: each 64 KiB block takes 5 attempts.
  auto engine = make_faulty("any:short", small_options(64 * 1024, 8));
  round_trip_through(*engine, 31);
  // 48 blocks each way, 4 truncated attempts per block.
  EXPECT_EQ(engine->injected(FaultKind::kShort), 2u * 48 * 4);
}

TEST_P(FaultInjection, ShortTransfersOfLargeBlocksAreContinued) {
  // 1 MiB blocks: io_uring's one-submit-per-block path; 768 KiB requests, one block each.
  auto engine = make_faulty("any:short:every=2", small_options(1 << 20, 8));
  round_trip_through(*engine, 35);
  EXPECT_GT(engine->injected(FaultKind::kShort), 0u);
}

TEST_P(FaultInjection, EagainIsRetriedUntilEveryByteMoved) {
  auto engine = make_faulty("any:eagain:every=2", small_options(64 * 1024, 8));
  round_trip_through(*engine, 32);
  // Every second attempt (counted over all blocks) is refused and retried. 96 blocks succeed;
  // the last attempt must be one that succeeds, so 96 + 95 attempts, 95 of them refused.
  EXPECT_EQ(engine->injected(FaultKind::kEagain), 95u);
}

TEST_P(FaultInjection, RandomShortAndEagainMixStillDeliversEveryByte) {
  auto engine = make_faulty("any:short:p=0.4:seed=5;any:eagain:p=0.3:seed=6",
                            small_options(32 * 1024, 16, 3));
  round_trip_through(*engine, 33);
  EXPECT_GT(engine->injected(FaultKind::kShort), 0u);
  EXPECT_GT(engine->injected(FaultKind::kEagain), 0u);
}

TEST_P(FaultInjection, EndlessEagainGivesUpWithEagainInsteadOfSpinning) {
  auto engine = make_faulty("read:eagain", small_options());
  ScratchFile file(8192);
  const uint32_t index = engine->register_file(file.fd()).value();
  AlignedBuffer buffer(4096);
  const Status status = read_sync(*engine, index, buffer.data(), 4096, 0);
  EXPECT_EQ(status.code(), STRATA_E_IO);
  EXPECT_NE(status.message().find("errno 11"), std::string::npos) << status.message();
  EXPECT_EQ(engine->injected(FaultKind::kEagain), kMaxRetriesWithoutProgress + 1);
}

TEST_P(FaultInjection, CorruptionFlipsBytesOfExactlyTheCountedReads) {
  auto engine = make_faulty("read:corrupt:count=3:bytes=2", small_options(64 * 1024));
  ScratchFile file;
  const uint32_t index = engine->register_file(file.fd()).value();
  AlignedBuffer original(64 * size_t{1024});
  original.fill_random(41);
  ASSERT_TRUE(write_sync(*engine, index, original.data(), original.size(), 0).is_ok());
  int detected = 0;
  for (int i = 0; i < 6; ++i) {
    AlignedBuffer back(original.size());
    ASSERT_TRUE(read_sync(*engine, index, back.data(), back.size(), 0).is_ok());
    if (std::memcmp(back.data(), original.data(), original.size()) != 0) {
      ++detected;
    }
  }
  EXPECT_EQ(engine->injected(FaultKind::kCorrupt), 3u);
  EXPECT_EQ(detected, 3);
  // The data on disk is intact: corruption happens on the way back only.
  AlignedBuffer clean(original.size());
  ASSERT_TRUE(read_sync(*engine, index, clean.data(), clean.size(), 0).is_ok());
  EXPECT_EQ(std::memcmp(clean.data(), original.data(), original.size()), 0);
}

TEST_P(FaultInjection, StallDelaysTheTransfer) {
  auto engine = make_faulty("read:stall:ms=40:count=1", small_options());
  ScratchFile file(8192);
  const uint32_t index = engine->register_file(file.fd()).value();
  AlignedBuffer buffer(4096);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(read_sync(*engine, index, buffer.data(), 4096, 0).is_ok());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(40));
  EXPECT_EQ(engine->injected(FaultKind::kStall), 1u);
}

TEST_P(FaultInjection, EmptyPlanInjectsNothing) {
  auto engine = make_faulty("", small_options(64 * 1024, 8));
  round_trip_through(*engine, 34);
  EXPECT_EQ(engine->injected_total(), 0u);
}

STRATA_INSTANTIATE_FOR_ENGINES(FaultInjection);

}  // namespace
}  // namespace strata::io
