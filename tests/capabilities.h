// Dropping CAP_IPC_LOCK, so that RLIMIT_MEMLOCK applies (root ignores it otherwise): for tests of
// the memlock limit, in a child process, since it cannot be taken back.
#pragma once

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace strata::testing {

inline void drop_ipc_lock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return;
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  data[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
  syscall(SYS_capset, &header, data);
}

}  // namespace strata::testing
