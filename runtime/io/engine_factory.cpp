#include "io/engine_factory.h"

#include "io/psync_engine.h"
#include "io/uring_engine.h"
#include "io/uring_probe.h"

namespace strata::io {

Result<std::unique_ptr<IoEngine>> make_io_engine(IoEngineKind kind,
                                                 const IoEngineOptions& options) {
  if (kind != IoEngineKind::kPsync) {
    const UringSupport support = probe_uring();
    if (support.available) {
      auto engine = UringEngine::create(options);
      if (engine) {
        return std::unique_ptr<IoEngine>(std::move(engine).value());
      }
      // Options are checked the same way by both engines: no point falling back on bad input.
      if (kind == IoEngineKind::kUring || engine.status().code() == STRATA_E_INVALID) {
        return std::move(engine).take_status();
      }
    } else if (kind == IoEngineKind::kUring) {
      return unsupported("io_uring is unavailable: " + support.reason + " (kernel " +
                         support.kernel + "); use the psync engine");
    }
  }
  auto engine = PsyncEngine::create(options);
  if (!engine) {
    return std::move(engine).take_status();
  }
  return std::unique_ptr<IoEngine>(std::move(engine).value());
}

std::optional<IoEngineKind> parse_io_engine_kind(std::string_view text) {
  if (text == "auto") {
    return IoEngineKind::kAuto;
  }
  if (text == "uring" || text == "io_uring") {
    return IoEngineKind::kUring;
  }
  if (text == "psync") {
    return IoEngineKind::kPsync;
  }
  return std::nullopt;
}

const char* io_engine_kind_name(IoEngineKind kind) {
  switch (kind) {
    case IoEngineKind::kAuto:
      return "auto";
    case IoEngineKind::kUring:
      return "uring";
    case IoEngineKind::kPsync:
      return "psync";
  }
  return "?";
}

}  // namespace strata::io
