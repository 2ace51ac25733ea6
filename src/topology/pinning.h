// Pinning gflow's progress thread near the rank's NIC (docs/topology.md).
//
// Policy: bind the thread to the cpus of the NUMA node nearest its NIC,
// intersected with the cpus the thread may already use (a launcher's or
// cgroup's placement is never widened). Nothing is done when those cpus all
// sit on one NUMA node (a one-node machine, or a rank the launcher already
// bound to one node): there is nothing to choose. When the NIC is empty or
// unknown to hwloc (loopback, a virtual interface), the NUMA node of the
// thread that started the progress thread is used instead, since that is
// where the caller's buffers were most likely touched first. GFLOW_PIN=0
// (Options::progress.pinThreads = false) turns all of it off.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "topology/topology.h"

namespace gflow::topology {

struct PinPlan {
  bool bind = false;      // whether the thread is (to be) bound
  std::vector<int> cpus;  // the cpus it is bound to, when bind
  std::string reason;     // for the log: where and why, or why not
};

// Decides where a thread goes (pure: no system calls). `allowed`: the cpus
// the thread may run on now (empty: every cpu of `topo`). `hintCpu`: a cpu
// whose NUMA node to use when `nic` is empty or unknown (-1: none).
PinPlan planPin(const Topology& topo, const std::string& nic, const std::vector<int>& allowed,
                int hintCpu);

// Binds the calling thread as planPin decides on this machine, unless
// `enabled` (Options::progress.pinThreads; unset: GFLOW_PIN) is false.
// `hintCpu` -1: the cpu the thread runs on now. Never throws and
// never fails the caller: a failure is logged and the thread stays as it was.
// Logs what was done at INFO. Returns the plan applied (bind=false: nothing).
PinPlan pinCurrentThreadNear(const std::string& nicOrEmpty, int hintCpu = -1,
                             std::optional<bool> enabled = std::nullopt) noexcept;

// The cpu the calling thread runs on now; -1 when unknown.
int currentCpu() noexcept;

// The cpus the calling thread may run on (its affinity), ascending; empty
// when unknown.
std::vector<int> currentThreadAffinity();

}  // namespace gflow::topology
