// The shared-memory backend (one host's ranks); see shm_backend.cc.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/shm/group.h"

namespace gflow::backend {

// Its algorithms (OpDesc::route): kSlots, kSingleCopy (allreduce, where
// group->singleCopy()) and kFixedOrder (allreduce, reduce-scatter).
std::unique_ptr<Backend> createShmBackend(std::unique_ptr<backend::shm::Group> group);

}  // namespace gflow::backend
