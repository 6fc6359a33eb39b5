#include "io/paced_engine.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "common/assert.h"
#include "common/units.h"

namespace strata::io {

Result<DriveModel> parse_drive_model(std::string_view spec) {
  DriveModel model;
  auto bad = [&](const std::string& why) {
    return invalid_argument("drive model '" + std::string(spec) + "': " + why +
                            " (expected read=RATE,write=RATE in bytes per second, e.g. "
                            "read=0.3G,write=0.25G)");
  };
  std::string_view rest = spec;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return bad("'" + std::string(item) + "' has no '='");
    const std::string_view key = item.substr(0, eq);
    char* end = nullptr;
    const std::string number(item.substr(eq + 1));
    double value = std::strtod(number.c_str(), &end);
    if (end == number.c_str()) return bad("'" + number + "' is not a rate");
    const std::string suffix(end);
    if (suffix == "K" || suffix == "k") {
      value *= 1e3;
    } else if (suffix == "M") {
      value *= 1e6;
    } else if (suffix == "G") {
      value *= 1e9;
    } else if (!suffix.empty()) {
      return bad("unknown suffix '" + suffix + "'");
    }
    if (!(value > 0) || !std::isfinite(value)) return bad("rates must be finite and above 0");
    if (key == "read") {
      model.read_bytes_per_s = value;
    } else if (key == "write") {
      model.write_bytes_per_s = value;
    } else {
      return bad("unknown key '" + std::string(key) + "'");
    }
  }
  if (model.read_bytes_per_s == 0 || model.write_bytes_per_s == 0) {
    return bad("both read and write are required");
  }
  return model;
}

Result<std::optional<DriveModel>> drive_model_from_env() {
  const char* spec = std::getenv("STRATA_PACED_DRIVE");
  if (spec == nullptr || spec[0] == '\0') return std::optional<DriveModel>{};
  STRATA_ASSIGN_OR_RETURN(DriveModel model, parse_drive_model(spec), "STRATA_PACED_DRIVE");
  return std::optional<DriveModel>(model);
}

Result<std::unique_ptr<PacedEngine>> PacedEngine::wrap(std::unique_ptr<IoEngine> inner,
                                                       const DriveModel& model) {
  if (inner == nullptr) return invalid_argument("paced engine: no engine to wrap");
  if (!(model.read_bytes_per_s > 0) || !(model.write_bytes_per_s > 0)) {
    return invalid_argument("paced engine: rates must be above 0");
  }
  return std::unique_ptr<PacedEngine>(new PacedEngine(std::move(inner), model));
}

PacedEngine::PacedEngine(std::unique_ptr<IoEngine> inner, const DriveModel& model)
    : inner_(std::move(inner)), model_(model) {
  name_ = std::string(inner_->name()) + " paced (read " +
          format_bytes(static_cast<uint64_t>(model.read_bytes_per_s)) + "/s, write " +
          format_bytes(static_cast<uint64_t>(model.write_bytes_per_s)) + "/s)";
  const Clock::time_point now = Clock::now();
  lane_free_[0] = lane_free_[1] = now;
  pacer_ = std::thread([this] { run(); });
}

PacedEngine::~PacedEngine() {
  // The owner has waited for every request it submitted; the inner engine may still be running
  // callbacks into us, so it goes first.
  inner_.reset();
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  pacer_.join();
  STRATA_ASSERT(pending_.empty());
}

Status PacedEngine::submit(IoRequest* request) {
  if (request == nullptr) return invalid_argument("paced engine: null request");
  const int lane = request->op == IoOp::kRead ? 0 : 1;
  const double rate = lane == 0 ? model_.read_bytes_per_s : model_.write_bytes_per_s;
  {
    std::lock_guard lock(mutex_);
    // The drive serves each direction in order: this request starts when its lane is free.
    const Clock::time_point start = std::max(Clock::now(), lane_free_[lane]);
    const auto service = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(static_cast<double>(request->length) / rate));
    lane_free_[lane] = start + service;
    pending_[request] = Pending{request->on_complete, request->context, lane_free_[lane]};
  }
  request->on_complete = &PacedEngine::on_inner_complete;
  request->context = this;
  Status submitted = inner_->submit(request);
  if (!submitted) {
    std::lock_guard lock(mutex_);
    auto it = pending_.find(request);
    request->on_complete = it->second.on_complete;
    request->context = it->second.context;
    pending_.erase(it);
  }
  return submitted;
}

void PacedEngine::on_inner_complete(IoRequest* request, void* context) {
  auto* self = static_cast<PacedEngine*>(context);
  {
    std::lock_guard lock(self->mutex_);
    auto it = self->pending_.find(request);
    STRATA_ASSERT(it != self->pending_.end());
    self->due_.push({it->second.due, request});
  }
  self->changed_.notify_all();
}

void PacedEngine::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (due_.empty()) {
      if (stopping_) return;
      changed_.wait(lock);
      continue;
    }
    const Due next = due_.top();
    if (Clock::now() < next.at) {
      changed_.wait_until(lock, next.at);
      continue;
    }
    due_.pop();
    auto it = pending_.find(next.request);
    STRATA_ASSERT(it != pending_.end());
    const Pending original = it->second;
    pending_.erase(it);
    next.request->on_complete = original.on_complete;
    next.request->context = original.context;
    lock.unlock();
    original.on_complete(next.request, original.context);
    lock.lock();
  }
}

}  // namespace strata::io
