// Owner-stamped names: a swap file whose owner has exited is an orphan, found and removed; one
// whose owner runs - or whose owner lock is held, as by a process in another pid namespace - is
// never touched; runtime creation on the directory removes orphans; kept files are not orphans.
#include "storage/owned_names.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <string>

#include "storage/backing_device.h"
#include "storage/file_per_tensor_store.h"
#include "storage_test_util.h"

namespace strata::storage {
namespace {

using testing::ScratchDir;

BackingDeviceOptions small_swap(const ScratchDir& dir) {
  BackingDeviceOptions options;
  options.swap_dir = dir.path();
  options.capacity_bytes = 1u << 20;
  options.allow_buffered = true;
  return options;
}

// A child process opens a swap file and exits without closing it, as one killed outright would.
std::string orphan_from_dead_child(const ScratchDir& dir) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const pid_t child = ::fork();
  if (child == 0) {
    auto device = BackingDevice::open(small_swap(dir));
    const std::string name = device ? device->path().substr(dir.path().size() + 1) : "";
    (void)!::write(fds[1], name.data(), name.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  char name[256] = {};
  const ssize_t n = ::read(fds[0], name, sizeof name - 1);
  ::close(fds[0]);
  ::waitpid(child, nullptr, 0);
  return n > 0 ? std::string(name, static_cast<size_t>(n)) : std::string();
}

TEST(OwnedNames, GeneratedNamesCarryThisProcessAndParseBack) {
  const std::string name = generated_name(".swap");
  const auto owner = parse_owned_name(name);
  ASSERT_TRUE(owner.has_value()) << name;
  EXPECT_EQ(owner->pid, ::getpid());
  EXPECT_EQ(owner->boot.size(), 8u);
  EXPECT_GT(owner->start_ticks, 0u);
  EXPECT_TRUE(owner_alive(*owner));
  EXPECT_NE(generated_name(".swap"), name);  // the random part
}

TEST(OwnedNames, OtherNamesAreNeverStrata) {
  for (const char* name :
       {"kept.swap", "strata-1.swap", "strata-12-zzzzzzzz-5-0123456789abcdef.swap",
        "strata-12-0a0b0c0d-5-0123456789abcdef.swap.kept",
        "strata-12-0a0b0c0d-5-0123456789abcdef.txt", "data.tensors"}) {
    EXPECT_FALSE(parse_owned_name(name).has_value()) << name;
  }
  EXPECT_TRUE(parse_owned_name("strata-12-0a0b0c0d-5-0123456789abcdef.tensors").has_value());
}

TEST(OwnedNames, PidReuseAndAnotherBootAreNotTheOwner) {
  auto self = parse_owned_name(generated_name(".swap"));
  ASSERT_TRUE(self.has_value());
  OwnerStamp reused = *self;
  reused.start_ticks += 1;  // same pid, another process
  EXPECT_FALSE(owner_alive(reused));
  OwnerStamp other_boot = *self;
  other_boot.boot = self->boot == "00000000" ? "00000001" : "00000000";
  EXPECT_FALSE(owner_alive(other_boot));
}

TEST(OwnedNames, DeadOwnersFileIsAnOrphanAndIsRemovedLiveOnesAreNot) {
  ScratchDir dir;
  const std::string orphan = orphan_from_dead_child(dir);
  ASSERT_FALSE(orphan.empty());
  auto live = BackingDevice::open(small_swap(dir));
  ASSERT_TRUE(live.is_ok()) << live.status().message();
  // Opening `live` (a generated name) removed the orphan already: runtime creation cleans up.
  EXPECT_EQ(dir.entries().size(), 1u);
  EXPECT_EQ(dir.file(dir.entries()[0]), live->path());

  const std::string second = orphan_from_dead_child(dir);
  ASSERT_FALSE(second.empty());
  auto found = find_orphans(dir.path());
  ASSERT_TRUE(found.is_ok());
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ((*found)[0].name, second);
  EXPECT_EQ((*found)[0].bytes, 1u << 20);
  const std::string live_name = live->path().substr(dir.path().size() + 1);
  const Status refused = remove_orphan(dir.path(), live_name);
  EXPECT_EQ(refused.code(), STRATA_E_STATE) << refused.message();
  EXPECT_TRUE(remove_orphan(dir.path(), second).is_ok());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{live_name});
}

// An owner in another pid namespace is invisible in /proc here, but holds its lock.
TEST(OwnedNames, LockedFileOfAnInvisibleOwnerIsNotRemoved) {
  ScratchDir dir;
  const std::string orphan = orphan_from_dead_child(dir);
  ASSERT_FALSE(orphan.empty());
  const int fd = ::open(dir.file(orphan).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const pid_t holder = ::fork();  // the lock holder: a separate open file description's owner
  if (holder == 0) {
    const int own = ::open(dir.file(orphan).c_str(), O_RDONLY | O_CLOEXEC);
    ::flock(own, LOCK_EX);
    ::pause();
    ::_exit(0);
  }
  // Wait until the holder has the lock.
  while (::flock(fd, LOCK_SH | LOCK_NB) == 0) {
    ::flock(fd, LOCK_UN);
    ::usleep(1000);
  }
  ::close(fd);
  auto found = find_orphans(dir.path());
  ASSERT_TRUE(found.is_ok());
  EXPECT_TRUE(found->empty());
  EXPECT_EQ(remove_orphan(dir.path(), orphan).code(), STRATA_E_STATE);
  const int dir_fd = ::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  EXPECT_EQ(remove_orphans(dir_fd), 0);
  ::close(dir_fd);
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  EXPECT_TRUE(remove_orphan(dir.path(), orphan).is_ok());
  EXPECT_TRUE(dir.entries().empty());
}

TEST(OwnedNames, KeptSwapFileIsRenamedOutOfThePattern) {
  ScratchDir dir;
  BackingDeviceOptions options = small_swap(dir);
  options.keep = true;
  std::string kept;
  {
    auto device = BackingDevice::open(options);
    ASSERT_TRUE(device.is_ok());
    ASSERT_TRUE(device->close().is_ok());
    kept = device->path();
  }
  ASSERT_EQ(dir.entries().size(), 1u);
  EXPECT_EQ(dir.file(dir.entries()[0]), kept);
  EXPECT_TRUE(kept.ends_with(".swap.kept")) << kept;
  auto again = BackingDevice::open(small_swap(dir));  // removes orphans, not kept files
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(dir.entries().size(), 2u);
}

TEST(OwnedNames, DeadOwnersTensorDirectoryIsRemovedWithItsFiles) {
  ScratchDir dir;
  const std::string name = generated_name(".tensors");
  // Stamped as a dead process's: a pid that cannot exist on Linux (beyond pid_max's limit).
  const std::string dead = "strata-4194305" + name.substr(name.find('-', 7));
  ASSERT_TRUE(parse_owned_name(dead).has_value()) << dead;
  ASSERT_EQ(::mkdir(dir.file(dead).c_str(), 0700), 0);
  for (const char* file : {"/1.swp", "/2.swp"}) {
    const int fd = ::open((dir.file(dead) + file).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "data", 4), 4);
    ::close(fd);
  }
  auto found = find_orphans(dir.path());
  ASSERT_TRUE(found.is_ok());
  ASSERT_EQ(found->size(), 1u);
  EXPECT_TRUE((*found)[0].directory);
  EXPECT_TRUE(remove_orphan(dir.path(), dead).is_ok());
  EXPECT_TRUE(dir.entries().empty());
}

}  // namespace
}  // namespace strata::storage
