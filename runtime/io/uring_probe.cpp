#include "io/uring_probe.h"

#include <liburing.h>
#include <sys/utsname.h>

#include <cerrno>
#include <fstream>
#include <system_error>

namespace strata::io {

namespace {

// -errno of creating a 4-entry ring with these setup flags, or 0.
int try_setup(unsigned flags, bool try_sparse_buffers, bool* sparse_ok) {
  io_uring ring{};
  io_uring_params params{};
  params.flags = flags;
  const int rc = io_uring_queue_init_params(4, &ring, &params);
  if (rc < 0) {
    return rc;
  }
  if (try_sparse_buffers) {
    *sparse_ok = io_uring_register_buffers_sparse(&ring, 1) == 0;
  }
  io_uring_queue_exit(&ring);
  return 0;
}

std::string sysctl_disabled_note() {
  // kernel.io_uring_disabled (6.6+): 0 allowed, 1 only for io_uring_group or CAP_SYS_ADMIN,
  // 2 disabled for everyone.
  std::ifstream file("/proc/sys/kernel/io_uring_disabled");
  int value = 0;
  if (!(file >> value) || value == 0) {
    return {};
  }
  return " (sysctl kernel.io_uring_disabled=" + std::to_string(value) +
         (value == 2 ? ": disabled for all processes)"
                     : ": only io_uring_group members may use it)");
}

}  // namespace

UringSupport probe_uring() {
  UringSupport support;
  utsname name{};
  if (::uname(&name) == 0) {
    support.kernel = name.release;
  }

  const int rc = try_setup(0, true, &support.sparse_buffers);
  if (rc == -ENOSYS) {
    support.reason =
        "io_uring_setup returned ENOSYS: kernel built without io_uring, or a seccomp "
        "filter hides it" +
        sysctl_disabled_note();
    return support;
  }
  if (rc == -EPERM || rc == -EACCES) {
    support.reason = "io_uring_setup was refused (" + std::system_category().message(-rc) +
                     "): seccomp (container runtime) or sysctl policy" + sysctl_disabled_note();
    return support;
  }
  if (rc < 0) {
    support.reason = "io_uring_setup failed: " + std::system_category().message(-rc);
    if (rc == -EMFILE || rc == -ENFILE || rc == -ENOMEM) support.limit_errno = -rc;
    return support;
  }

  // IORING_OP_READ / WRITE arrived in 5.6; READ_FIXED / WRITE_FIXED earlier.
  io_uring_probe* probe = io_uring_get_probe();
  if (probe == nullptr) {
    support.reason = "io_uring has no opcode probe (kernel older than 5.6)";
    return support;
  }
  const bool ops = io_uring_opcode_supported(probe, IORING_OP_READ) &&
                   io_uring_opcode_supported(probe, IORING_OP_WRITE) &&
                   io_uring_opcode_supported(probe, IORING_OP_READ_FIXED) &&
                   io_uring_opcode_supported(probe, IORING_OP_WRITE_FIXED);
  io_uring_free_probe(probe);
  if (!ops) {
    support.reason = "io_uring lacks IORING_OP_READ/WRITE (kernel older than 5.6)";
    return support;
  }

  support.single_issuer_defer_taskrun =
      try_setup(IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, false, nullptr) == 0;
  support.coop_taskrun = try_setup(IORING_SETUP_COOP_TASKRUN, false, nullptr) == 0;
  support.available = true;
  support.reason = std::string("io_uring works") +
                   (support.single_issuer_defer_taskrun ? "; SINGLE_ISSUER|DEFER_TASKRUN accepted"
                    : support.coop_taskrun              ? "; COOP_TASKRUN accepted"
                                                        : "; no task-run setup flags") +
                   (support.sparse_buffers ? "; sparse registered buffers" : "; no sparse buffers");
  return support;
}

}  // namespace strata::io
