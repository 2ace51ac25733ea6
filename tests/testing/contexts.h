// Transport contexts as threads: each thread creates and connects its own
// transport::Context over one shared in-memory store, so transport tests
// drive a whole world of contexts inside one process.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "gflow/error.h"
#include "transport/transport.h"

namespace gflow::testing {

// Runs body(context) on n threads, each with a connected context of
// `transport` ("tcp", "verbs", "tcp_single_copy": tcp with single copy
// between the threads, as between the ranks of one host, "tcp_lazy" or
// "verbs_lazy": connections on demand), the given timeout
// and ContextOptions::progress;
// returns each rank's exception (nullptr where body returned).
std::vector<std::exception_ptr> runContexts(const std::string& transport, int n,
                                            const std::function<void(transport::Context&)>& body,
                                            std::chrono::milliseconds timeout,
                                            const ProgressOptions& progress = {});

// The gflow::Error in `p` (which must hold one).
Error errorOf(const std::exception_ptr& p);

// Waits for `r`; on failure tells the peers (as the communicator does) and
// rethrows, so that a peer fails too instead of waiting for its deadline.
void waitOrNotify(transport::Context& c, const transport::RequestPtr& r,
                  std::chrono::milliseconds d);

// n bytes of a pattern that differs with `seed` and is not periodic at
// powers of two.
std::vector<char> pattern(size_t n, int seed);

}  // namespace gflow::testing
