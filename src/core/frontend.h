// Entry points for gflow's own front ends (the Python module and the
// torch.distributed backend in python/): exported from libgflow but not
// installed, so they are not part of the public API.
#pragma once

#include <string>

#include "gflow/communicator.h"
#include "gflow/export.h"

namespace gflow::frontend {

// For a front end that checks an op's arguments before calling it: fails
// `comm` with Error(kInvalidArgument) naming `op` and `what`, as gflow's own
// checks do, so the peers, which are entering the same op, raise at once
// instead of waiting for their deadline; then throws that error.
[[noreturn]] GFLOW_EXPORT void failInvalidArgument(Communicator& comm, const std::string& op,
                                                   const std::string& what);

}  // namespace gflow::frontend
