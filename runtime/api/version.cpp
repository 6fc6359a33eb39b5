// strata_version, strata_strerror, strata_config_init: the parts of the C API that need no runtime.
#include <strata/strata.h>

#include <cstring>

#define STRATA_STRINGIFY_(x) #x
#define STRATA_STRINGIFY(x) STRATA_STRINGIFY_(x)

extern "C" {

const char* strata_version(void) {
  return STRATA_STRINGIFY(STRATA_VERSION_MAJOR) "." STRATA_STRINGIFY(
      STRATA_VERSION_MINOR) "." STRATA_STRINGIFY(STRATA_VERSION_PATCH);
}

int strata_version_number(void) {
  return STRATA_VERSION_NUMBER;
}

const char* strata_strerror(int code) {
  switch (code) {
    case STRATA_OK:
      return "success";
    case STRATA_E_INVALID:
      return "invalid argument";
    case STRATA_E_BAD_HANDLE:
      return "bad handle";
    case STRATA_E_STATE:
      return "operation not allowed in the current state";
    case STRATA_E_NOMEM:
      return "out of host memory";
    case STRATA_E_PINNED_BUDGET:
      return "out of pinned host budget";
    case STRATA_E_DEVICE_BUDGET:
      return "out of device budget";
    case STRATA_E_NOSPACE:
      return "out of NVMe space";
    case STRATA_E_IO:
      return "I/O error";
    case STRATA_E_CORRUPT:
      return "data corruption detected (checksum mismatch)";
    case STRATA_E_UNSUPPORTED:
      return "not supported on this system";
    case STRATA_E_DEVICE:
      return "GPU runtime error";
    case STRATA_E_LIMIT:
      return "operating system limit reached";
    case STRATA_E_TIMEOUT:
      return "timed out";
    case STRATA_E_INTERNAL:
      return "internal error";
    default:
      return "unknown status code";
  }
}

int strata_config_init(strata_config* config) {
  if (config == nullptr) return STRATA_E_INVALID;
  std::memset(config, 0, sizeof *config);
  config->struct_size = sizeof *config;
  config->verify_checksums = 1;
  config->pinned_budget_bytes = 0;  // automatic
  config->device_budget_bytes = 8ull << 30;
  config->io_engine = STRATA_IO_AUTO;
  config->queue_depth = 32;
  config->block_size = 1u << 20;
  config->policy = STRATA_POLICY_STRATA;
  config->device_backend = STRATA_DEVICE_AUTO;
  config->device_ordinal = 0;
  config->numa_node = -1;
  return STRATA_OK;
}

}  // extern "C"
