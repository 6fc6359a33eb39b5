// The pinned trace: what the recycler records for `strata bench pool --trace`, and its reader.
#include "memory/pinned_trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "memory/pinned_recycler.h"

namespace strata::memory {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string scratch(const std::string& name) {
  const char* dir = std::getenv("STRATA_TEST_DIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name + "." + std::to_string(::getpid());
}

std::unique_ptr<PinnedArena> dry_arena(uint64_t budget) {
  PinnedArenaOptions options;
  options.budget_bytes = budget;
  options.lock_pages = false;
  Result<std::unique_ptr<PinnedArena>> arena = PinnedArena::create(options);
  EXPECT_TRUE(arena.is_ok()) << arena.status().message();
  return std::move(arena).value();
}

TEST(PinnedTrace, TheRecyclerRecordsEveryTakeAndGiveBackInOrder) {
  const std::string path = scratch("recycler.trace");
  auto arena = dry_arena(16 * kMiB);
  {
    Result<std::unique_ptr<PinnedTraceWriter>> writer = PinnedTraceWriter::open(path, 16 * kMiB);
    ASSERT_TRUE(writer.is_ok()) << writer.status().message();
    PinnedRecycler recycler(*arena, std::move(writer).value());
    Result<PinnedBuffer> a = recycler.take(3 * kMiB + 5, TensorKind::kAdamM);
    ASSERT_TRUE(a.is_ok());
    recycler.give_back(std::move(a).value(), TensorKind::kAdamM);
    Result<PinnedBuffer> b = recycler.take(3 * kMiB + 4000, TensorKind::kGradient);  // the kept one
    ASSERT_TRUE(b.is_ok());
    recycler.give_back(std::move(b).value(), TensorKind::kGradient);
  }
  Result<PinnedTrace> trace = read_pinned_trace(path);
  ASSERT_TRUE(trace.is_ok()) << trace.status().message();
  EXPECT_EQ(trace->budget_bytes, 16 * kMiB);
  ASSERT_EQ(trace->events.size(), 4u);
  const PinnedTraceEvent& first = trace->events[0];
  EXPECT_EQ(first.op, PinnedTraceEvent::Op::kTake);
  EXPECT_EQ(first.bytes, 3 * kMiB + 5);
  EXPECT_EQ(first.reserved, 3 * kMiB + 4096);
  EXPECT_EQ(first.kind, TensorKind::kAdamM);
  EXPECT_FALSE(first.reused);
  EXPECT_EQ(trace->events[1].op, PinnedTraceEvent::Op::kGive);
  EXPECT_EQ(trace->events[1].id, first.id);
  EXPECT_TRUE(trace->events[2].reused);
  EXPECT_EQ(trace->events[2].id, first.id);  // the same buffer, recycled
  EXPECT_EQ(trace->events[2].kind, TensorKind::kGradient);
  std::remove(path.c_str());
}

TEST(PinnedTrace, RecordingIsOffUnlessTheVariableNamesAFile) {
  ::unsetenv(kPinnedTraceVariable);
  EXPECT_EQ(PinnedTraceWriter::from_environment(kMiB), nullptr);
  ::setenv(kPinnedTraceVariable, "", 1);
  EXPECT_EQ(PinnedTraceWriter::from_environment(kMiB), nullptr);
  // A file that cannot be written leaves recording off (and says so) rather than failing a run.
  ::setenv(kPinnedTraceVariable, "/nonexistent-dir/trace", 1);
  EXPECT_EQ(PinnedTraceWriter::from_environment(kMiB), nullptr);
  const std::string path = scratch("env.trace");
  ::setenv(kPinnedTraceVariable, path.c_str(), 1);
  EXPECT_NE(PinnedTraceWriter::from_environment(kMiB), nullptr);
  ::unsetenv(kPinnedTraceVariable);
  std::remove(path.c_str());
}

TEST(PinnedTrace, TheReaderRejectsBadLinesAndGivesOfBuffersNotTaken) {
  const std::string path = scratch("bad.trace");
  auto write = [&](const std::string& text) {
    std::ofstream(path) << text;
    return read_pinned_trace(path);
  };
  Result<PinnedTrace> good = write(
      "# comment\nbudget 100\ntake 7 10 4096 parameter 0 5\ngive 7 4096 parameter\n"
      "take 7 10 4096 adam_m 1 3\n");
  ASSERT_TRUE(good.is_ok()) << good.status().message();
  EXPECT_EQ(good->events.size(), 3u);
  for (const char* bad : {"give 7 4096 parameter\n", "take 7 10 4096 nonsense 0 5\n",
                          "take 7 10 4096 parameter 0\n", "take 7 10 4096 parameter 0 5 extra\n",
                          "take 7 5000 4096 parameter 0 5\n", "frobnicate\n"}) {
    Result<PinnedTrace> r = write(bad);
    EXPECT_EQ(r.status().code(), STRATA_E_INVALID) << bad;
    EXPECT_NE(r.status().message().find(":1: "), std::string::npos) << r.status().message();
  }
  // An id taken twice without a give in between: the second take is the bad line.
  Result<PinnedTrace> twice = write("take 7 10 4096 parameter 0 5\ntake 7 10 4096 parameter 0 5\n");
  EXPECT_EQ(twice.status().code(), STRATA_E_INVALID);
  EXPECT_NE(twice.status().message().find(":2: "), std::string::npos);
  EXPECT_EQ(read_pinned_trace(path + ".missing").status().code(), STRATA_E_IO);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace strata::memory
