// Who am I: rank, world size, local rank and the root store address, from
// explicit Options, then GFLOW_* and torchrun's variables, then a PMIx server,
// then Open MPI's and Slurm's variables (docs/launching.md).
#pragma once

#include <cstdint>
#include <string>

#include "gflow/options.h"

namespace gflow::bootstrap {

struct Identity {
  int rank = -1;
  int size = -1;
  int localRank = -1;  // -1 when no source gives it (derived later from host ids)
  int localSize = -1;
  std::string rootHost;  // empty when Options::store is given
  uint16_t rootPort = 0;
  std::string token;
  std::string source;  // "options", "GFLOW_*", "torchrun", "PMIx", "Open MPI", "Slurm"
  // The identity came from a PMIx server: a root address or token not given
  // here is shared through it (rendezvous.h), so rootHost may be empty.
  bool pmix = false;
  std::string launcherHost;  // the launcher's name for this node (PMIx), "" if none
};

// Throws Error(kInvalidArgument) naming the variable to set when something is
// missing (e.g. "set GFLOW_ROOT=host:port or MASTER_ADDR/MASTER_PORT"), or
// when sources contradict each other (GFLOW_RANK=1 but RANK=2), or rank is
// outside [0, size).
Identity resolveIdentity(const Options& options);

// This host's identity for grouping ranks: GFLOW_HOST_ID, else the
// launcher's node name (Identity::launcherHost) or the hostname, + "/" +
// /proc/sys/kernel/random/boot_id.
std::string hostId(const std::string& launcherHost = "");

}  // namespace gflow::bootstrap
