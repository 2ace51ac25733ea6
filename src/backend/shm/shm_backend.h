// The shared-memory backend (one host's ranks); see shm_backend.cc.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/shm/group.h"

namespace gflow::backend {

// Allreduces of [singleCopyLo, singleCopyHi) bytes take the single-copy path
// where group->singleCopy().
std::unique_ptr<Backend> createShmBackend(std::unique_ptr<backend::shm::Group> group,
                                          uint64_t singleCopyLo, uint64_t singleCopyHi);

}  // namespace gflow::backend
