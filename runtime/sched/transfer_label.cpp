#include "sched/transfer_label.h"

#include <algorithm>
#include <cstring>

namespace strata::sched {
namespace {

thread_local const TensorSpec* issuing = nullptr;

}  // namespace

telemetry::TrackId link_track(Link link) {
  static constexpr telemetry::TrackId kTracks[kLinkCount] = {
      telemetry::kTrackNvmeRead, telemetry::kTrackNvmeWrite, telemetry::kTrackH2DCopy,
      telemetry::kTrackD2HCopy};
  return kTracks[static_cast<int>(link)];
}

const char* link_word(Link link) {
  static constexpr const char* kWords[kLinkCount] = {"read", "write", "h2d", "d2h"};
  return kWords[static_cast<int>(link)];
}

TransferLabel TransferLabel::current() {
  TransferLabel label;
  if (issuing == nullptr) return label;
  const size_t n = std::min(issuing->name.size(), telemetry::kMaxTraceNameBytes);
  std::memcpy(label.name, issuing->name.data(), n);
  label.name[n] = '\0';
  label.tensor.kind = static_cast<uint8_t>(issuing->kind);
  label.tensor.layer = issuing->layer;
  return label;
}

ScopedTransferLabel::ScopedTransferLabel(const TensorSpec& spec) {
  issuing = &spec;
}

ScopedTransferLabel::~ScopedTransferLabel() {
  issuing = nullptr;
}

}  // namespace strata::sched
