// `strata doctor --path P` names what is wrong with P - missing, not a directory, not enterable,
// not writable, on a read-only or full file system, in RAM - with the fix, instead of calling all
// of them an O_DIRECT failure; and it finds swap files left by processes that have exited.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli_run.h"
#include "model/test_dir.h"
#include "storage/backing_device.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::CliOptions;
using testing::CliRun;
using testing::run_cli;

constexpr uid_t kNobody = 65534;

CliRun doctor(const std::string& path, const CliOptions& options = {}) {
  return run_cli({"doctor", "--path", path}, options);
}

// The line of `strata doctor`'s table for one check, and the advice line under it.
std::string check_line(const std::string& out, const std::string& name) {
  const size_t at = out.find("\n" + name + " ");
  if (at == std::string::npos) return {};
  const size_t end = out.find('\n', out.find('\n', at + 1) + 1);
  return out.substr(at + 1, end - at - 1);
}

TEST(Doctor, MissingPathIsNamedWithMkdir) {
  const fs::path dir = testing::scratch_dir("doctor-missing") / "absent";
  const CliRun r = doctor(dir.string());
  EXPECT_EQ(r.code, 1);
  const std::string line = check_line(r.out, "nvme path");
  EXPECT_NE(line.find("does not exist"), std::string::npos) << r.out;
  EXPECT_NE(line.find("mkdir -p"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("O_DIRECT"), std::string::npos) << r.out;
}

TEST(Doctor, FileIsNotADirectory) {
  const fs::path file = testing::scratch_dir("doctor-file") / "plain";
  std::ofstream(file) << "x";
  const CliRun r = doctor(file.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(check_line(r.out, "nvme path").find("is not a directory (a file)"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("O_DIRECT"), std::string::npos) << r.out;
}

// A read-only directory and one that cannot be entered, seen by a user who is not their owner
// (as root, the test drops to nobody: root passes every permission check).
TEST(Doctor, ReadOnlyAndPermissionDeniedAreNamed) {
  char base_template[] = "/tmp/strata-doctor-perm.XXXXXX";
  ASSERT_NE(::mkdtemp(base_template), nullptr);
  const fs::path base = base_template;
  ASSERT_EQ(::chmod(base.c_str(), 0755), 0);
  const fs::path read_only = base / "read-only", closed = base / "closed";
  fs::create_directories(read_only);
  fs::create_directories(closed / "inner");
  CliOptions as_other;
  if (::geteuid() == 0) {
    as_other.run_as_uid = kNobody;
  }
  ASSERT_EQ(::chmod(read_only.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(closed.c_str(), 0700), 0);
  if (::geteuid() != 0) {
    ASSERT_EQ(::chmod(closed.c_str(), 0000), 0);
  }

  const CliRun ro = doctor(read_only.string(), as_other);
  EXPECT_EQ(ro.code, 1) << ro.out << ro.err;
  EXPECT_NE(check_line(ro.out, "nvme path").find("is read-only for uid"), std::string::npos)
      << ro.out;
  EXPECT_NE(check_line(ro.out, "nvme path").find("chmod u+w"), std::string::npos) << ro.out;

  const CliRun denied = doctor((closed / "inner").string(), as_other);
  EXPECT_EQ(denied.code, 1);
  EXPECT_NE(check_line(denied.out, "nvme path").find("permission denied"), std::string::npos)
      << denied.out;
  const CliRun closed_itself = doctor(closed.string(), as_other);
  EXPECT_EQ(closed_itself.code, 1);
  EXPECT_NE(check_line(closed_itself.out, "nvme path").find("cannot enter"), std::string::npos)
      << closed_itself.out;
  for (const CliRun* r : {&ro, &denied, &closed_itself}) {
    EXPECT_EQ(r->out.find("O_DIRECT"), std::string::npos) << r->out;
  }
  ::chmod(closed.c_str(), 0700);
  fs::remove_all(base);
}

TEST(Doctor, TmpfsIsAWarningThatTheSwapFileWouldLiveInRam) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  char dir_template[] = "/dev/shm/strata-doctor.XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) GTEST_SKIP() << "/dev/shm is not writable";
  const CliRun r = doctor(dir_template);
  fs::remove_all(dir_template);
  if (r.out.find("tmpfs") == std::string::npos && r.out.find("not in RAM") != std::string::npos) {
    GTEST_SKIP() << "/dev/shm is not tmpfs here";
  }
  const std::string line = check_line(r.out, "file system");
  EXPECT_NE(line.find("warn"), std::string::npos) << r.out;
  EXPECT_NE(line.find("would live in RAM"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\nReady.\n"), std::string::npos) << r.out;
}

// Read-only and full file systems need a mount: a private tmpfs in a user and mount namespace
// (unshare -rm), where the test is allowed to make one.
std::string in_mount_namespace(const std::string& script) {
  const std::string command = "unshare -rm sh -c '" + script + "' 2>&1";
  std::string out;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
    ::pclose(pipe);
  }
  return out;
}

bool can_mount() {
  return in_mount_namespace(
             "mkdir -p /tmp/strata-mnt-probe.$$ && mount -t tmpfs none "
             "/tmp/strata-mnt-probe.$$ && echo mounted; umount "
             "/tmp/strata-mnt-probe.$$ 2>/dev/null; rmdir /tmp/strata-mnt-probe.$$")
             .find("mounted") != std::string::npos;
}

TEST(Doctor, ReadOnlyAndFullFileSystemsAreNamed) {
  if (!can_mount()) GTEST_SKIP() << "unshare -rm cannot mount here";
  const fs::path dir = testing::scratch_dir("doctor-mounts");
  const std::string cli = STRATA_CLI_PATH;
  const std::string ro = in_mount_namespace("mount -t tmpfs -o ro none " + dir.string() + " && " +
                                            cli + " doctor --path " + dir.string());
  EXPECT_NE(ro.find("is on a read-only file system"), std::string::npos) << ro;
  EXPECT_EQ(ro.find("O_DIRECT"), std::string::npos) << ro;
  const std::string full = in_mount_namespace(
      "mount -t tmpfs -o size=64k none " + dir.string() + " && (cat /dev/zero > " + dir.string() +
      "/fill 2>/dev/null; true) && " + cli + " doctor --path " + dir.string());
  const std::string line = check_line(full, "free space");
  EXPECT_NE(line.find("FAIL"), std::string::npos) << full;
  EXPECT_NE(line.find("0 B free"), std::string::npos) << full;
  EXPECT_NE(full.find("cannot work"), std::string::npos) << full;
}

// A process that dies without cleaning up (here: _exit in a child, as SIGKILL would) leaves its
// swap file; doctor lists it with the command that removes it, and that command removes it but
// never the swap file of a process that is still running.
TEST(Doctor, FindsOrphansAndRemovesOnlyThose) {
  const fs::path dir = testing::scratch_dir("doctor-orphans");
  storage::BackingDeviceOptions options;
  options.swap_dir = dir.string();
  options.capacity_bytes = 1u << 20;
  options.allow_buffered = true;
  // Ours, alive; opened first, since opening a swap file removes the orphans already there.
  auto live = storage::BackingDevice::open(options);
  ASSERT_TRUE(live.is_ok()) << live.status().message();
  const pid_t child = ::fork();
  if (child == 0) {
    auto device = storage::BackingDevice::open(options);
    ::_exit(device.is_ok() ? 0 : 1);  // no destructor: the swap file stays
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);

  const CliRun found = doctor(dir.string());
  const std::string line = check_line(found.out, "orphans");
  EXPECT_NE(line.find("1 left by processes that no longer exist"), std::string::npos) << found.out;
  EXPECT_NE(line.find("(pid " + std::to_string(child)), std::string::npos) << found.out;
  EXPECT_NE(line.find("strata doctor --path " + dir.string() + " --remove-orphans"),
            std::string::npos)
      << found.out;

  const CliRun removed = run_cli({"doctor", "--path", dir.string(), "--remove-orphans"});
  EXPECT_NE(check_line(removed.out, "orphans").find("removed 1 of 1"), std::string::npos)
      << removed.out;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().string());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0], live->path());
}

}  // namespace
}  // namespace strata
