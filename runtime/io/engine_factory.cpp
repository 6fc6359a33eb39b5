#include "io/engine_factory.h"

#include <cerrno>

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
      // Only io_uring's absence is a reason to fall back. Bad options are checked the same way
      // by both engines, and a resource limit (descriptors, locked memory) is the user's to
      // raise: a silent switch to pread/pwrite would hide it behind slower I/O.
      if (kind == IoEngineKind::kUring || engine.status().code() != STRATA_E_UNSUPPORTED) {
        return std::move(engine).take_status();
      }
    } else if (support.limit_errno != 0) {
      return errno_status(STRATA_E_LIMIT,
                          support.limit_errno == ENOMEM
                              ? "io_uring_setup (locked memory: raise RLIMIT_MEMLOCK)"
                              : "io_uring_setup",
                          support.limit_errno);
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
