// Entry points for gflow's own front ends (the Python module and the
// torch.distributed backend in python/): exported from libgflow but not
// installed, so they are not part of the public API.
#pragma once

#include <string>

#include "gflow/communicator.h"
#include "gflow/export.h"

namespace gflow::frontend {

// For a front end that checks an op's arguments before calling it: raises
// Error(kInvalidArgument) naming `op` and `what` as gflow's own checks do.
// A collective is rejected: `comm` stays usable, and a peer that runs the
// op instead of rejecting it too fails with kMismatch at once. A
// point-to-point op (opcheck::isPointToPointCall: "send", "recv",
// "sendRecv") fails `comm`, so its peer raises at once.
[[noreturn]] GFLOW_EXPORT void rejectInvalidArgument(Communicator& comm, const std::string& op,
                                                     const std::string& what);

}  // namespace gflow::frontend
