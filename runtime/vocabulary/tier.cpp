#include "vocabulary/tier.h"

namespace strata {

const char* to_string(Tier tier) {
  switch (tier) {
    case Tier::kHost:
      return "host";
    case Tier::kPinned:
      return "pinned";
    case Tier::kDevice:
      return "device";
    case Tier::kNvme:
      return "nvme";
  }
  return "?";
}

}  // namespace strata
