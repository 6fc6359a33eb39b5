// What a process armed is removed when it dies of SIGTERM / SIGINT with the default disposition;
// a host's own handler is left in charge; a forked child never removes its parent's files.
#include "common/interrupt_cleanup.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>

#include "model/test_dir.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

struct Dir {
  explicit Dir(const std::string& name) : path(testing::scratch_dir(name)) {
    fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  ~Dir() {
    ::close(fd);
    fs::remove_all(path);
  }
  void touch(const std::string& name) const { std::ofstream(path / name) << "x"; }
  bool has(const std::string& name) const { return fs::exists(path / name); }
  fs::path path;
  int fd = -1;
};

// Runs `body` in a child and returns its wait status.
template <typename Body>
int in_child(Body body) {
  const pid_t child = ::fork();
  if (child == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return status;
}

TEST(InterruptCleanup, DeathBySignalRemovesArmedFilesAndDirectories) {
  for (int signal_number : {SIGTERM, SIGINT, SIGHUP}) {
    SCOPED_TRACE(signal_number);
    Dir dir("interrupt-cleanup");
    dir.touch("file");
    fs::create_directory(dir.path / "tensors");
    dir.touch("tensors/1.swp");
    dir.touch("bystander");
    const int status = in_child([&] {
      auto file = InterruptCleanup::arm(dir.fd, "file", InterruptCleanup::What::kFile);
      auto tensors = InterruptCleanup::arm(dir.fd, "tensors", InterruptCleanup::What::kDirectory);
      if (!file.armed() || !tensors.armed()) ::_exit(3);
      ::raise(signal_number);
      ::_exit(4);  // not reached: the process dies of the signal
    });
    ASSERT_TRUE(WIFSIGNALED(status)) << status;
    EXPECT_EQ(WTERMSIG(status), signal_number);
    EXPECT_FALSE(dir.has("file"));
    EXPECT_FALSE(dir.has("tensors"));
    EXPECT_TRUE(dir.has("bystander"));
  }
}

volatile std::sig_atomic_t host_saw = 0;
void host_handler(int signal_number) {
  host_saw = signal_number;
}

TEST(InterruptCleanup, HostHandlerIsLeftInCharge) {
  Dir dir("interrupt-host");
  dir.touch("file");
  const int status = in_child([&] {
    std::signal(SIGINT, host_handler);  // before Strata's first arm(), as Python's is
    auto file = InterruptCleanup::arm(dir.fd, "file", InterruptCleanup::What::kFile);
    ::raise(SIGINT);
    ::_exit(host_saw == SIGINT ? 0 : 5);
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(dir.has("file"));  // the host decides; its own path cleans up
}

TEST(InterruptCleanup, DisarmedAndOtherProcessesEntriesStay) {
  Dir dir("interrupt-disarm");
  dir.touch("disarmed");
  dir.touch("parents");
  auto parents = InterruptCleanup::arm(dir.fd, "parents", InterruptCleanup::What::kFile);
  ASSERT_TRUE(parents.armed());
  const int status = in_child([&] {
    auto mine = InterruptCleanup::arm(dir.fd, "disarmed", InterruptCleanup::What::kFile);
    mine.disarm();
    InterruptCleanup::remove_all_armed();  // what the handler does, in a forked child
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_TRUE(dir.has("disarmed"));
  EXPECT_TRUE(dir.has("parents"));
  InterruptCleanup::remove_all_armed();
  EXPECT_FALSE(dir.has("parents"));
  parents.disarm();
}

TEST(InterruptCleanup, TooLongNamesAndBadDescriptorsAreNotArmed) {
  EXPECT_FALSE(InterruptCleanup::arm(-1, "x", InterruptCleanup::What::kFile).armed());
  EXPECT_FALSE(
      InterruptCleanup::arm(0, std::string(300, 'x'), InterruptCleanup::What::kFile).armed());
  EXPECT_FALSE(InterruptCleanup::arm(0, "", InterruptCleanup::What::kFile).armed());
}

}  // namespace
}  // namespace strata
