// Everything that talks to hwloc: loading this machine (once) or an XML
// export, turning hwloc's tree into a Topology value, and binding threads.
#include "topology/hwloc_machine.h"

#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/logging.h"
#include "topology/topology.h"

namespace gflow::topology {

namespace {

const ErrorContext kTopoCtx = ErrorContext::forOp("topology");

constexpr unsigned kNvidiaVendor = 0x10de;
constexpr unsigned kDisplayClass = 0x03;  // PCI base class: VGA (0x0300), 3D (0x0302), ...

struct TopologyDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* b) const { hwloc_bitmap_free(b); }
};
using BitmapPtr = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

std::vector<int> toCpuList(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (set == nullptr || hwloc_bitmap_weight(set) < 0) return out;  // < 0: infinite
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) out.push_back(i);
  return out;
}

// The node of a nodeset with exactly one node, else -1.
int singleNode(hwloc_const_nodeset_t nodes) {
  if (nodes == nullptr || hwloc_bitmap_weight(nodes) != 1) return -1;
  return hwloc_bitmap_first(nodes);
}

std::vector<uint64_t> ancestryOf(hwloc_obj_t obj) {
  std::vector<uint64_t> path;
  for (hwloc_obj_t o = obj; o != nullptr; o = o->parent) path.push_back(o->gp_index);
  std::reverse(path.begin(), path.end());
  return path;
}

std::string busIdOf(hwloc_obj_t pci) {
  const auto& a = pci->attr->pcidev;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", static_cast<unsigned>(a.domain),
                static_cast<unsigned>(a.bus), static_cast<unsigned>(a.dev),
                static_cast<unsigned>(a.func));
  return buf;
}

hwloc_obj_t pciAncestor(hwloc_obj_t obj) {
  for (hwloc_obj_t o = obj->parent; o != nullptr; o = o->parent) {
    if (o->type == HWLOC_OBJ_PCI_DEVICE) return o;
  }
  return nullptr;
}

std::string infoOf(hwloc_obj_t obj, const char* name) {
  const char* v = hwloc_obj_get_info_by_name(obj, name);
  return v ? v : "";
}

bool isNvidiaGpu(hwloc_obj_t pci) {
  const auto& a = pci->attr->pcidev;
  return a.vendor_id == kNvidiaVendor && (a.class_id >> 8) == kDisplayClass;
}

bool startsWith(const std::string& s, const char* prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

// "cuda3" -> 3; -1 for anything else.
int cudaIndex(const std::string& name) {
  if (!startsWith(name, "cuda") || name.size() == 4) return -1;
  int v = 0;
  for (size_t i = 4; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > 100000) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// A network interface's operstate from sysfs: only meaningful for this machine.
LinkState netLinkState(const std::string& name) {
  std::ifstream in("/sys/class/net/" + name + "/operstate");
  std::string state;
  if (!(in >> state)) return LinkState::kUnknown;
  if (state == "up") return LinkState::kUp;
  if (state == "down" || state == "lowerlayerdown" || state == "notpresent")
    return LinkState::kDown;
  return LinkState::kUnknown;
}

// hwloc records verbs port states as "Port<N>State" infos (4 = ACTIVE).
LinkState openFabricsLinkState(hwloc_obj_t osdev) {
  bool sawPort = false;
  for (unsigned i = 0; i < osdev->infos_count; ++i) {
    std::string key = osdev->infos[i].name ? osdev->infos[i].name : "";
    if (!startsWith(key, "Port") || key.size() < 9 || key.compare(key.size() - 5, 5, "State") != 0)
      continue;
    sawPort = true;
    if (osdev->infos[i].value && std::string(osdev->infos[i].value) == "4") return LinkState::kUp;
  }
  return sawPort ? LinkState::kDown : LinkState::kUnknown;
}

void checkApiVersion() {
  // The ABI changes between major versions (1.x -> 2.x -> 3.x).
  unsigned runtime = hwloc_get_api_version();
  if ((runtime >> 16) != (HWLOC_API_VERSION >> 16)) {
    GFLOW_THROW(kInternal, kTopoCtx)
        << "gflow was built against hwloc API 0x" << std::hex << HWLOC_API_VERSION
        << " but loaded libhwloc with API 0x" << runtime << "; install a matching libhwloc";
  }
}

TopologyPtr newTopology(bool withIo) {
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0) {
    GFLOW_THROW(kInternal, kTopoCtx) << "hwloc_topology_init failed: " << std::strerror(errno);
  }
  TopologyPtr p(t);
  // KEEP_IMPORTANT: GPUs, NICs, storage and the bridges above them, without
  // every other PCI function and OS device.
  if (withIo) hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  return p;
}

}  // namespace

// Turns a loaded hwloc tree into a Topology (friend of Topology).
class Builder {
 public:
  static Topology build(hwloc_topology_t t, std::string source, bool thisSystem) {
    Topology topo;
    topo.source_ = std::move(source);
    topo.hostName_ = infoOf(hwloc_get_root_obj(t), "HostName");
    addNumaNodes(t, &topo);
    addCoresAndCpus(t, &topo);
    addGpus(t, &topo);
    addNics(t, &topo, thisSystem);
    topo.ioKnown_ =
        hwloc_get_next_pcidev(t, nullptr) != nullptr || hwloc_get_next_osdev(t, nullptr) != nullptr;
    return topo;
  }

 private:
  static void addNumaNodes(hwloc_topology_t t, Topology* topo) {
    for (hwloc_obj_t o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nullptr); o != nullptr;
         o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, o)) {
      NumaNode n;
      n.index = static_cast<int>(o->os_index);
      n.cpus = toCpuList(o->cpuset);
      n.memoryBytes = o->attr ? o->attr->numanode.local_memory : 0;
      topo->numaNodes_.push_back(std::move(n));
    }
    std::sort(topo->numaNodes_.begin(), topo->numaNodes_.end(),
              [](const NumaNode& a, const NumaNode& b) { return a.index < b.index; });
  }

  static void addCoresAndCpus(hwloc_topology_t t, Topology* topo) {
    for (hwloc_obj_t o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_CORE, nullptr); o != nullptr;
         o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_CORE, o)) {
      Core c;
      c.index = static_cast<int>(topo->cores_.size());
      c.cpus = toCpuList(o->cpuset);
      c.numaNode = singleNode(o->nodeset);
      topo->cores_.push_back(std::move(c));
    }
    const bool haveCores = !topo->cores_.empty();
    for (hwloc_obj_t o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_PU, nullptr); o != nullptr;
         o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_PU, o)) {
      Topology::Cpu cpu;
      cpu.id = static_cast<int>(o->os_index);
      cpu.numaNode = singleNode(o->nodeset);
      cpu.ancestry = ancestryOf(o);
      if (!haveCores) {
        // Some virtual machines report no cores: each hardware thread is one.
        Core c;
        c.index = static_cast<int>(topo->cores_.size());
        c.cpus = {cpu.id};
        c.numaNode = cpu.numaNode;
        topo->cores_.push_back(std::move(c));
      }
      topo->cpus_.push_back(std::move(cpu));
    }
    for (Topology::Cpu& cpu : topo->cpus_) {
      for (const Core& c : topo->cores_) {
        if (std::binary_search(c.cpus.begin(), c.cpus.end(), cpu.id)) cpu.core = c.index;
      }
    }
    std::sort(topo->cpus_.begin(), topo->cpus_.end(),
              [](const Topology::Cpu& a, const Topology::Cpu& b) { return a.id < b.id; });
  }

  // Where a device sits: the cpus and NUMA node of its nearest non-I/O
  // ancestor (the object hwloc attached its PCI hierarchy to).
  template <typename Device>
  static void locate(hwloc_topology_t t, hwloc_obj_t obj, Device* d) {
    hwloc_obj_t host = hwloc_get_non_io_ancestor_obj(t, obj);
    d->ancestry = ancestryOf(obj);
    if (host == nullptr) return;
    d->localCpus = toCpuList(host->cpuset);
    d->numaNode = singleNode(host->nodeset);
  }

  static void addGpus(hwloc_topology_t t, Topology* topo) {
    std::vector<int> cudaIndexes;
    for (hwloc_obj_t pci = hwloc_get_next_pcidev(t, nullptr); pci != nullptr;
         pci = hwloc_get_next_pcidev(t, pci)) {
      if (!isNvidiaGpu(pci)) continue;
      Gpu g;
      g.pciBusId = busIdOf(pci);
      locate(t, pci, &g);
      int cuda = -1;
      std::string model;
      // OS devices below the PCI function: cudaN (CUDA plugin), nvmlN, cardN.
      for (hwloc_obj_t os = pci->io_first_child; os != nullptr; os = os->next_sibling) {
        if (os->type != HWLOC_OBJ_OS_DEVICE || os->name == nullptr) continue;
        if (cuda < 0) cuda = cudaIndex(os->name);
        if (model.empty()) model = infoOf(os, "GPUModel");
      }
      if (model.empty()) model = infoOf(pci, "PCIDevice");
      if (model.empty()) {
        char buf[48];
        std::snprintf(buf, sizeof(buf), "NVIDIA GPU [10de:%04x]",
                      static_cast<unsigned>(pci->attr->pcidev.device_id));
        model = buf;
      }
      g.name = model;
      g.index = cuda;
      cudaIndexes.push_back(cuda);
      topo->gpus_.push_back(std::move(g));
    }
    // CUDA indexes only when every GPU has a distinct one; otherwise PCI order.
    std::sort(cudaIndexes.begin(), cudaIndexes.end());
    bool useCuda = !cudaIndexes.empty() && cudaIndexes.front() >= 0 &&
                   std::adjacent_find(cudaIndexes.begin(), cudaIndexes.end()) == cudaIndexes.end();
    std::sort(topo->gpus_.begin(), topo->gpus_.end(),
              [](const Gpu& a, const Gpu& b) { return a.pciBusId < b.pciBusId; });
    if (!useCuda) {
      for (size_t i = 0; i < topo->gpus_.size(); ++i) topo->gpus_[i].index = static_cast<int>(i);
    }
    std::sort(topo->gpus_.begin(), topo->gpus_.end(),
              [](const Gpu& a, const Gpu& b) { return a.index < b.index; });
  }

  static void addNics(hwloc_topology_t t, Topology* topo, bool thisSystem) {
    for (hwloc_obj_t os = hwloc_get_next_osdev(t, nullptr); os != nullptr;
         os = hwloc_get_next_osdev(t, os)) {
      const hwloc_obj_osdev_type_t type = os->attr->osdev.type;
      if (os->name == nullptr ||
          (type != HWLOC_OBJ_OSDEV_NETWORK && type != HWLOC_OBJ_OSDEV_OPENFABRICS)) {
        continue;
      }
      Nic n;
      n.name = os->name;
      n.kind = type == HWLOC_OBJ_OSDEV_NETWORK ? NicKind::kNet : NicKind::kOpenFabrics;
      if (hwloc_obj_t pci = pciAncestor(os)) n.pciBusId = busIdOf(pci);
      locate(t, os, &n);
      if (n.kind == NicKind::kOpenFabrics) {
        n.link = openFabricsLinkState(os);
      } else if (thisSystem) {
        n.link = netLinkState(n.name);
      }
      topo->nics_.push_back(std::move(n));
    }
    std::sort(topo->nics_.begin(), topo->nics_.end(),
              [](const Nic& a, const Nic& b) { return a.name < b.name; });
  }
};

namespace {

// This machine's hwloc handle and what was built from it. Never destroyed:
// threads may bind through the handle until the process exits.
struct Loaded {
  TopologyPtr handle;
  Topology topo;
};

const Loaded* loadThisMachine() {
  checkApiVersion();
  TopologyPtr t = newTopology(/*withIo=*/true);
  if (hwloc_topology_load(t.get()) != 0) {
    // Some platforms fail in PCI discovery; CPUs and NUMA nodes still matter.
    GFLOW_LOG(WARN) << "hwloc could not load this machine's topology with I/O devices ("
                    << std::strerror(errno) << "); retrying without GPUs and NICs";
    t = newTopology(/*withIo=*/false);
    if (hwloc_topology_load(t.get()) != 0) {
      GFLOW_THROW(kInternal, kTopoCtx)
          << "hwloc could not discover this machine's topology: " << std::strerror(errno);
    }
  }
  Topology topo = Builder::build(t.get(), "this machine", /*thisSystem=*/true);
  auto* loaded = new Loaded{std::move(t), std::move(topo)};
  GFLOW_LOG(DEBUG) << "topology: " << loaded->topo.numaNodes().size() << " NUMA node(s), "
                   << loaded->topo.cpus().size() << " cpu(s), " << loaded->topo.gpus().size()
                   << " GPU(s), " << loaded->topo.nics().size() << " NIC(s)";
  return loaded;
}

const Loaded& thisMachine() {
  // A throwing initializer leaves the static unset, so a later call retries.
  static const Loaded* loaded = loadThisMachine();
  return *loaded;
}

}  // namespace

const Topology& Topology::discover() {
  return thisMachine().topo;
}

Topology Topology::fromXml(const std::string& path) {
  checkApiVersion();
  {
    std::ifstream in(path);
    if (!in) {
      GFLOW_THROW(kInvalidArgument, kTopoCtx)
          << "cannot read hwloc XML topology file '" << path << "': " << std::strerror(errno);
    }
  }
  TopologyPtr t = newTopology(/*withIo=*/true);
  if (hwloc_topology_set_xml(t.get(), path.c_str()) != 0) {
    GFLOW_THROW(kInvalidArgument, kTopoCtx)
        << "hwloc cannot use '" << path << "' as an XML topology: " << std::strerror(errno);
  }
  if (hwloc_topology_load(t.get()) != 0) {
    GFLOW_THROW(kInvalidArgument, kTopoCtx)
        << "hwloc cannot parse '" << path
        << "' as an XML topology (expected an hwloc v2 export, e.g. from 'lstopo file.xml'): "
        << std::strerror(errno);
  }
  return Builder::build(t.get(), "XML file " + path, /*thisSystem=*/false);
}

namespace machine {

std::vector<int> currentThreadAffinity() {
  // Sized for large machines; CPU_ALLOC rounds up to whole words.
  constexpr int kMaxCpus = 8192;
  cpu_set_t* set = CPU_ALLOC(kMaxCpus);
  const size_t bytes = CPU_ALLOC_SIZE(kMaxCpus);
  std::vector<int> out;
  if (set != nullptr && sched_getaffinity(0, bytes, set) == 0) {
    for (int c = 0; c < kMaxCpus; ++c) {
      if (CPU_ISSET_S(c, bytes, set)) out.push_back(c);
    }
  }
  if (set != nullptr) CPU_FREE(set);
  return out;
}

int currentCpu() {
  return sched_getcpu();
}

std::string bindCurrentThread(const std::vector<int>& cpus) {
  try {
    const Loaded& m = thisMachine();
    BitmapPtr set(hwloc_bitmap_alloc());
    if (!set) return "out of memory";
    for (int c : cpus) hwloc_bitmap_set(set.get(), static_cast<unsigned>(c));
    if (hwloc_set_cpubind(m.handle.get(), set.get(), HWLOC_CPUBIND_THREAD) != 0) {
      return std::string("hwloc_set_cpubind: ") + std::strerror(errno);
    }
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace machine

}  // namespace gflow::topology
