// The modelled drive: it parses its spec strictly, never completes a request before a drive of
// the modelled rate could have, keeps the two directions apart (full duplex), and moves the same
// bytes as the engine it wraps.
#include "io/paced_engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "io_test_util.h"

namespace strata::io {
namespace {

using testing::AlignedBuffer;
using testing::ScratchFile;
using testing::small_options;
using Clock = std::chrono::steady_clock;

TEST(DriveModelSpec, ParsesRatesWithDecimalSuffixes) {
  Result<DriveModel> m = parse_drive_model("read=0.3G,write=250M");
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_DOUBLE_EQ(m->read_bytes_per_s, 0.3e9);
  EXPECT_DOUBLE_EQ(m->write_bytes_per_s, 250e6);
}

TEST(DriveModelSpec, RejectsMalformedSpecsNamingTheProblem) {
  for (const char* bad :
       {"", "read=1G", "write=1G", "read=1G,write=0", "read=1G,write=-2M", "read=fast,write=1G",
        "read=1G,write=1T", "read=1G,write=1G,iops=5", "read1G,write=1G"}) {
    Result<DriveModel> m = parse_drive_model(bad);
    EXPECT_FALSE(m.is_ok()) << bad;
    EXPECT_EQ(m.status().code(), STRATA_E_INVALID) << bad;
    EXPECT_NE(m.status().message().find("read=RATE,write=RATE"), std::string::npos) << bad;
  }
}

TEST(DriveModelSpec, ReadsTheEnvironmentAndIsOffWithoutIt) {
  ::unsetenv("STRATA_PACED_DRIVE");
  Result<std::optional<DriveModel>> off = drive_model_from_env();
  ASSERT_TRUE(off.is_ok());
  EXPECT_FALSE(off->has_value());
  ::setenv("STRATA_PACED_DRIVE", "read=1G,write=2G", 1);
  Result<std::optional<DriveModel>> on = drive_model_from_env();
  ::unsetenv("STRATA_PACED_DRIVE");
  ASSERT_TRUE(on.is_ok());
  ASSERT_TRUE(on->has_value());
  EXPECT_DOUBLE_EQ((*on)->write_bytes_per_s, 2e9);
  ::setenv("STRATA_PACED_DRIVE", "read=1G", 1);
  EXPECT_EQ(drive_model_from_env().status().code(), STRATA_E_INVALID);
  ::unsetenv("STRATA_PACED_DRIVE");
}

std::unique_ptr<PacedEngine> paced(double read, double write) {
  auto inner = make_io_engine(IoEngineKind::kPsync, small_options());
  EXPECT_TRUE(inner.is_ok()) << inner.status().message();
  auto engine = PacedEngine::wrap(std::move(inner).value(), DriveModel{read, write});
  EXPECT_TRUE(engine.is_ok()) << engine.status().message();
  return std::move(engine).value();
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(PacedEngine, NoRequestCompletesBeforeTheModelledDriveCould) {
  // 4 MiB at 40 MB/s: at least 0.105 s, whatever the real device does.
  auto engine = paced(40e6, 40e6);
  ScratchFile file;
  const uint32_t index = engine->register_file(file.fd()).value();
  AlignedBuffer data(4 << 20);
  data.fill_random(7);
  auto start = Clock::now();
  ASSERT_TRUE(write_sync(*engine, index, data.data(), data.size(), 0).is_ok());
  EXPECT_GE(seconds_since(start), 0.104);
  AlignedBuffer back(4 << 20);
  start = Clock::now();
  ASSERT_TRUE(read_sync(*engine, index, back.data(), back.size(), 0).is_ok());
  EXPECT_GE(seconds_since(start), 0.104);
  EXPECT_EQ(std::memcmp(data.data(), back.data(), data.size()), 0);
  EXPECT_NE(std::string(engine->name()).find("paced"), std::string::npos);
}

TEST(PacedEngine, RequestsInOneDirectionQueueBehindEachOther) {
  // Two 2 MiB writes submitted together at 40 MB/s: the second completes after both services.
  auto engine = paced(1e12, 40e6);
  ScratchFile file;
  const uint32_t index = engine->register_file(file.fd()).value();
  AlignedBuffer data(4 << 20);
  data.fill_random(9);
  testing::CompletionCounter done;
  IoRequest first{}, second{};
  for (IoRequest* r : {&first, &second}) {
    r->op = IoOp::kWrite;
    r->file = index;
    r->length = 2 << 20;
    done.prepare(*r);
  }
  first.buffer = data.data();
  first.offset = 0;
  second.buffer = data.data() + (2 << 20);
  second.offset = 2 << 20;
  const auto start = Clock::now();
  ASSERT_TRUE(engine->submit(&first).is_ok());
  ASSERT_TRUE(engine->submit(&second).is_ok());
  done.wait_for(2);
  EXPECT_GE(seconds_since(start), 0.104);
  EXPECT_EQ(first.error, 0);
  EXPECT_EQ(second.error, 0);
}

}  // namespace
}  // namespace strata::io
