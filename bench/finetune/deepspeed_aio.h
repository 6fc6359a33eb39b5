// An asynchronous I/O handle as DeepSpeed's csrc/aio builds one (deepspeed_py_io_handle.cpp,
// deepspeed_aio_common.cpp), for the baseline worker: libaio over O_DIRECT files, a file per
// tensor, each request a whole file. Per request, as DeepSpeed does: stat the file (reads),
// open it, move it in `block_bytes` iocbs with `queue_depth` of them kept in flight (overlap
// events: a new one is submitted as each completes), split across `threads` threads
// (intra_op_parallelism), then close it. Requests run in submission order on the handle's own
// threads; the caller waits for a ticket, as DeepSpeed's wait() does.
//
// One difference, stated: DeepSpeed never checks a completed iocb's result (`_do_io_complete`),
// so a failed or short transfer passes silently; this handle checks every one (a compare per
// completion, no time a benchmark can see) so that the benchmark cannot report a wrong run.
#pragma once

#include <libaio.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace strata::bench::finetune {

class AioHandle {
 public:
  struct Options {
    std::string name;  // for traces and errors: "parameter reads", ...
    uint32_t block_bytes = 1u << 20;
    uint32_t queue_depth = 8;
    uint32_t threads = 1;
    std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();
  };
  // Called on a handle thread when a request completes: handle name, read or write, file,
  // begin and end (us since the options' epoch), bytes.
  using OnDone =
      std::function<void(const std::string& handle, bool is_read, const std::string& file,
                         uint64_t begin_us, uint64_t end_us, uint64_t bytes)>;

  static Result<std::unique_ptr<AioHandle>> create(const Options& options, OnDone on_done);
  ~AioHandle();
  AioHandle(const AioHandle&) = delete;
  AioHandle& operator=(const AioHandle&) = delete;

  // Queues a read of the whole file `path` (its size must be `bytes`, a multiple of 4 KiB) into
  // `buffer` (4 KiB aligned, valid until waited for). Returns the request's ticket.
  Result<uint64_t> read(const std::string& path, void* buffer, uint64_t bytes);
  // Queues a write of `bytes` from `buffer` to `path`, created or overwritten.
  Result<uint64_t> write(const std::string& path, const void* buffer, uint64_t bytes);
  // Waits until `ticket` and every request before it are done; the first failure among them.
  Status wait(uint64_t ticket);
  Status wait_all();

  uint64_t bytes_read() const;
  uint64_t bytes_written() const;

 private:
  struct Request;
  struct Part {
    std::shared_ptr<Request> request;
    uint64_t begin = 0, end = 0;  // byte range of the file
  };
  struct Worker {
    io_context_t context{};
    std::deque<Part> queue;
    std::thread thread;
  };
  AioHandle(Options options, OnDone on_done);
  Result<uint64_t> submit(const std::string& path, void* buffer, uint64_t bytes, bool is_read);
  void run(Worker& worker);
  Status transfer(Worker& worker, const Part& part);
  void finish(const std::shared_ptr<Request>& request, const Status& status);

  const Options options_;
  const OnDone on_done_;
  std::vector<std::unique_ptr<Worker>> workers_;
  mutable std::mutex mutex_;  // guards everything below and the workers' queues
  std::condition_variable work_;
  std::condition_variable done_;
  bool stop_ = false;
  uint64_t next_ticket_ = 1;
  uint64_t completed_below_ = 1;        // every ticket < this is done
  std::vector<uint64_t> done_tickets_;  // done out of order (parts finish on several threads)
  Status first_failure_;
  uint64_t read_bytes_ = 0, written_bytes_ = 0;
};

}  // namespace strata::bench::finetune
