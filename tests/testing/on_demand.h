// Shared pieces of the connections-on-demand tests (TCP and verbs,
// GFLOW_CONNECT=lazy): the options, an exact allreduce, and which peers a
// rank may hold after one allreduce by an algorithm.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "gflow/gflow.h"

namespace gflow::testing {

// Connections on demand over `transport`, no shared memory.
Options onDemand(const std::string& transport, const std::string& algorithm);

// Each rank's allreduce of int64 values against the exact sum.
void allreduceExactly(Communicator& c, size_t count);

// The peers of every rank of n after creation, one allreduce by
// `algorithm` and (maybe) a barrier: exactly the ring's neighbours
// (creation) plus, for rd and hd, the partners r ^ 2^k; at most the
// dissemination barrier's partners r +- 2^k more. Checks peers[r] against
// both, with EXPECTs.
void expectPeersOf(const std::string& algorithm, const std::vector<std::set<int>>& peers);

}  // namespace gflow::testing
