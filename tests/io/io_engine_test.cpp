// The engine contract (io_engine.h), checked on every engine: bytes round-trip exactly, requests
// are split and resubmitted invisibly, bad requests are refused, nothing is dropped or completed
// twice, and the queue pushes back instead of growing.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>
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

class IoEngineContract : public EngineTest {};

// Writes and reads back random data at ragged sizes and offsets; checks every byte.
void round_trip_cases(IoEngine& engine) {
  ScratchFile file;
  auto index = engine.register_file(file.fd());
  ASSERT_TRUE(index.is_ok()) << index.status().message();

  const std::vector<std::pair<uint64_t, uint64_t>> cases = {
      {0, 4096},          {4096, 8192},          {12288, 61440},      {131072, 65536},
      {200704, 69632},    {1048576, 1052672},    {3 << 20, 4096 * 3}, {5 << 20, (1 << 20) - 4096},
      {7 << 20, 3 << 20}, {12288 * 7, 4096 * 17}};
  uint64_t seed = 1;
  for (const auto& [offset, length] : cases) {
    AlignedBuffer out(length);
    AlignedBuffer in(length);
    out.fill_random(seed++);
    ASSERT_TRUE(write_sync(engine, *index, out.data(), length, offset).is_ok());
    const Status read = read_sync(engine, *index, in.data(), length, offset);
    ASSERT_TRUE(read.is_ok()) << read.message();
    ASSERT_EQ(std::memcmp(out.data(), in.data(), length), 0)
        << "offset " << offset << " length " << length;
  }
}

// 64 KiB blocks split most requests, many into a ragged last block; 1 MiB blocks (the default)
// take io_uring's one-block-per-submit path.
class RoundTrip : public EngineTest {};

TEST_P(RoundTrip, RandomDataAtManyOddSizesAndOffsetsComesBackExactly) {
  for (const uint32_t block_size : {64U * 1024, 1U << 20}) {
    SCOPED_TRACE("block_size " + std::to_string(block_size));
    auto engine = make(small_options(block_size, 4));
    ASSERT_NE(engine, nullptr);
    round_trip_cases(*engine);
  }
}

TEST_P(IoEngineContract, ReportsTransferredBytesAndClearsErrorOnSuccess) {
  auto engine = make();
  ScratchFile file;
  const uint32_t index = engine->register_file(file.fd()).value();
  AlignedBuffer buffer(300 * size_t{1024});
  buffer.fill_random(7);
  CompletionCounter done;
  IoRequest request;
  request.op = IoOp::kWrite;
  request.file = index;
  request.buffer = buffer.data();
  request.length = buffer.size();
  request.error = 99;  // stale values from a previous use of the struct
  request.transferred = 1;
  done.prepare(request);
  ASSERT_TRUE(engine->submit(&request).is_ok());
  done.wait_for(1);
  EXPECT_EQ(request.error, 0);
  EXPECT_EQ(request.transferred, buffer.size());
}

TEST_P(IoEngineContract, RejectsUnalignedAndInvalidRequestsWithoutCallingBack) {
  auto engine = make();
  ScratchFile file;
  const uint32_t index = engine->register_file(file.fd()).value();
  AlignedBuffer buffer(64 * size_t{1024});
  const int32_t registered = engine->register_buffer(buffer.data(), 16 * uint64_t{1024}).value();

  std::atomic<int> callbacks{0};
  auto request_with = [&](auto edit) {
    IoRequest r;
    r.op = IoOp::kRead;
    r.file = index;
    r.buffer = buffer.data();
    r.length = 8192;
    r.offset = 4096;
    r.context = &callbacks;
    r.on_complete = [](IoRequest*, void* c) { ++*static_cast<std::atomic<int>*>(c); };
    edit(r);
    return r;
  };
  const std::vector<std::pair<const char*, std::function<void(IoRequest&)>>> bad = {
      {"unaligned buffer", [&](IoRequest& r) { r.buffer = buffer.data() + 512; }},
      {"unaligned length", [](IoRequest& r) { r.length = 4095; }},
      {"unaligned offset", [](IoRequest& r) { r.offset = 512; }},
      {"zero length", [](IoRequest& r) { r.length = 0; }},
      {"null buffer", [](IoRequest& r) { r.buffer = nullptr; }},
      {"unknown file", [](IoRequest& r) { r.file = 77; }},
      {"no callback", [](IoRequest& r) { r.on_complete = nullptr; }},
      {"unregistered buffer index", [](IoRequest& r) { r.buffer_index = 5; }},
      {"negative buffer index", [](IoRequest& r) { r.buffer_index = -7; }},
      {"outside registered buffer",
       [&](IoRequest& r) {
         r.buffer_index = registered;
         r.buffer = buffer.data() + 12288;  // 12 KiB + 8 KiB > the 16 KiB registered
       }},
      {"offset overflow", [](IoRequest& r) { r.offset = ~uint64_t{0} - 4095; }},
  };
  for (const auto& [what, edit] : bad) {
    IoRequest r = request_with(edit);
    const Status status = engine->submit(&r);
    EXPECT_EQ(status.code(), STRATA_E_INVALID) << what;
    EXPECT_FALSE(status.message().empty()) << what;
  }
  EXPECT_EQ(engine->submit(nullptr).code(), STRATA_E_INVALID);
  EXPECT_EQ(callbacks.load(), 0);

  // And the valid neighbour of all of them goes through.
  IoRequest good = request_with([&](IoRequest& r) { r.buffer_index = registered; });
  ASSERT_TRUE(::ftruncate(file.fd(), 1 << 20) == 0);
  ASSERT_TRUE(engine->submit(&good).is_ok());
  while (callbacks.load() == 0) {
    std::this_thread::yield();
  }
  EXPECT_EQ(good.error, 0);
}

TEST_P(IoEngineContract, RegisteredAndUnregisteredBuffersMoveTheSameBytes) {
  auto engine = make(small_options(128 * 1024, 8));
  ScratchFile file;
  const uint32_t index = engine->register_file(file.fd()).value();
  constexpr uint64_t kBytes = 2 << 20;
  AlignedBuffer fixed(kBytes);
  AlignedBuffer plain(kBytes);
  auto registered = engine->register_buffer(fixed.data(), kBytes);
  ASSERT_TRUE(registered.is_ok()) << registered.status().message();

  // Write through the registered buffer (a sub-range of it), read back through a plain one.
  fixed.fill_random(11);
  const uint64_t part = kBytes - 8192;
  ASSERT_TRUE(write_sync(*engine, index, fixed.data() + 4096, part, 0, *registered).is_ok());
  ASSERT_TRUE(read_sync(*engine, index, plain.data(), part, 0).is_ok());
  EXPECT_EQ(std::memcmp(fixed.data() + 4096, plain.data(), part), 0);

  // And the other way round.
  plain.fill_random(12);
  ASSERT_TRUE(write_sync(*engine, index, plain.data(), kBytes, 1 << 20).is_ok());
  std::memset(fixed.data(), 0, kBytes);
  ASSERT_TRUE(read_sync(*engine, index, fixed.data(), kBytes, 1 << 20, *registered).is_ok());
  EXPECT_EQ(std::memcmp(fixed.data(), plain.data(), kBytes), 0);

  ASSERT_TRUE(engine->unregister_buffer(*registered).is_ok());
  EXPECT_EQ(engine->unregister_buffer(*registered).code(), STRATA_E_INVALID);
  EXPECT_EQ(read_sync(*engine, index, fixed.data(), 4096, 0, *registered).code(), STRATA_E_INVALID);
  // The slot is reusable.
  auto again = engine->register_buffer(fixed.data(), kBytes);
  ASSERT_TRUE(again.is_ok());
  EXPECT_TRUE(read_sync(*engine, index, fixed.data(), 8192, 0, *again).is_ok());
}

TEST_P(IoEngineContract, RefusesRegisteredBuffersOverOneGiB) {
  auto engine = make();
  // Refused before the kernel sees it, so no memory is needed behind the pointer.
  alignas(4096) static uint8_t anchor[4096];
  const auto too_big = engine->register_buffer(anchor, kMaxRegisteredBufferBytes + 4096);
  EXPECT_EQ(too_big.status().code(), STRATA_E_INVALID);
  EXPECT_EQ(engine->register_buffer(nullptr, 4096).status().code(), STRATA_E_INVALID);
  EXPECT_EQ(engine->register_buffer(anchor, 0).status().code(), STRATA_E_INVALID);
  EXPECT_EQ(engine->register_file(-1).status().code(), STRATA_E_INVALID);
  EXPECT_EQ(engine->register_file(999999).status().code(), STRATA_E_INVALID);
}

TEST_P(IoEngineContract, ManyThreadsSubmittingAtOnceAllComplete) {
  auto engine = make(small_options(32 * 1024, 8, 2));
  ScratchFile file;
  const uint32_t index = engine->register_file(file.fd()).value();
  constexpr size_t kThreads = 4;
  constexpr size_t kPerThread = 24;
  constexpr uint64_t kSlice = 96 * uint64_t{1024};  // each request its own file range
  AlignedBuffer out(kThreads * kPerThread * kSlice);
  AlignedBuffer in(out.size());
  out.fill_random(21);

  auto run = [&](IoOp op, AlignedBuffer& memory) {
    std::vector<IoRequest> requests(kThreads * kPerThread);
    std::vector<std::atomic<int>> calls(requests.size());
    struct Context {
      std::atomic<int>* calls;
      CompletionCounter* counter;
    };
    CompletionCounter counter;
    std::vector<Context> contexts(requests.size());
    std::vector<std::thread> threads;
    threads.reserve(kThreads);
    for (size_t t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (size_t i = 0; i < kPerThread; ++i) {
          const size_t n = t * kPerThread + i;
          // Vary the length so the ragged last blocks differ.
          const uint64_t length = kSlice - 4096 * static_cast<uint64_t>(n % 5);
          IoRequest& r = requests[n];
          r.op = op;
          r.file = index;
          r.buffer = memory.data() + n * kSlice;
          r.length = length;
          r.offset = n * kSlice;
          contexts[n] = {&calls[n], &counter};
          r.context = &contexts[n];
          r.on_complete = [](IoRequest* req, void* c) {
            auto* ctx = static_cast<Context*>(c);
            ctx->calls->fetch_add(1);
            ctx->counter->record(req);
          };
          ASSERT_TRUE(engine->submit(&r).is_ok());
        }
      });
    }
    for (auto& thread : threads) {
      thread.join();
    }
    counter.wait_for(requests.size());
    EXPECT_EQ(counter.failed(), 0u);
    for (size_t n = 0; n < requests.size(); ++n) {
      EXPECT_EQ(calls[n].load(), 1) << "request " << n;
      EXPECT_EQ(requests[n].transferred, requests[n].length);
    }
  };
  run(IoOp::kWrite, out);
  run(IoOp::kRead, in);
  for (size_t n = 0; n < kThreads * kPerThread; ++n) {
    const uint64_t length = kSlice - 4096 * (n % 5);
    ASSERT_EQ(std::memcmp(out.data() + n * kSlice, in.data() + n * kSlice, length), 0) << n;
  }
}

TEST_P(IoEngineContract, SubmitPushesBackWhenTheQueueIsFullAndDropsNothing) {
  constexpr uint32_t kDepth = 2;
  auto engine = make(small_options(4096, kDepth, 1));
  ScratchFile file(1 << 20);
  const uint32_t index = engine->register_file(file.fd()).value();
  constexpr int kRequests = 300;
  AlignedBuffer buffer(4096);
  std::vector<IoRequest> requests(kRequests);
  CompletionCounter counter;
  uint64_t most_outstanding = 0;
  for (int i = 0; i < kRequests; ++i) {
    IoRequest& r = requests[i];
    r.op = IoOp::kRead;
    r.file = index;
    r.buffer = buffer.data();  // concurrent reads into one buffer: only the count matters here
    r.length = 4096;
    r.offset = static_cast<uint64_t>(i % 256) * 4096;
    counter.prepare(r);
    ASSERT_TRUE(engine->submit(&r).is_ok());
    most_outstanding = std::max<uint64_t>(most_outstanding, i + 1 - counter.completed());
  }
  counter.wait_for(kRequests);
  EXPECT_EQ(counter.completed(), static_cast<uint64_t>(kRequests));
  EXPECT_EQ(counter.failed(), 0u);
  // Queued + being issued + in flight stays within a small multiple of the depth (the engines
  // use kDepth queued, up to kDepth staged and kDepth + 1 active), never all 300.
  EXPECT_LE(most_outstanding, 3 * kDepth + 3);
}

TEST_P(IoEngineContract, OnCompleteMaySubmitTheNextRequestWithoutDeadlock) {
  // One worker, depth 1: a callback that blocked on a full queue would wait for itself.
  auto engine = make(small_options(4096, 1, 1));
  ScratchFile file(1 << 20);
  const uint32_t index = engine->register_file(file.fd()).value();
  AlignedBuffer buffer(4096);
  struct Chain {
    IoEngine* engine;
    std::vector<IoRequest> requests;
    std::atomic<int> next{0};
    CompletionCounter counter;
  } chain{engine.get(), std::vector<IoRequest>(64)};
  for (size_t i = 0; i < chain.requests.size(); ++i) {
    IoRequest& r = chain.requests[i];
    r.op = IoOp::kRead;
    r.file = index;
    r.buffer = buffer.data();
    r.length = 4096;
    r.offset = i * 4096;
    r.context = &chain;
    r.on_complete = [](IoRequest* req, void* c) {
      auto* ch = static_cast<Chain*>(c);
      // Each completion submits two more while they last: the queue overflows its bound.
      for (int k = 0; k < 2; ++k) {
        const int n = ch->next.fetch_add(1);
        if (n < static_cast<int>(ch->requests.size())) {
          EXPECT_TRUE(ch->engine->submit(&ch->requests[n]).is_ok());
        }
      }
      ch->counter.record(req);
    };
  }
  chain.next = 1;
  ASSERT_TRUE(engine->submit(&chain.requests[0]).is_ok());
  chain.counter.wait_for(chain.requests.size());
  EXPECT_EQ(chain.counter.failed(), 0u);
}

TEST_P(IoEngineContract, ReadPastEndOfFileFailsWithENODATAAfterTheBytesThatExist) {
  auto engine = make();
  ScratchFile file(8192);
  const uint32_t index = engine->register_file(file.fd()).value();
  AlignedBuffer buffer(16384);
  CompletionCounter done;
  IoRequest r;
  r.op = IoOp::kRead;
  r.file = index;
  r.buffer = buffer.data();
  r.length = 16384;
  done.prepare(r);
  ASSERT_TRUE(engine->submit(&r).is_ok());
  done.wait_for(1);
  EXPECT_EQ(r.error, ENODATA);
  EXPECT_EQ(r.transferred, 8192u);
  const Status status = request_status(r);
  EXPECT_EQ(status.code(), STRATA_E_IO);
  EXPECT_NE(status.message().find("16384"), std::string::npos) << status.message();
}

TEST_P(IoEngineContract, DestructionFinishesEverySubmittedRequest) {
  ScratchFile file(4 << 20);
  AlignedBuffer buffer(4 << 20);
  std::vector<IoRequest> requests(32);
  CompletionCounter counter;
  {
    auto engine = make(small_options(64 * 1024, 4));
    const uint32_t index = engine->register_file(file.fd()).value();
    for (size_t i = 0; i < requests.size(); ++i) {
      IoRequest& r = requests[i];
      r.op = IoOp::kRead;
      r.file = index;
      r.buffer = buffer.data() + i * 131072;
      r.length = 131072;
      r.offset = i * 131072;
      counter.prepare(r);
      ASSERT_TRUE(engine->submit(&r).is_ok());
    }
  }  // destroyed with requests still queued
  EXPECT_EQ(counter.completed(), requests.size());
  EXPECT_EQ(counter.failed(), 0u);
}

TEST_P(IoEngineContract, RejectsOutOfRangeOptions) {
  for (const IoEngineOptions& options :
       {small_options(1000), small_options(0), small_options(2u << 30), small_options(4096, 0),
        small_options(4096, kMaxQueueDepth + 1), small_options(4096, 8, 0),
        small_options(4096, 8, kMaxThreads + 1)}) {
    auto engine = make_io_engine(GetParam(), options);
    EXPECT_EQ(engine.status().code(), STRATA_E_INVALID);
  }
}

STRATA_INSTANTIATE_FOR_ENGINES(IoEngineContract);
STRATA_INSTANTIATE_FOR_ENGINES(RoundTrip);

}  // namespace
}  // namespace strata::io
