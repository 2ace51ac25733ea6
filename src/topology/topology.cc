// Queries over a discovered Topology: lookups and nearest-ness. Building one
// from hwloc is in hwloc_machine.cc, the report in describe.cc.
#include "topology/topology.h"

#include <algorithm>
#include <cstdlib>

namespace gflow::topology {

const char* toString(NicKind kind) {
  switch (kind) {
    case NicKind::kNet: return "net";
    case NicKind::kOpenFabrics: return "openfabrics";
  }
  return "?";
}

const char* toString(LinkState state) {
  switch (state) {
    case LinkState::kUnknown: return "unknown";
    case LinkState::kUp: return "up";
    case LinkState::kDown: return "down";
  }
  return "?";
}

std::string formatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> Topology::cpuIds() const {
  std::vector<int> ids;
  ids.reserve(cpus_.size());
  for (const Cpu& c : cpus_) ids.push_back(c.id);
  return ids;
}

const NumaNode* Topology::numaNode(int index) const {
  for (const NumaNode& n : numaNodes_) {
    if (n.index == index) return &n;
  }
  return nullptr;
}

const Gpu* Topology::gpu(int index) const {
  for (const Gpu& g : gpus_) {
    if (g.index == index) return &g;
  }
  return nullptr;
}

namespace {

// Splits "dddd:bb:dd.f" into its numbers, so ids that differ only in case or
// in the width of the domain (CUDA prints "00000000:17:00.0") compare equal.
bool parseBusId(const std::string& s, unsigned long out[4]) {
  const char* p = s.c_str();
  const char seps[4] = {':', ':', '.', '\0'};
  for (int i = 0; i < 4; ++i) {
    char* end = nullptr;
    out[i] = std::strtoul(p, &end, 16);
    if (end == p || *end != seps[i]) return false;
    p = end + (i < 3 ? 1 : 0);
  }
  return true;
}

}  // namespace

const Gpu* Topology::gpuByPciBusId(const std::string& busId) const {
  unsigned long want[4];
  if (!parseBusId(busId, want)) return nullptr;
  for (const Gpu& g : gpus_) {
    unsigned long have[4];
    if (parseBusId(g.pciBusId, have) && std::equal(want, want + 4, have)) return &g;
  }
  return nullptr;
}

const Nic* Topology::nic(const std::string& name) const {
  for (const Nic& n : nics_) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

int Topology::numaNodeOfCpu(int cpu) const {
  for (const NumaNode& n : numaNodes_) {
    if (std::binary_search(n.cpus.begin(), n.cpus.end(), cpu)) return n.index;
  }
  return -1;
}

const Nic* Topology::nearestNic(const std::vector<uint64_t>& from,
                                const std::optional<NicKind>& kind) const {
  const Nic* best = nullptr;
  size_t bestCommon = 0, bestHops = 0;
  for (const Nic& n : nics_) {
    if (kind && n.kind != *kind) continue;
    // Ancestries start at the root, so the common prefix ends at the deepest
    // common ancestor; what remains on both sides is the path between them.
    size_t common = static_cast<size_t>(
        std::mismatch(from.begin(), from.end(), n.ancestry.begin(), n.ancestry.end()).first -
        from.begin());
    size_t hops = (from.size() - common) + (n.ancestry.size() - common);
    bool better =
        best == nullptr || common > bestCommon ||
        (common == bestCommon && (hops < bestHops || (hops == bestHops && n.name < best->name)));
    if (better) {
      best = &n;
      bestCommon = common;
      bestHops = hops;
    }
  }
  return best;
}

const Nic* Topology::nearestNicToGpu(int gpuIndex, std::optional<NicKind> kind) const {
  const Gpu* g = gpu(gpuIndex);
  return g ? nearestNic(g->ancestry, kind) : nullptr;
}

const Nic* Topology::nearestNicToCpu(int cpu, std::optional<NicKind> kind) const {
  auto it = std::lower_bound(cpus_.begin(), cpus_.end(), cpu,
                             [](const Cpu& c, int id) { return c.id < id; });
  if (it == cpus_.end() || it->id != cpu) return nullptr;
  return nearestNic(it->ancestry, kind);
}

std::vector<int> Topology::cpusNear(const std::string& nicName) const {
  const Nic* n = nicName.empty() ? nullptr : nic(nicName);
  if (n != nullptr && !n->localCpus.empty()) return n->localCpus;
  return cpuIds();
}

}  // namespace gflow::topology
