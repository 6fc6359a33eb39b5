#include "sched/tier_backend.h"

namespace strata::sched {

const char* to_string(Link link) {
  switch (link) {
    case Link::kNvmeRead:
      return "nvme_read";
    case Link::kNvmeWrite:
      return "nvme_write";
    case Link::kHostToDevice:
      return "host_to_device";
    case Link::kDeviceToHost:
      return "device_to_host";
  }
  return "?";
}

}  // namespace strata::sched
