// `strata bench copy` through the real program: both directions alone and at once beside memcpy,
// on the emulated device (every machine has it), and bad sizes refused with a message.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace strata {
namespace {

using testing::run_cli;

TEST(CopyBench, ReportsEachDirectionAloneAndAtOnceBesideMemcpy) {
  const testing::CliRun r = run_cli({"bench", "copy", "--backend", "emulated", "--size", "8M",
                                     "--chunk", "1M", "--rounds", "2", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["backend"], "emulated");
  EXPECT_EQ(j["size_bytes"], 8u << 20);
  EXPECT_EQ(j["chunk_bytes"], 1u << 20);
  for (const char* key :
       {"host_to_device_gbps", "device_to_host_gbps", "at_once_host_to_device_gbps",
        "at_once_device_to_host_gbps", "memcpy_gbps"}) {
    EXPECT_GT(j[key].get<double>(), 0) << key;
    EXPECT_EQ(j[std::string(key) + "_rounds"].size(), 2u) << key;
  }
  EXPECT_GT(j["host_to_device_over_memcpy"].get<double>(), 0);
}

TEST(CopyBench, AChunkLargerThanTheSizeCopiesTheSizeInOnePiece) {
  const testing::CliRun r = run_cli({"bench", "copy", "--backend", "emulated", "--size", "3M",
                                     "--chunk", "64M", "--rounds", "1", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["chunk_bytes"], 3u << 20);
}

TEST(CopyBench, TheCudaBackendRunsOnAGpuAndSaysWhyNotElsewhere) {
  const testing::CliRun r =
      run_cli({"bench", "copy", "--backend", "cuda", "--size", "8M", "--rounds", "1", "--json"});
  if (r.code == 0) {
    EXPECT_EQ(nlohmann::json::parse(r.out)["backend"], "cuda");
  } else {
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("strata bench copy: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("CUDA"), std::string::npos) << r.err;
  }
}

TEST(CopyBench, BadSizesAreRefusedWithTheirReason) {
  testing::CliRun r = run_cli({"bench", "copy", "--size", "lots"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--size: lots is not a size"), std::string::npos) << r.err;
  r = run_cli({"bench", "copy", "--size", "8M", "--chunk", "0"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--chunk: not a size: 0"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata
