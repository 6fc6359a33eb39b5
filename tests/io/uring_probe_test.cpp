// The probe and the factory agree with each other and with the kernel: what the probe reports
// available can be built, what it reports missing is refused with its reason.
#include "io/uring_probe.h"

#include <gtest/gtest.h>
#include <sys/utsname.h>

#include <string>

#include "io/engine_factory.h"
#include "io/psync_engine.h"
#include "io_test_util.h"

namespace strata::io {
namespace {

TEST(UringProbe, ReportsTheRunningKernelAndAReason) {
  const UringSupport support = probe_uring();
  utsname name{};
  ASSERT_EQ(::uname(&name), 0);
  EXPECT_EQ(support.kernel, name.release);
  EXPECT_FALSE(support.reason.empty());
  if (!support.available) {
    EXPECT_FALSE(support.single_issuer_defer_taskrun);
    EXPECT_FALSE(support.coop_taskrun);
  }
  // DEFER_TASKRUN (6.1) arrived after COOP_TASKRUN (5.19): a kernel with the first has both.
  if (support.single_issuer_defer_taskrun) {
    EXPECT_TRUE(support.coop_taskrun);
  }
}

TEST(UringProbe, FactoryFollowsTheProbe) {
  const UringSupport support = probe_uring();
  const IoEngineOptions options = testing::small_options();
  auto uring = make_io_engine(IoEngineKind::kUring, options);
  auto automatic = make_io_engine(IoEngineKind::kAuto, options);
  ASSERT_TRUE(automatic.is_ok()) << automatic.status().message();
  if (support.available) {
    ASSERT_TRUE(uring.is_ok()) << uring.status().message();
    const std::string name = (*uring)->name();
    EXPECT_EQ(name.rfind("io_uring", 0), 0u) << name;
    // The engine picks the best flags the probe found accepted.
    if (support.single_issuer_defer_taskrun) {
      EXPECT_NE(name.find("single_issuer+defer_taskrun"), std::string::npos) << name;
    } else if (support.coop_taskrun) {
      EXPECT_NE(name.find("coop_taskrun"), std::string::npos) << name;
    }
    EXPECT_EQ(name.find("no fixed buffers") == std::string::npos, support.sparse_buffers) << name;
    EXPECT_EQ(std::string((*automatic)->name()).rfind("io_uring", 0), 0u);
  } else {
    EXPECT_EQ(uring.status().code(), STRATA_E_UNSUPPORTED);
    EXPECT_NE(uring.status().message().find(support.reason), std::string::npos);
    EXPECT_STREQ((*automatic)->name(), "psync");
  }
  auto psync = make_io_engine(IoEngineKind::kPsync, options);
  ASSERT_TRUE(psync.is_ok());
  EXPECT_STREQ((*psync)->name(), "psync");
}

TEST(EngineFactory, ParsesEngineNames) {
  EXPECT_EQ(parse_io_engine_kind("auto"), IoEngineKind::kAuto);
  EXPECT_EQ(parse_io_engine_kind("uring"), IoEngineKind::kUring);
  EXPECT_EQ(parse_io_engine_kind("io_uring"), IoEngineKind::kUring);
  EXPECT_EQ(parse_io_engine_kind("psync"), IoEngineKind::kPsync);
  EXPECT_EQ(parse_io_engine_kind("aio"), std::nullopt);
  EXPECT_EQ(parse_io_engine_kind(""), std::nullopt);
  for (IoEngineKind kind : {IoEngineKind::kAuto, IoEngineKind::kUring, IoEngineKind::kPsync}) {
    EXPECT_EQ(parse_io_engine_kind(io_engine_kind_name(kind)), kind);
  }
}

}  // namespace
}  // namespace strata::io
