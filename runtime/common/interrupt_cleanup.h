// Removal of what Strata created on disk (swap files, file-per-tensor directories, benchmark
// files) when the process is killed by SIGINT, SIGTERM or SIGHUP before it could remove them
// itself. A process that dies by such a signal runs no destructors, so without this a Ctrl-C
// leaves gigabytes behind.
//
// A library must not take the host's signals away from it, so the handler is installed for a
// signal only while that signal's disposition is the default one (the process would die of it
// anyway). Where the host has its own handler (Python's SIGINT raises KeyboardInterrupt) or
// ignores the signal, Strata leaves it alone: the host decides, and its normal path destroys the
// runtime. A host that installs a handler after Strata replaces Strata's, with the same result.
// The handler removes what this process armed, restores the default disposition and re-raises,
// so the process still dies of the signal (exit status 128 + N in a shell).
//
// Each entry records the pid that armed it: a child forked without exec shares the table but
// never removes its parent's files. Process-global state, as signal dispositions are.
#pragma once

#include <string_view>

namespace strata {

class InterruptCleanup {
 public:
  enum class What { kFile, kDirectory };  // kDirectory: its plain files, then itself

  // Arms removal of `name` inside the directory open as `dir_fd`, which must stay open while
  // armed. Returns an unarmed handle (nothing is removed on a signal) when the fixed table of
  // kSlots entries is full or the name is longer than kMaxName.
  static InterruptCleanup arm(int dir_fd, std::string_view name, What what);

  InterruptCleanup() = default;
  InterruptCleanup(InterruptCleanup&& other) noexcept;
  InterruptCleanup& operator=(InterruptCleanup&& other) noexcept;
  InterruptCleanup(const InterruptCleanup&) = delete;
  InterruptCleanup& operator=(const InterruptCleanup&) = delete;
  ~InterruptCleanup() { disarm(); }

  // Call before removing the entry or closing its directory descriptor yourself.
  void disarm();
  bool armed() const { return slot_ >= 0; }

  static constexpr int kSlots = 256;
  static constexpr size_t kMaxName = 255;

  // What the handler does, callable directly (tests): removes every entry this process armed.
  static void remove_all_armed();

 private:
  explicit InterruptCleanup(int slot) : slot_(slot) {}
  int slot_ = -1;
};

}  // namespace strata
