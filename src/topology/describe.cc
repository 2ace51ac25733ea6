// Topology::describe(): the report `gflowrun --topology` prints.
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "topology/topology.h"

namespace gflow::topology {

namespace {

std::string formatBytes(uint64_t bytes) {
  char buf[32];
  const double gib = static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
  if (gib >= 1.0) {
    std::snprintf(buf, sizeof(buf), "%.1f GiB", gib);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  }
  return buf;
}

std::string nodeText(int node) {
  return node >= 0 ? "NUMA node " + std::to_string(node) : "no single NUMA node";
}

// "mlx5_0 (openfabrics), ens1f0 (net)": the nearest NIC of each kind.
template <typename Nearest>
std::string nearestNics(Nearest nearest) {
  std::string out;
  for (NicKind kind : {NicKind::kOpenFabrics, NicKind::kNet}) {
    const Nic* n = nearest(kind);
    if (n == nullptr) continue;
    if (!out.empty()) out += ", ";
    out += n->name + " (" + toString(kind) + ")";
  }
  return out.empty() ? "none" : out;
}

}  // namespace

std::string Topology::describe() const {
  std::ostringstream os;
  os << "Topology of " << (hostName_.empty() ? "(unknown host)" : hostName_) << " (" << source_
     << ")\n";

  os << "NUMA nodes: " << numaNodes_.size() << "\n";
  for (const NumaNode& n : numaNodes_) {
    os << "  node " << n.index << ": cpus " << (n.cpus.empty() ? "none" : formatCpuList(n.cpus))
       << " (" << n.cpus.size() << "), " << formatBytes(n.memoryBytes) << "\n";
  }

  size_t threadsPerCore = cores_.empty() ? 0 : cores_.front().cpus.size();
  for (const Core& c : cores_) {
    if (c.cpus.size() != threadsPerCore) threadsPerCore = 0;
  }
  os << "Cores: " << cores_.size() << ", hardware threads: " << cpus_.size();
  if (threadsPerCore > 0) os << " (" << threadsPerCore << " per core)";
  os << "\n";
  for (const NumaNode& n : numaNodes_) {
    std::vector<int> coreIds;
    for (const Core& c : cores_) {
      if (c.numaNode == n.index) coreIds.push_back(c.index);
    }
    if (!coreIds.empty())
      os << "  node " << n.index << ": cores " << formatCpuList(coreIds) << "\n";
  }

  if (!ioKnown_) {
    os << "GPUs and NICs: unknown (hwloc found no PCI devices; a container may hide them)\n";
    return os.str();
  }

  os << "GPUs: " << gpus_.size() << "\n";
  for (const Gpu& g : gpus_) {
    os << "  gpu " << g.index << ": " << g.pciBusId << " " << g.name << ", " << nodeText(g.numaNode)
       << ", nearest NIC " << nearestNics([&](NicKind k) { return nearestNicToGpu(g.index, k); })
       << "\n";
  }

  os << "NICs: " << nics_.size() << "\n";
  for (const Nic& n : nics_) {
    os << "  " << n.name << ": " << toString(n.kind) << ", "
       << (n.pciBusId.empty() ? "not PCI" : "PCI " + n.pciBusId) << ", " << nodeText(n.numaNode)
       << ", cpus " << formatCpuList(cpusNear(n.name)) << ", link " << toString(n.link) << "\n";
  }

  if (!nics_.empty()) {
    os << "Nearest NIC per NUMA node:\n";
    for (const NumaNode& n : numaNodes_) {
      if (n.cpus.empty()) continue;
      os << "  node " << n.index << ": "
         << nearestNics([&](NicKind k) { return nearestNicToCpu(n.cpus.front(), k); }) << "\n";
    }
  }
  return os.str();
}

}  // namespace gflow::topology
