// The io_uring engine. One dedicated I/O thread owns the ring: it alone submits, reaps and
// registers, which is what makes IORING_SETUP_SINGLE_ISSUER|DEFER_TASKRUN valid (completions are
// then processed only when that thread waits, with no interrupting task work). Callers on any
// thread hand requests over through a bounded queue and wake the thread through an eventfd whose
// read is always armed on the ring, so an idle engine sleeps in io_uring_enter and never spins.
//
// Files live in a fixed file table (IOSQE_FIXED_FILE); buffers may be registered in a sparse
// table and are then moved with READ_FIXED / WRITE_FIXED. Registration calls from other threads
// are marshalled to the I/O thread, since a SINGLE_ISSUER ring refuses io_uring_register from
// any other task. Requests are cut into block_size blocks; at most queue_depth blocks are in the
// kernel; every block slot is preallocated, so the hot path allocates nothing.
#pragma once

#include <liburing.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "io/block_cursor.h"
#include "io/io_engine.h"
#include "io/registration_table.h"
#include "io/request_fifo.h"
#include "io/transfer_hook.h"

namespace strata::io {

class UringEngine final : public IoEngine, public TransferHookTarget {
 public:
  // Fails with STRATA_E_UNSUPPORTED when the kernel or sandbox refuses io_uring, STRATA_E_LIMIT
  // when it runs out of locked memory, STRATA_E_INVALID for bad options.
  static Result<std::unique_ptr<UringEngine>> create(const IoEngineOptions& options);

  // Finishes every request already submitted (their on_complete runs), then stops the thread.
  ~UringEngine() override;
  UringEngine(const UringEngine&) = delete;
  UringEngine& operator=(const UringEngine&) = delete;

  // "io_uring (single_issuer+defer_taskrun, fixed files, fixed buffers)" or what was accepted.
  const char* name() const override { return name_.c_str(); }
  const IoEngineOptions& options() const override { return options_; }
  Result<uint32_t> register_file(int fd) override;
  Result<int32_t> register_buffer(void* base, uint64_t bytes) override;
  Status unregister_buffer(int32_t index) override;
  Status submit(IoRequest* request) override;

  void set_transfer_hook(TransferHook* hook) override { hook_ = hook; }

 private:
  struct Active {
    IoRequest* request = nullptr;
    uint64_t next = 0;  // offset within the request of the next block to issue
    uint32_t in_flight = 0;
    bool all_issued = false;
    int error = 0;
    uint64_t moved = 0;
  };
  struct Block {
    BlockCursor cursor;
    uint32_t active = 0;  // slot in active_
    int32_t buffer_index = -1;
  };
  // A registration step run by the I/O thread on behalf of a caller.
  struct Command {
    enum class Kind : uint8_t { kFile, kSetBuffer, kClearBuffer } kind;
    uint32_t index = 0;
    int fd = -1;
    void* base = nullptr;
    uint64_t bytes = 0;
    int result = 0;  // 0 or -errno
    bool done = false;
  };

  explicit UringEngine(const IoEngineOptions& options);
  void io_thread_main();
  Status setup_ring();
  void run_loop();
  Status run_command(Command& command);
  void execute(Command& command);
  void arm_wakeup();
  void wake_io_thread();
  void issue_blocks();
  void start_attempt(uint32_t index);
  void on_cqe(uint64_t tag, int result);
  void finish_block(uint32_t index, int error);

  const IoEngineOptions options_;
  RegistrationTable registry_;
  TransferHook* hook_ = nullptr;
  std::string name_ = "io_uring";
  UniqueFd wake_fd_;  // eventfd: callers write it to wake the I/O thread

  // Owned by the I/O thread once it runs.
  io_uring ring_{};
  bool fixed_files_ = false;
  bool fixed_buffers_ = false;
  const bool submit_each_block_;  // block_size >= kSubmitEachBlockBytes: no batching, no merging
  uint64_t wake_value_ = 0;       // target of the armed eventfd read
  std::vector<Block> blocks_;
  std::vector<uint32_t> free_blocks_;
  std::vector<Active> active_;  // queue_depth + 1: current_ plus one per block in flight at most
  std::vector<uint32_t> free_active_;
  Active* current_ = nullptr;    // the request whose blocks are being issued
  RequestFifo ready_;            // taken from pending_, not yet started; I/O thread only
  uint32_t sqes_in_kernel_ = 0;  // block attempts submitted or prepared, not yet reaped
  std::vector<Command*> running_commands_;

  // Shared with callers, under mutex_.
  std::mutex mutex_;
  std::condition_variable space_ready_;   // pending_ has room
  std::condition_variable command_done_;  // a Command finished, or setup finished
  RequestFifo pending_;
  std::vector<Command*> commands_;
  bool waiting_ = false;  // the I/O thread sleeps and wants an eventfd write for new work
  bool stopping_ = false;
  bool setup_done_ = false;
  Status setup_status_;

  std::thread thread_;
};

}  // namespace strata::io
