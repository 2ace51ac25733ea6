// Which peers a network transport connects to (GFLOW_CONNECT,
// Options::connect), for TCP and verbs alike:
//   - all: every peer at init (a full mesh);
//   - lazy: a pair connects when an op first names the peer;
//   - auto: all up to kLazyAbove ranks, lazy above.
// Every rank of a communicator must choose alike (core/settings.h agrees).
#pragma once

#include "transport/transport.h"

namespace gflow::transport {

constexpr int kLazyAbove = 64;

// True: connections on demand. kInvalidArgument for an unknown value.
bool connectsOnDemand(const ContextOptions& options);

}  // namespace gflow::transport
