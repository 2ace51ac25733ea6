// The staged backend: device buffers over any host Backend. Each op copies
// its device inputs into pinned host memory (on a copy stream of the
// communicator that first waits for the events in Op::buffers, i.e. for
// the work the caller had enqueued on the tensors' streams when it called
// the op), runs `inner` on the host copies, and copies the outputs back
// before it returns. A GPU user without NCCL (or with ranks sharing a GPU)
// thus still runs every collective, on gflow's own host algorithms.
//
// Ops whose Op::buffers is null (host memory) go to `inner` unchanged.
// Calls come from the executing thread, like every Backend's.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace gflow::backend {

// `inner` must outlive the staged backend.
std::unique_ptr<Backend> createStagedBackend(Backend& inner);

}  // namespace gflow::backend
