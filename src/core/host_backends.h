// The backends a communicator connects once it knows which host every rank
// is on: the shared-memory backend when all ranks share one host, or the
// hierarchical backend (a local backend per host, shared memory or the
// network transport, and a cross-host backend over the network transport)
// when several hosts have several ranks. Collective over the communicator's
// ranks; each group's contexts live under their own store prefix below the
// communicator's (`shm/`, `host<h>/shm/` or `host<h>/net/`, `cross<l>/`).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/hierarchical/hierarchical.h"
#include "backend/route_policy.h"
#include "core/settings.h"
#include "transport/transport.h"

namespace gflow {

struct HostBackends {
  std::unique_ptr<backend::Backend> shm;           // one host, or null
  std::unique_ptr<backend::Backend> hierarchical;  // several hosts, or null
  backend::Capabilities caps;                      // for RoutePolicy::choose
};

// `ctx`: the communicator's context options (rank, size, store, prefix);
// `policy` routes the hierarchical phases and must outlive the backends; `settings`: whether to use
// shared memory, its chunk, and the backends' tuning. Shared memory that cannot be set up falls
// back to `transportName` with a warning.
HostBackends connectHostBackends(const backend::Hierarchy& h, const transport::ContextOptions& ctx,
                                 const std::string& transportName,
                                 const backend::RoutePolicy& policy, const Settings& settings);

}  // namespace gflow
