// A low-level seam for fault injection: engines call it around every block transfer attempt, so a
// test can make the kernel look like it returned a short count, EAGAIN or an error, and check
// that the engine's own resubmission and error paths (not a mock of them) do the right thing.
// Engines run without a hook unless one is installed; production code never installs one.
#pragma once

#include <cstdint>

#include "io/io_engine.h"

namespace strata::io {

struct TransferAttempt {
  IoOp op;
  uint32_t file;
  void* buffer;     // where this attempt reads into / writes from
  uint64_t offset;  // file offset of this attempt
  uint64_t length;  // bytes this attempt asks for (the remainder of its block)
};

class TransferHook {
 public:
  virtual ~TransferHook() = default;

  // Before an attempt is issued. A negative errno fails the attempt without doing the I/O (as a
  // device rejecting it would); 0 lets it go ahead. May sleep to model a stalled device.
  virtual int before_transfer(const TransferAttempt& attempt) = 0;

  // With the attempt's raw result (bytes moved, or -errno); returns the result the engine acts
  // on. It may shrink a positive result (short transfer) or replace it by -errno, never grow it.
  virtual int after_transfer(const TransferAttempt& attempt, int result) = 0;
};

// Implemented by the engines that call a TransferHook. Install the hook before the first request
// and keep it alive until the engine is destroyed.
class TransferHookTarget {
 public:
  virtual void set_transfer_hook(TransferHook* hook) = 0;

 protected:
  ~TransferHookTarget() = default;
};

}  // namespace strata::io
