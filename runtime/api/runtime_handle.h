// What strata_runtime* points at: the runtime and the tag its tensor handles carry. One
// definition for c_api.cpp and the tests that reach inside a runtime (fault injection).
#pragma once

#include <strata/strata.h>

#include <cstdint>
#include <memory>

#include "api/runtime.h"

struct strata_runtime {
  std::unique_ptr<strata::api::Runtime> impl;  // null while its creation is under way
  uint16_t handle_owner = 0;  // tags this runtime's tensor handles; unique among live runtimes
};
