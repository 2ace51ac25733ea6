// The machine's topology as gflow uses it: NUMA nodes, cores, NVIDIA GPUs and
// NICs, and which NIC / NUMA node is nearest a GPU or a core. Discovered once
// per process with hwloc (src/topology/hwloc_machine.cc); docs/topology.md
// describes what is found and how devices are matched.
//
// Numbering: cpu ids are the operating system's (as in sched_getaffinity,
// taskset, /proc/cpuinfo) and NUMA node indexes too (as in numactl), so they
// can be handed to the kernel as they are.
//
// Thread safety: a Topology is an immutable value once built; every const
// method may be called from any thread. discover() is thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gflow::topology {

struct NumaNode {
  int index = -1;            // OS node number
  std::vector<int> cpus;     // ascending; empty for memory-only nodes (HBM, CXL)
  uint64_t memoryBytes = 0;  // local memory
};

struct Core {
  int index = -1;         // 0..n-1 in topology order
  std::vector<int> cpus;  // its hardware threads (PUs), ascending
  int numaNode = -1;      // -1: not within one node
};

struct Gpu {
  // The CUDA index when hwloc's CUDA plugin named the device (cudaN); else the
  // device's position in PCI bus id order (CUDA_DEVICE_ORDER=PCI_BUS_ID, which
  // is also CUDA's default order on machines with identical GPUs). Prefer
  // gpuByPciBusId() with the id CUDA reports (cudaDeviceGetPCIBusId).
  int index = -1;
  std::string pciBusId;            // "0000:17:00.0" (lower-case hex)
  std::string name;                // model, e.g. "GA100 [A100 SXM4 40GB]"; may be generic
  int numaNode = -1;               // nearest NUMA node; -1: attached above several nodes
  std::vector<int> localCpus;      // cpus of its nearest non-I/O ancestor
  std::vector<uint64_t> ancestry;  // hwloc object ids, root first (tree distance)
};

enum class NicKind {
  kNet,          // a network interface (eth0, ens1f0, ib0): sockets
  kOpenFabrics,  // an RDMA device (mlx5_0): verbs
};

enum class LinkState { kUnknown, kUp, kDown };

struct Nic {
  std::string name;  // OS device name: "ens1f0", "mlx5_0"
  NicKind kind = NicKind::kNet;
  std::string pciBusId;  // "" when not on PCI
  int numaNode = -1;     // nearest NUMA node; -1: attached above several nodes
  // Net: operstate, read from sysfs only when discovering this machine.
  // OpenFabrics: up when hwloc reports an ACTIVE port.
  LinkState link = LinkState::kUnknown;
  std::vector<int> localCpus;      // cpus of its nearest non-I/O ancestor
  std::vector<uint64_t> ancestry;  // hwloc object ids, root first
};

const char* toString(NicKind kind);
const char* toString(LinkState state);

// "0-3,8,10-11" for {0,1,2,3,8,10,11}; "" for none. Input must be ascending.
std::string formatCpuList(const std::vector<int>& cpus);

class Topology {
 public:
  // One hardware thread with its place in the tree (nearest-NIC queries).
  struct Cpu {
    int id = -1;
    int core = -1;  // index into cores()
    int numaNode = -1;
    std::vector<uint64_t> ancestry;
  };

  Topology() = default;  // knows nothing: no nodes, no cpus, no devices

  // This machine, discovered with hwloc on first use and cached for the life
  // of the process. PCI and OS devices are included when the platform exposes
  // them; without them the result simply has no GPUs or NICs (never an
  // error). Throws gflow::Error(kInternal) only when hwloc cannot describe the
  // machine at all (a later call tries again).
  static const Topology& discover();

  // A topology read from an hwloc XML export (lstopo file.xml, or written by
  // hand): for tests, and to inspect another machine. Throws
  // gflow::Error(kInvalidArgument) naming the file when it cannot be read or
  // parsed.
  static Topology fromXml(const std::string& path);

  // "this machine" or "XML file <path>", and the host name hwloc recorded.
  const std::string& source() const { return source_; }
  const std::string& hostName() const { return hostName_; }
  // False when no PCI/OS device information was available (GPUs and NICs
  // cannot be located, e.g. in some containers).
  bool ioKnown() const { return ioKnown_; }

  const std::vector<NumaNode>& numaNodes() const { return numaNodes_; }
  const std::vector<Core>& cores() const { return cores_; }
  const std::vector<Cpu>& cpus() const { return cpus_; }  // ascending by id
  std::vector<int> cpuIds() const;                        // every cpu, ascending
  const std::vector<Gpu>& gpus() const { return gpus_; }  // ascending by index
  const std::vector<Nic>& nics() const { return nics_; }  // ascending by name

  const NumaNode* numaNode(int index) const;  // nullptr when unknown
  const Gpu* gpu(int index) const;
  const Gpu* gpuByPciBusId(const std::string& busId) const;  // case-insensitive;
                                                             // "00000000:17:00.0" works
  const Nic* nic(const std::string& name) const;

  // The NUMA node holding `cpu`, -1 when none does (unknown cpu).
  int numaNodeOfCpu(int cpu) const;

  // The NIC nearest a GPU / a cpu in hwloc's tree: the one sharing the deepest
  // common ancestor with it, then the fewest hops between the two, then the
  // smallest name. `kind` restricts the candidates (kOpenFabrics for verbs).
  // nullptr when there is no candidate (or no such GPU / cpu).
  const Nic* nearestNicToGpu(int gpuIndex, std::optional<NicKind> kind = std::nullopt) const;
  const Nic* nearestNicToCpu(int cpu, std::optional<NicKind> kind = std::nullopt) const;

  // The cpus near a NIC: those of its NUMA node, or of its nearest non-I/O
  // ancestor when it is attached above several nodes. Every cpu when the NIC
  // is unknown (or empty).
  std::vector<int> cpusNear(const std::string& nicName) const;

  // A human-readable multi-line report (gflowrun --topology).
  std::string describe() const;

 private:
  friend class Builder;  // hwloc_machine.cc fills a Topology in

  const Nic* nearestNic(const std::vector<uint64_t>& from,
                        const std::optional<NicKind>& kind) const;

  std::string source_;
  std::string hostName_;
  bool ioKnown_ = false;
  std::vector<NumaNode> numaNodes_;
  std::vector<Core> cores_;
  std::vector<Cpu> cpus_;
  std::vector<Gpu> gpus_;
  std::vector<Nic> nics_;
};

}  // namespace gflow::topology
