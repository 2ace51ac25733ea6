#include "topology/pinning.h"

#include <algorithm>
#include <iterator>

#include "common/logging.h"
#include "common/params.h"
#include "topology/hwloc_machine.h"

namespace gflow::topology {

namespace {

std::vector<int> intersect(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

PinPlan noBind(std::string reason) {
  return PinPlan{false, {}, std::move(reason)};
}

}  // namespace

PinPlan planPin(const Topology& topo, const std::string& nic, const std::vector<int>& allowedIn,
                int hintCpu) {
  std::vector<int> allowed = allowedIn;
  std::sort(allowed.begin(), allowed.end());
  allowed = allowed.empty() ? topo.cpuIds() : intersect(allowed, topo.cpuIds());
  if (allowed.empty()) return noBind("hwloc knows none of the thread's cpus");

  int nodesUsed = 0;
  for (const NumaNode& n : topo.numaNodes()) {
    if (!intersect(n.cpus, allowed).empty()) ++nodesUsed;
  }
  if (nodesUsed <= 1) {
    return noBind(topo.numaNodes().size() <= 1
                      ? "one NUMA node"
                      : "its cpus " + formatCpuList(allowed) + " are all on one NUMA node");
  }

  std::vector<int> near;
  std::string where;
  const Nic* n = nic.empty() ? nullptr : topo.nic(nic);
  if (n != nullptr && !n->localCpus.empty()) {
    near = n->localCpus;
    where = "near NIC " + nic +
            (n->numaNode >= 0 ? " (NUMA node " + std::to_string(n->numaNode) + ")" : "");
  } else {
    const std::string why = nic.empty() ? "no NIC given" : "NIC " + nic + " not found by hwloc";
    const int node = topo.numaNodeOfCpu(hintCpu);
    if (node < 0) return noBind(why + " and the starting cpu's NUMA node is unknown");
    near = topo.numaNode(node)->cpus;
    where = why + "; on the starting thread's NUMA node " + std::to_string(node);
  }

  std::vector<int> target = intersect(near, allowed);
  if (target.empty()) {
    return noBind(where + ": its cpus " + formatCpuList(near) + " are outside the allowed cpus " +
                  formatCpuList(allowed));
  }
  if (target == allowed)
    return noBind(where + ": already limited to cpus " + formatCpuList(allowed));
  return PinPlan{true, std::move(target), std::move(where)};
}

PinPlan pinCurrentThreadNear(const std::string& nicOrEmpty, int hintCpu,
                             std::optional<bool> enabled) noexcept {
  try {
    const std::string who =
        "progress thread (NIC " + (nicOrEmpty.empty() ? std::string("none") : nicOrEmpty) + ")";
    if (enabled ? !*enabled : params::pin() == 0) {
      const char* why = enabled ? "Options::progress.pinThreads=false" : "GFLOW_PIN=0";
      GFLOW_LOG(INFO) << who << " not pinned: " << why;
      return noBind(why);
    }
    const Topology& topo = Topology::discover();
    if (hintCpu < 0) hintCpu = machine::currentCpu();
    PinPlan plan = planPin(topo, nicOrEmpty, machine::currentThreadAffinity(), hintCpu);
    if (!plan.bind) {
      GFLOW_LOG(INFO) << who << " not pinned: " << plan.reason;
      return plan;
    }
    const std::string err = machine::bindCurrentThread(plan.cpus);
    if (!err.empty()) {
      GFLOW_LOG(WARN) << who << " not pinned: binding to cpus " << formatCpuList(plan.cpus) << " ("
                      << plan.reason << ") failed: " << err;
      return noBind("binding failed: " + err);
    }
    GFLOW_LOG(INFO) << who << " pinned to cpus " << formatCpuList(plan.cpus) << ": " << plan.reason;
    return plan;
  } catch (const std::exception& e) {
    GFLOW_LOG(WARN) << "progress thread not pinned: " << e.what();
    return noBind(e.what());
  } catch (...) {
    return noBind("unknown error");
  }
}

int currentCpu() noexcept {
  return machine::currentCpu();
}

std::vector<int> currentThreadAffinity() {
  return machine::currentThreadAffinity();
}

}  // namespace gflow::topology
