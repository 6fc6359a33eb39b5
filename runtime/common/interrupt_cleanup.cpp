#include "common/interrupt_cleanup.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <mutex>
#include <utility>

namespace strata {
namespace {

// A slot goes kFree -> kFilling (arm() owns it) -> kArmed -> kFree (disarm), or kArmed ->
// kRemoving -> kArmed while remove_all_armed() works on it. Everything the handler reads is
// plain data published by the release store of kArmed.
enum SlotState : int { kFree = 0, kFilling = 1, kArmed = 2, kRemoving = 3 };

struct Slot {
  std::atomic<int> state{kFree};
  pid_t owner = 0;
  int dir_fd = -1;
  InterruptCleanup::What what = InterruptCleanup::What::kFile;
  char name[InterruptCleanup::kMaxName + 1] = {};
};

std::array<Slot, InterruptCleanup::kSlots> slots;

constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};

// Only async-signal-safe calls from here to the end of on_fatal_signal.
void unlink_plain_files(int parent_fd, const char* name) {
  const int fd = ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buffer[4096];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, fd, buffer, sizeof buffer);
    if (n <= 0) break;
    for (long at = 0; at < n;) {
      // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
      unsigned short reclen;
      std::memcpy(&reclen, buffer + at + 16, sizeof reclen);
      const unsigned char type = static_cast<unsigned char>(buffer[at + 18]);
      const char* entry = buffer + at + 19;
      const bool dot = entry[0] == '.' && (entry[1] == 0 || (entry[1] == '.' && entry[2] == 0));
      if (!dot && type != DT_DIR) ::unlinkat(fd, entry, 0);
      at += reclen;
    }
  }
  ::close(fd);
}

// The process's other threads keep running while the handler does: one of them may create a
// file after the pass that unlinked the others (a benchmark writing a file per tensor does), so
// the directory is emptied again until it can be removed, a bounded number of times.
void remove_directory(int parent_fd, const char* name) {
  constexpr int kPasses = 16;
  for (int pass = 0; pass < kPasses; ++pass) {
    unlink_plain_files(parent_fd, name);
    if (::unlinkat(parent_fd, name, AT_REMOVEDIR) == 0 || errno != ENOTEMPTY) return;
  }
}

// A process-directed signal may reach a second thread while the first is still removing (the
// handler blocks the signals only in the thread it runs on; the benchmark's parent forwards the
// same SIGINT a group-wide one already delivered). That second thread must not restore the
// default disposition and raise under the first one's feet: it waits for the removal to end,
// for at most kMaxWaitMs.
std::atomic<bool> removal_started{false};
std::atomic<bool> removal_done{false};
constexpr int kMaxWaitMs = 10'000;

void on_fatal_signal(int signal_number) {
  const int saved_errno = errno;
  if (!removal_started.exchange(true)) {
    InterruptCleanup::remove_all_armed();
    removal_done.store(true);
  } else {
    const struct timespec millisecond = {0, 1'000'000};
    for (int waited = 0; !removal_done.load() && waited < kMaxWaitMs; ++waited) {
      ::nanosleep(&millisecond, nullptr);
    }
  }
  errno = saved_errno;
  // Die of the same signal, as the default disposition would have: it is blocked while this
  // handler runs and delivered when it returns.
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  ::sigemptyset(&fallback.sa_mask);
  ::sigaction(signal_number, &fallback, nullptr);
  ::raise(signal_number);
}

void install_handlers() {
  for (int signal_number : kSignals) {
    struct sigaction current {};
    if (::sigaction(signal_number, nullptr, &current) != 0) continue;
    const bool is_default = (current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL;
    if (!is_default) continue;  // the host's (or ignored): never taken over
    struct sigaction ours {};
    ours.sa_handler = on_fatal_signal;
    ::sigemptyset(&ours.sa_mask);
    for (int other : kSignals) ::sigaddset(&ours.sa_mask, other);  // one cleanup at a time
    ours.sa_flags = SA_RESTART;
    ::sigaction(signal_number, &ours, nullptr);
  }
}

}  // namespace

void InterruptCleanup::remove_all_armed() {
  const pid_t self = ::getpid();
  for (Slot& slot : slots) {
    int expected = kArmed;
    if (!slot.state.compare_exchange_strong(expected, kRemoving, std::memory_order_acquire)) {
      continue;
    }
    if (slot.owner == self) {
      if (slot.what == What::kDirectory) {
        remove_directory(slot.dir_fd, slot.name);
      } else {
        ::unlinkat(slot.dir_fd, slot.name, 0);
      }
    }
    slot.state.store(kArmed, std::memory_order_release);
  }
}

InterruptCleanup InterruptCleanup::arm(int dir_fd, std::string_view name, What what) {
  if (dir_fd < 0 || name.empty() || name.size() > kMaxName) return {};
  static std::once_flag installed;
  std::call_once(installed, install_handlers);
  for (int i = 0; i < kSlots; ++i) {
    Slot& slot = slots[static_cast<size_t>(i)];
    int expected = kFree;
    if (!slot.state.compare_exchange_strong(expected, kFilling, std::memory_order_acquire)) {
      continue;
    }
    slot.owner = ::getpid();
    slot.dir_fd = dir_fd;
    slot.what = what;
    std::memcpy(slot.name, name.data(), name.size());
    slot.name[name.size()] = '\0';
    slot.state.store(kArmed, std::memory_order_release);
    return InterruptCleanup(i);
  }
  return {};
}

void InterruptCleanup::disarm() {
  if (slot_ < 0) return;
  Slot& slot = slots[static_cast<size_t>(slot_)];
  slot_ = -1;
  for (;;) {
    int expected = kArmed;
    if (slot.state.compare_exchange_weak(expected, kFree, std::memory_order_acq_rel)) return;
    ::sched_yield();  // remove_all_armed() holds it for a moment
  }
}

InterruptCleanup::InterruptCleanup(InterruptCleanup&& other) noexcept
    : slot_(std::exchange(other.slot_, -1)) {}

InterruptCleanup& InterruptCleanup::operator=(InterruptCleanup&& other) noexcept {
  if (this != &other) {
    disarm();
    slot_ = std::exchange(other.slot_, -1);
  }
  return *this;
}

}  // namespace strata
