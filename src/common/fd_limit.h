// The process's file descriptor limit (RLIMIT_NOFILE). A job of N ranks
// keeps sockets to its peers open for its lifetime, and the soft limit many
// systems start processes with (1024) is below what a few hundred peers
// need, while the hard limit usually is not: gflow raises the soft limit to
// the hard one (as NCCL does), and where that is still too small, fails
// before it runs out, saying how many descriptors it needs and which limit
// to raise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gflow/error.h"

namespace gflow::fdlimit {

// Raises the soft limit to the hard limit (INFO when it changed). Returns
// the soft limit in force. Thread-safe.
uint64_t raiseToHard();

// Descriptors this process has open now.
size_t openNow();

// Throws Error(kInternal, ctx) when `more` descriptors on top of those open
// now would pass the soft limit (after raiseToHard), naming `what` needs
// them, how many in all, the limits and how to raise them.
void require(size_t more, const std::string& what, const ErrorContext& ctx);

}  // namespace gflow::fdlimit
