// What this kernel and sandbox allow of io_uring, found by trying it: `strata doctor` prints it and
// the engine factory uses it to pick io_uring or pread/pwrite.
#pragma once

#include <string>

namespace strata::io {

struct UringSupport {
  bool available = false;  // a ring can be created and has the opcodes Strata issues
  std::string reason;      // why not, or what was found, in words a user can act on
  // Set when the ring could not be made for want of a resource (EMFILE, ENFILE, ENOMEM), not for
  // want of io_uring: the engine factory reports that instead of falling back to pread/pwrite.
  int limit_errno = 0;
  bool single_issuer_defer_taskrun = false;  // IORING_SETUP_SINGLE_ISSUER|DEFER_TASKRUN (6.1+)
  bool coop_taskrun = false;                 // IORING_SETUP_COOP_TASKRUN (5.19+)
  bool sparse_buffers = false;  // io_uring_register_buffers_sparse, for registered buffers (5.19+)
  std::string kernel;           // uname release
};

// Creates and destroys a few small rings; takes about a millisecond. Never fails: a missing
// feature is reported in the result.
UringSupport probe_uring();

}  // namespace strata::io
