#include "storage/backing_device.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <fstream>

#include "common/align.h"
#include "storage_test_util.h"

namespace strata::storage {
namespace {

using testing::ScratchDir;

constexpr uint64_t kCapacity = 8ull << 20;

BackingDeviceOptions swap_options(const ScratchDir& dir, const std::string& name = "") {
  BackingDeviceOptions options;
  options.swap_dir = dir.path();
  options.swap_file_name = name;
  options.capacity_bytes = kCapacity;
  return options;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(BackingDevice, SwapFileIsPrivateAndPreallocated) {
  ScratchDir dir;
  auto device = BackingDevice::open(swap_options(dir));
  ASSERT_TRUE(device.is_ok()) << device.status().message();
  EXPECT_EQ(device->capacity(), kCapacity);
  EXPECT_TRUE(device->direct_io()) << "ext4 under the build tree supports O_DIRECT";
  EXPECT_FALSE(device->is_raw_device());

  struct stat st {};
  ASSERT_EQ(::stat(device->path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "no other user may read spilled tensors";
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), kCapacity);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, kCapacity) << "space reserved up front";
  EXPECT_EQ(st.st_uid, ::geteuid());

  const int flags = ::fcntl(device->fd(), F_GETFL);
  EXPECT_NE(flags & O_DIRECT, 0);
  EXPECT_NE(::fcntl(device->fd(), F_GETFD) & FD_CLOEXEC, 0);
}

TEST(BackingDevice, AlignmentIsAPowerOfTwoOfAtLeast4096) {
  ScratchDir dir;
  auto device = BackingDevice::open(swap_options(dir));
  ASSERT_TRUE(device.is_ok()) << device.status().message();
  EXPECT_GE(device->alignment(), 4096u);
  EXPECT_GE(device->memory_alignment(), 4096u);
  EXPECT_TRUE(is_power_of_two(device->alignment()));
  EXPECT_TRUE(is_power_of_two(device->memory_alignment()));
  EXPECT_EQ(device->capacity() % device->alignment(), 0u);
}

TEST(BackingDevice, SwapFileIsRemovedOnClose) {
  ScratchDir dir;
  std::string path;
  {
    auto device = BackingDevice::open(swap_options(dir));
    ASSERT_TRUE(device.is_ok()) << device.status().message();
    path = device->path();
    EXPECT_EQ(::access(path.c_str(), F_OK), 0);
    // Moving the handle moves the ownership: the file survives the moved-from object.
    BackingDevice moved = std::move(device).value();
    EXPECT_EQ(::access(path.c_str(), F_OK), 0);
  }
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
  EXPECT_TRUE(dir.entries().empty());
}

TEST(BackingDevice, SwapFileIsKeptWhenAsked) {
  ScratchDir dir;
  BackingDeviceOptions options = swap_options(dir, "kept.swap");
  options.keep = true;
  {
    auto device = BackingDevice::open(options);
    ASSERT_TRUE(device.is_ok()) << device.status().message();
    EXPECT_TRUE(device->kept());
    EXPECT_TRUE(device->close().is_ok());
  }
  struct stat st {};
  ASSERT_EQ(::stat(dir.file("kept.swap").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), kCapacity);
}

TEST(BackingDevice, ExistingFileIsRefusedAndLeftAlone) {
  ScratchDir dir;
  write_text(dir.file("taken.swap"), "someone else's data");
  auto device = BackingDevice::open(swap_options(dir, "taken.swap"));
  ASSERT_FALSE(device.is_ok());
  EXPECT_EQ(device.status().code(), STRATA_E_INVALID);
  EXPECT_NE(device.status().message().find("already exists"), std::string::npos)
      << device.status().message();
  EXPECT_EQ(read_text(dir.file("taken.swap")), "someone else's data");
}

TEST(BackingDevice, SymlinkAtTheSwapPathIsRefused) {
  ScratchDir dir;
  write_text(dir.file("target"), "precious");
  ASSERT_EQ(::symlink(dir.file("target").c_str(), dir.file("link.swap").c_str()), 0);
  ASSERT_EQ(::symlink(dir.file("nowhere").c_str(), dir.file("dangling.swap").c_str()), 0);

  auto through_link = BackingDevice::open(swap_options(dir, "link.swap"));
  ASSERT_FALSE(through_link.is_ok());
  EXPECT_EQ(through_link.status().code(), STRATA_E_INVALID);
  EXPECT_NE(through_link.status().message().find("symbolic link"), std::string::npos)
      << through_link.status().message();
  EXPECT_EQ(read_text(dir.file("target")), "precious");

  // A dangling link must not be followed to create its target either.
  auto dangling = BackingDevice::open(swap_options(dir, "dangling.swap"));
  ASSERT_FALSE(dangling.is_ok());
  EXPECT_EQ(dangling.status().code(), STRATA_E_INVALID);
  EXPECT_NE(::access(dir.file("nowhere").c_str(), F_OK), 0);
}

TEST(BackingDevice, MissingDirectoryIsRefused) {
  ScratchDir dir;
  BackingDeviceOptions options = swap_options(dir);
  options.swap_dir = dir.file("does-not-exist");
  auto device = BackingDevice::open(options);
  ASSERT_FALSE(device.is_ok());
  EXPECT_EQ(device.status().code(), STRATA_E_INVALID);
  EXPECT_NE(device.status().message().find("must exist"), std::string::npos);
  EXPECT_NE(::access(options.swap_dir.c_str(), F_OK), 0) << "never created";
}

TEST(BackingDevice, NameWithASlashIsRefused) {
  ScratchDir dir;
  auto device = BackingDevice::open(swap_options(dir, "../escape.swap"));
  ASSERT_FALSE(device.is_ok());
  EXPECT_EQ(device.status().code(), STRATA_E_INVALID);
}

TEST(BackingDevice, TooLargeASwapFileSaysAskedAndFree) {
  ScratchDir dir;
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs(dir.path().c_str(), &vfs), 0);
  BackingDeviceOptions options = swap_options(dir);
  // Far more than the file system holds, root reserve included.
  options.capacity_bytes =
      static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize * 2 + (uint64_t{1} << 30);
  auto device = BackingDevice::open(options);
  ASSERT_FALSE(device.is_ok());
  EXPECT_EQ(device.status().code(), STRATA_E_NOSPACE);
  const std::string& message = device.status().message();
  EXPECT_NE(message.find("asked"), std::string::npos) << message;
  EXPECT_NE(message.find("free"), std::string::npos) << message;
  EXPECT_NE(message.find(dir.path()), std::string::npos) << message;
  EXPECT_TRUE(dir.entries().empty()) << "the half-made swap file is removed";
}

TEST(BackingDevice, DefaultCapacityIsHalfTheFreeSpace) {
  EXPECT_EQ(default_swap_capacity(100ull << 30, 4096), 50ull << 30);
  EXPECT_EQ(default_swap_capacity((1ull << 20) + 4096 * 3, 4096), (1ull << 19) + 4096);
  EXPECT_EQ(default_swap_capacity(4096, 4096), 0u);
}

TEST(BackingDevice, CapacityBelowOneBlockIsRefused) {
  ScratchDir dir;
  BackingDeviceOptions options = swap_options(dir);
  options.capacity_bytes = 100;
  auto device = BackingDevice::open(options);
  ASSERT_FALSE(device.is_ok());
  EXPECT_EQ(device.status().code(), STRATA_E_INVALID);
  EXPECT_TRUE(dir.entries().empty());
}

TEST(BackingDevice, RawModeRefusesARegularFile) {
  ScratchDir dir;
  write_text(dir.file("not-a-device"), "data");
  BackingDeviceOptions options;
  options.raw_device = dir.file("not-a-device");
  auto device = BackingDevice::open(options);
  ASSERT_FALSE(device.is_ok());
  EXPECT_EQ(device.status().code(), STRATA_E_INVALID);
  EXPECT_NE(device.status().message().find("not a block device"), std::string::npos);
  EXPECT_EQ(read_text(dir.file("not-a-device")), "data");
}

TEST(BackingDevice, RawModeRefusesACharacterDeviceAndMissingPaths) {
  BackingDeviceOptions options;
  options.raw_device = "/dev/null";
  auto null_device = BackingDevice::open(options);
  ASSERT_FALSE(null_device.is_ok());
  EXPECT_EQ(null_device.status().code(), STRATA_E_INVALID);

  ScratchDir dir;
  options.raw_device = dir.file("missing");
  auto missing = BackingDevice::open(options);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), STRATA_E_INVALID);
  EXPECT_NE(::access(options.raw_device.c_str(), F_OK), 0) << "never created";
}

TEST(BackingDevice, ExactlyOneModeMustBeNamed) {
  ScratchDir dir;
  BackingDeviceOptions both = swap_options(dir);
  both.raw_device = "/dev/null";
  EXPECT_EQ(BackingDevice::open(both).status().code(), STRATA_E_INVALID);
  EXPECT_EQ(BackingDevice::open(BackingDeviceOptions{}).status().code(), STRATA_E_INVALID);
  EXPECT_TRUE(dir.entries().empty());
}

}  // namespace
}  // namespace strata::storage
