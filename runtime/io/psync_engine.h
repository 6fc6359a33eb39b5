// The fallback engine: pread / pwrite on a small pool of worker threads, for kernels or sandboxes
// without io_uring. Same contract as every engine (io_engine.h): requests are split into blocks,
// the workers share the blocks of the oldest request, short transfers continue, EAGAIN / EINTR
// retry, submit() blocks while queue_depth requests wait.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "io/block_cursor.h"
#include "io/io_engine.h"
#include "io/registration_table.h"
#include "io/request_fifo.h"
#include "io/transfer_hook.h"

namespace strata::io {

class PsyncEngine final : public IoEngine, public TransferHookTarget {
 public:
  static Result<std::unique_ptr<PsyncEngine>> create(const IoEngineOptions& options);

  // Finishes every request already submitted (their on_complete runs), then joins the workers.
  ~PsyncEngine() override;
  PsyncEngine(const PsyncEngine&) = delete;
  PsyncEngine& operator=(const PsyncEngine&) = delete;

  const char* name() const override { return "psync"; }
  const IoEngineOptions& options() const override { return options_; }
  Result<uint32_t> register_file(int fd) override;
  Result<int32_t> register_buffer(void* base, uint64_t bytes) override;
  Status unregister_buffer(int32_t index) override;
  Status submit(IoRequest* request) override;

  void set_transfer_hook(TransferHook* hook) override { hook_ = hook; }

 private:
  // Engine-side state of a request whose blocks are being handed out or are in flight.
  struct Active {
    IoRequest* request = nullptr;
    uint64_t next = 0;        // offset within the request of the next block to hand out
    uint32_t in_flight = 0;   // blocks a worker is transferring
    bool all_issued = false;  // no more blocks will be handed out (done, or failed)
    int error = 0;
    uint64_t moved = 0;
  };

  explicit PsyncEngine(const IoEngineOptions& options);
  void worker_loop();
  bool has_claimable_work() const;
  // Runs one block to its end (every retry and continuation); returns the errno or 0.
  int transfer_block(BlockCursor& block, uint64_t* moved);

  const IoEngineOptions options_;
  RegistrationTable registry_;
  TransferHook* hook_ = nullptr;

  std::mutex mutex_;
  std::condition_variable work_ready_;   // workers: a block can be claimed, or stopping
  std::condition_variable space_ready_;  // submitters: the pending queue has room
  RequestFifo pending_;
  // threads + 1 slots suffice: every active request other than `current_` has a block in flight
  // on some worker, so while current_ is empty at most `threads` slots are taken.
  std::vector<Active> active_;
  std::vector<uint32_t> free_slots_;
  Active* current_ = nullptr;  // the request whose blocks are being handed out
  bool stopping_ = false;

  std::vector<std::thread> workers_;
};

}  // namespace strata::io
