#include "transport/verbs/device.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>

#include "common/check.h"
#include "common/logging.h"
#include "common/params.h"
#include "topology/topology.h"

namespace gflow::transport::verbs {
namespace {

ErrorContext initCtx(int rank) {
  return ErrorContext::forOp("init").withRank(rank);
}

std::string linkLayerName(uint8_t ll) {
  return ll == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand";
}

// The NIC the topology puts nearest this thread's first allowed cpu.
std::string nearestRdmaNic() {
  try {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return "";
    int cpu = -1;
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &set)) {
        cpu = i;
        break;
      }
    }
    if (cpu < 0) return "";
    const topology::Nic* n =
        topology::Topology::discover().nearestNicToCpu(cpu, topology::NicKind::kOpenFabrics);
    return n ? n->name : "";
  } catch (const Error&) {
    return "";
  }
}

bool ipv4Mapped(const ibv_gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, sizeof(prefix)) == 0;
}

bool zeroGid(const ibv_gid& g) {
  for (uint8_t b : g.raw) {
    if (b) return false;
  }
  return true;
}

// sysfs says which RoCE version a GID index is ("RoCE v2", "IB/RoCE v1");
// "" when unknown (no sysfs entry, e.g. the software test device).
std::string gidType(const std::string& dev, int port, int index) {
  std::ifstream f("/sys/class/infiniband/" + dev + "/ports/" + std::to_string(port) +
                  "/gid_attrs/types/" + std::to_string(index));
  std::string line;
  if (f && std::getline(f, line)) return line;
  return "";
}

}  // namespace

HcaSpec parseHcaSpec(const std::string& text) {
  HcaSpec spec;
  std::string s = text;
  if (!s.empty() && s[0] == '^') {
    spec.exclude = true;
    s.erase(0, 1);
  }
  size_t pos = 0;
  while (pos <= s.size() && !s.empty()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    HcaEntry e;
    if (!item.empty() && item[0] == '=') {
      e.exact = true;
      item.erase(0, 1);
    }
    size_t colon = item.find(':');
    if (colon != std::string::npos) {
      const std::string p = item.substr(colon + 1);
      char* end = nullptr;
      long v = p.empty() ? -1 : std::strtol(p.c_str(), &end, 10);
      if (p.empty() || *end != '\0' || v < 1 || v > 255) {
        GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("config"))
            << "GFLOW_IB_HCA='" << text << "': bad port in '" << item
            << "' (expected name[:port] with port 1-255)";
      }
      e.port = static_cast<int>(v);
      item.resize(colon);
    }
    if (item.empty()) {
      GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("config"))
          << "GFLOW_IB_HCA='" << text << "' has an empty device name (syntax: "
          << "[^][=]name[:port],...)";
    }
    e.name = item;
    spec.entries.push_back(e);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return spec;
}

bool hcaMatches(const HcaSpec& spec, const std::string& device, int port) {
  if (spec.entries.empty()) return true;
  bool hit = false;
  for (const HcaEntry& e : spec.entries) {
    const bool nameOk = e.exact ? device == e.name : device.compare(0, e.name.size(), e.name) == 0;
    if (nameOk && (e.port < 0 || e.port == port)) hit = true;
  }
  return spec.exclude ? !hit : hit;
}

std::optional<PortCandidate> choosePort(const std::vector<PortCandidate>& active,
                                        const HcaSpec& spec, const std::string& nearest) {
  std::vector<PortCandidate> allowed;
  for (const PortCandidate& c : active) {
    if (hcaMatches(spec, c.device, c.port)) allowed.push_back(c);
  }
  if (allowed.empty()) return std::nullopt;
  std::sort(allowed.begin(), allowed.end(), [](const PortCandidate& a, const PortCandidate& b) {
    return a.device != b.device ? a.device < b.device : a.port < b.port;
  });
  for (const PortCandidate& c : allowed) {
    if (!nearest.empty() && c.device == nearest) return c;
  }
  return allowed.front();
}

std::string adviceForStatus(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_RETRY_EXC_ERR:
      return "the peer did not acknowledge: its process died or destroyed the connection, or the "
             "link/switch path is down (check ibstat / ibv_devinfo on both hosts, the subnet "
             "manager, GFLOW_IB_TIMEOUT and GFLOW_IB_RETRY_CNT)";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "the peer posted no receive in time (receiver not ready)";
    case IBV_WC_REM_ACCESS_ERR:
      return "the peer refused the write: its memory registration is gone or too small (the peer "
             "failed or freed the buffer, or the ranks run different gflow versions)";
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
      return "a local buffer was not registered for this transfer (a gflow bug, or memory freed "
             "during the op)";
    case IBV_WC_WR_FLUSH_ERR: return "the connection had already failed";
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
      return "the peer rejected the request (version or configuration mismatch)";
    default: return "check ibv_devinfo, dmesg and the port counters (perfquery) on both hosts";
  }
}

std::string formatGid(const ibv_gid& gid) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (!inet_ntop(AF_INET6, gid.raw, buf, sizeof(buf))) return "?";
  return buf;
}

namespace {

// The active ports of the `num` devices in `list`; appends every port found
// to *seen (for the error when none is usable).
std::vector<PortCandidate> activePorts(const VerbsApi& api, ibv_device** list, int num,
                                       std::string* seen) {
  std::vector<PortCandidate> active;
  for (int d = 0; d < num; ++d) {
    const std::string name = api.getDeviceName(list[d]);
    ibv_context* c = api.openDevice(list[d]);
    if (!c) {
      *seen += (seen->empty() ? "" : ", ") + name + " (cannot open: " + std::strerror(errno) + ")";
      continue;
    }
    ibv_device_attr da{};
    if (api.queryDevice(c, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (api.queryPort(c, static_cast<uint8_t>(p), &pa) != 0) continue;
        const bool up = pa.state == IBV_PORT_ACTIVE;
        *seen += (seen->empty() ? "" : ", ") + name + ":" + std::to_string(p) +
                 (up ? "" : " (not active)");
        if (up) active.push_back(PortCandidate{name, p, d});
      }
    }
    api.closeDevice(c);
  }
  return active;
}

}  // namespace

Device::Device(const Settings& s) : api_(verbs::api()) {
  int num = 0;
  ibv_device** list = api_.getDeviceList(&num);
  if (!list || num == 0) {
    if (list) api_.freeDeviceList(list);
    GFLOW_THROW(kInvalidArgument, initCtx(s.rank))
        << "verbs transport: no RDMA device found (ibv_get_device_list returned 0 devices via "
        << api_.source << "); check ibv_devinfo, that the RDMA kernel modules are loaded and "
        << "/dev/infiniband is accessible, or use GFLOW_TRANSPORT=tcp";
  }
  openPort(list, num, s.rank, s.hca);
  try {
    createResources(s);
  } catch (...) {
    release();
    throw;
  }
  GFLOW_LOG(INFO) << "rank " << s.rank << ": verbs on " << describe() << " via " << api_.source;
}

void Device::openPort(ibv_device** list, int num, int rank, const std::string& hca) {
  const HcaSpec spec = parseHcaSpec(hca);
  std::string seen;
  const std::vector<PortCandidate> active = activePorts(api_, list, num, &seen);
  const std::string nearest = spec.entries.empty() || spec.exclude ? nearestRdmaNic() : "";
  std::optional<PortCandidate> pick = choosePort(active, spec, nearest);
  if (!pick) {
    api_.freeDeviceList(list);
    GFLOW_THROW(kInvalidArgument, initCtx(rank))
        << "verbs transport: no usable RDMA port (GFLOW_IB_HCA='" << hca
        << "'; ports found: " << (seen.empty() ? "none" : seen) << ")";
  }
  name_ = pick->device;
  port_ = pick->port;
  ctx_ = api_.openDevice(list[pick->deviceIndex]);
  api_.freeDeviceList(list);
  if (!ctx_) {
    GFLOW_THROW(kInternal, initCtx(rank))
        << "verbs transport: cannot open " << name_ << ": " << std::strerror(errno);
  }
}

void Device::createResources(const Settings& s) {
  if (api_.queryDevice(ctx_, &devAttr_) != 0 ||
      api_.queryPort(ctx_, static_cast<uint8_t>(port_), &portAttr_) != 0) {
    GFLOW_THROW(kInternal, initCtx(s.rank)) << "verbs transport: cannot query " << name_;
  }
  selectGid(s.rank, s.gidIndex);
  pd_ = api_.allocPd(ctx_);
  if (!pd_) {
    GFLOW_THROW(kInternal, initCtx(s.rank))
        << "verbs transport: ibv_alloc_pd on " << name_ << " failed: " << std::strerror(errno);
  }
  channel_ = api_.createCompChannel(ctx_);
  if (!channel_) {
    GFLOW_THROW(kInternal, initCtx(s.rank)) << "verbs transport: ibv_create_comp_channel on "
                                            << name_ << " failed: " << std::strerror(errno);
  }
  for (int fd : {channel_->fd, ctx_->async_fd}) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
      GFLOW_THROW(kInternal, initCtx(s.rank))
          << "verbs transport: cannot make event descriptors non-blocking: "
          << std::strerror(errno);
    }
  }
  const int cqe = s.cqEntries;
  if (cqe > devAttr_.max_cqe) {
    GFLOW_THROW(kInvalidArgument, initCtx(s.rank))
        << "verbs transport: " << name_ << " completion queues hold at most " << devAttr_.max_cqe
        << " entries, " << cqe << " needed ((ranks - 1) x GFLOW_IB_QPS_PER_PEER x "
        << "(2 x GFLOW_IB_EAGER_SLOTS + 192) + 64): lower GFLOW_IB_QPS_PER_PEER or "
        << "GFLOW_IB_EAGER_SLOTS";
  }
  cq_ = api_.createCq(ctx_, cqe, nullptr, channel_, 0);
  if (!cq_) {
    GFLOW_THROW(kInternal, initCtx(s.rank)) << "verbs transport: ibv_create_cq(" << cqe << ") on "
                                            << name_ << " failed: " << std::strerror(errno);
  }
  cqEntries_ = cqe;
  rank_ = s.rank;
}

void Device::reserveCq(int entries, const std::string& what) {
  if (entries <= cqEntries_) return;
  if (entries > devAttr_.max_cqe) {
    GFLOW_THROW(kInvalidArgument, initCtx(rank_))
        << "verbs transport: " << name_ << " completion queues hold at most " << devAttr_.max_cqe
        << " entries, " << entries << " needed for " << what
        << ": lower GFLOW_IB_QPS_PER_PEER or GFLOW_IB_EAGER_SLOTS";
  }
  // Doubling: a rank that connects its peers one by one resizes O(log N)
  // times.
  const int want = std::min(devAttr_.max_cqe, std::max(entries, 2 * cqEntries_));
  if (int rc = api_.resizeCq(cq_, want)) {
    GFLOW_THROW(kInternal, initCtx(rank_)) << "verbs transport: ibv_resize_cq(" << want << ") on "
                                           << name_ << " failed: " << std::strerror(rc);
  }
  cqEntries_ = want;
}

void Device::selectGid(int rank, std::optional<int64_t> want) {  // nullopt: "auto"
  const int len = portAttr_.gid_tbl_len;
  if (want) {
    int idx = static_cast<int>(*want);
    if (idx < 0 || idx >= len || api_.queryGid(ctx_, static_cast<uint8_t>(port_), idx, &gid_)) {
      GFLOW_THROW(kInvalidArgument, initCtx(rank))
          << "GFLOW_IB_GID_INDEX=" << idx << " is not a valid GID index of " << name_ << " port "
          << port_ << " (table has " << len << " entries; see show_gids or "
          << "/sys/class/infiniband/" << name_ << "/ports/" << port_ << "/gids)";
    }
    gidIndex_ = idx;
    return;
  }
  // InfiniBand addresses by LID; the GID is informational. RoCE needs one:
  // prefer RoCE v2 with an IPv4-mapped address (routable), then any
  // IPv4-mapped one, then the first non-zero entry.
  int best = -1, bestScore = -1;
  for (int i = 0; i < len && i < 256; ++i) {
    ibv_gid g{};
    if (api_.queryGid(ctx_, static_cast<uint8_t>(port_), i, &g) != 0 || zeroGid(g)) continue;
    int score = 1;
    if (ipv4Mapped(g)) score = 2;
    if (score == 2 && gidType(name_, port_, i) == "RoCE v2") score = 3;
    if (score > bestScore) {
      best = i;
      bestScore = score;
    }
    if (!roce()) break;  // InfiniBand: index 0 (the port GID) is all we need
  }
  if (best < 0) {
    if (roce()) {
      GFLOW_THROW(kInvalidArgument, initCtx(rank))
          << name_ << " port " << port_ << " is RoCE but has no GID configured (is an IP address "
          << "assigned to its network interface?); set GFLOW_IB_GID_INDEX";
    }
    best = 0;
    std::memset(&gid_, 0, sizeof(gid_));
  } else {
    api_.queryGid(ctx_, static_cast<uint8_t>(port_), best, &gid_);
  }
  gidIndex_ = best;
}

std::string Device::describe() const {
  std::string s =
      name_ + " port " + std::to_string(port_) + " (" + linkLayerName(portAttr_.link_layer);
  if (roce()) {
    s += ", GID index " + std::to_string(gidIndex_) + " " + formatGid(gid_);
  } else {
    s += ", LID " + std::to_string(portAttr_.lid);
  }
  return s + ")";
}

Device::~Device() {
  release();
}

void Device::release() {
  if (cq_) api_.destroyCq(cq_);
  if (channel_) api_.destroyCompChannel(channel_);
  if (pd_) api_.deallocPd(pd_);
  if (ctx_) api_.closeDevice(ctx_);
  cq_ = nullptr;
  channel_ = nullptr;
  pd_ = nullptr;
  ctx_ = nullptr;
}

}  // namespace gflow::transport::verbs
