#include "io/io_engine.h"

#include <latch>
#include <string>

namespace strata::io {

Status request_status(const IoRequest& request) {
  if (request.error == 0) return Status::ok();
  const std::string what = std::string(request.op == IoOp::kRead ? "read" : "write") + " of " +
                           std::to_string(request.length) + " bytes at offset " +
                           std::to_string(request.offset) + " (file " +
                           std::to_string(request.file) + ", " +
                           std::to_string(request.transferred) + " bytes done)";
  const int code = request.error == ENOSPC ? STRATA_E_NOSPACE : STRATA_E_IO;
  return errno_status(code, what, request.error);
}

namespace {

Status transfer_sync(IoEngine& engine, IoOp op, uint32_t file, void* buffer, uint64_t length,
                     uint64_t offset, int32_t buffer_index) {
  std::latch done(1);
  IoRequest request;
  request.op = op;
  request.file = file;
  request.buffer = buffer;
  request.length = length;
  request.offset = offset;
  request.buffer_index = buffer_index;
  request.context = &done;
  request.on_complete = [](IoRequest*, void* context) {
    static_cast<std::latch*>(context)->count_down();
  };
  STRATA_TRY(engine.submit(&request));
  done.wait();
  return request_status(request);
}

}  // namespace

Status read_sync(IoEngine& engine, uint32_t file, void* buffer, uint64_t length, uint64_t offset,
                 int32_t buffer_index) {
  return transfer_sync(engine, IoOp::kRead, file, buffer, length, offset, buffer_index);
}

Status write_sync(IoEngine& engine, uint32_t file, const void* buffer, uint64_t length,
                  uint64_t offset, int32_t buffer_index) {
  // The engine never writes into a write request's buffer.
  return transfer_sync(engine, IoOp::kWrite, file, const_cast<void*>(buffer), length, offset,
                       buffer_index);
}

}  // namespace strata::io
