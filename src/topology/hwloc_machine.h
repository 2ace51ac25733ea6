// Thread placement on this machine, through the hwloc topology that
// Topology::discover() loaded. Internal to src/topology (pinning.cc uses it);
// hwloc's own types stay inside hwloc_machine.cc.
#pragma once

#include <string>
#include <vector>

namespace gflow::topology::machine {

// The calling thread's cpu affinity (OS cpu ids, ascending); empty when the
// kernel does not say.
std::vector<int> currentThreadAffinity();

// The cpu the calling thread runs on right now; -1 when unknown.
int currentCpu();

// Binds the calling thread to `cpus` (hwloc_set_cpubind, HWLOC_CPUBIND_THREAD).
// Returns "" on success, else why it failed. Never throws.
std::string bindCurrentThread(const std::vector<int>& cpus);

}  // namespace gflow::topology::machine
