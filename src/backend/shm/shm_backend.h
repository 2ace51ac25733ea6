// The shared-memory backend (one host's ranks); see shm_backend.cc.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/shm/group.h"

namespace gflow::backend {

std::unique_ptr<Backend> createShmBackend(std::unique_ptr<backend::shm::Group> group);

}  // namespace gflow::backend
