#include "datapath/copy_lane.h"

#include <utility>

namespace strata::datapath {

CopyLane::CopyLane(memory::Device& device, memory::CopyStream stream, sched::Link link,
                   LinkMeter& meter)
    : device_(device), stream_(stream), link_(link), meter_(meter) {
  thread_ = std::thread([this] { run(); });
}

CopyLane::~CopyLane() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

Status CopyLane::copy(void* dst, const void* src, uint64_t bytes, sched::Completion done) {
  Op op;
  op.done = done;
  op.label = sched::TransferLabel::current();
  return enqueue(dst, src, bytes, std::move(op));
}

Status CopyLane::copy(void* dst, const void* src, uint64_t bytes, Callback callback,
                      void* context) {
  Op op;
  op.callback = callback;
  op.context = context;
  return enqueue(dst, src, bytes, std::move(op));
}

Status CopyLane::enqueue(void* dst, const void* src, uint64_t bytes, Op op) {
  STRATA_ASSIGN_OR_RETURN(op.event, device_.create_event());
  STRATA_TRY(device_.copy_async(stream_, dst, src, bytes));
  STRATA_TRY(device_.record(op.event, stream_));
  meter_.started(link_);
  op.bytes = bytes;
  op.begin_us = meter_.now_us();
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(op));
  }
  changed_.notify_one();
  return Status::ok();
}

void CopyLane::run() {
  for (;;) {
    Op op;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    Status status = device_.synchronize(op.event);
    op.event.reset();
    const uint64_t arrived = status.is_ok() ? op.bytes : 0;
    if (op.callback != nullptr) {
      meter_.finished(link_, arrived, op.begin_us, nullptr);
      op.callback(op.context, std::move(status));
    } else {
      meter_.finished(link_, arrived, op.begin_us, sched::link_word(link_), &op.label);
      sched::post_completion(op.done, std::move(status));
    }
  }
}

}  // namespace strata::datapath
