// One device copy stream and the thread that completes its copies in stream order: it waits on
// each copy's event in turn (events on one stream complete in order, so waiting on each in turn
// loses nothing) and then reports the copy - a completion posted to the scheduler for a whole
// buffer, or a callback for one chunk of a stream (datapath/streamer.h).
//
// Thread rules: copy() from any thread; reports run on the lane's thread and must not block on
// anything that waits for this lane.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include "common/status.h"
#include "datapath/link_meter.h"
#include "memory/device.h"
#include "sched/tier_backend.h"
#include "sched/transfer_label.h"

namespace strata::datapath {

class CopyLane {
 public:
  using Callback = void (*)(void* context, Status status);

  CopyLane(memory::Device& device, memory::CopyStream stream, sched::Link link, LinkMeter& meter);
  // Completes what is queued, then stops the thread.
  ~CopyLane();
  CopyLane(const CopyLane&) = delete;
  CopyLane& operator=(const CopyLane&) = delete;

  // A whole transfer of the scheduler's: one transfer on the link, traced under the tensor
  // the scheduler labelled (TransferLabel::current()), completed through `done`.
  Status copy(void* dst, const void* src, uint64_t bytes, sched::Completion done);
  // One piece of a larger transfer: counted on the link, no span of its own; on completion
  // callback(context, status) runs on the lane's thread.
  Status copy(void* dst, const void* src, uint64_t bytes, Callback callback, void* context);

  memory::CopyStream stream() const { return stream_; }

 private:
  struct Op {
    memory::Event event;
    sched::Completion done;  // when callback is null
    Callback callback = nullptr;
    void* context = nullptr;
    sched::TransferLabel label;
    uint64_t bytes = 0;
    uint64_t begin_us = 0;
  };
  Status enqueue(void* dst, const void* src, uint64_t bytes, Op op);
  void run();

  memory::Device& device_;
  const memory::CopyStream stream_;
  const sched::Link link_;
  LinkMeter& meter_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Op> queue_;  // guarded by mutex_
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace strata::datapath
