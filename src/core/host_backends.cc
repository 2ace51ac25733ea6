#include "core/host_backends.h"

#include <algorithm>

#include "backend/shm/shm_backend.h"
#include "common/logging.h"
#include "common/params.h"

namespace gflow {
namespace {

struct Builder {
  const transport::ContextOptions& ctx;
  const std::string& transportName;
  const Settings& settings;

  // `members` (communicator ranks) over shared memory; nullptr when it is
  // unavailable. `nameCommRanks`: errors name communicator ranks.
  // `singleCopy`: the allreduces the group runs by single copy.
  std::unique_ptr<backend::Backend> shm(const std::vector<int>& members, int me,
                                        const std::string& prefix, bool nameCommRanks,
                                        backend::ByteRange* singleCopy) const {
    backend::shm::GroupOptions go;
    go.rank = me;
    go.size = static_cast<int>(members.size());
    if (nameCommRanks) go.commRanks = members;
    go.store = ctx.store;
    go.prefix = prefix;
    go.timeout = ctx.timeout;
    go.slotBytes = settings.shmChunkBytes;
    go.describe = backend::describe;
    go.probeSingleCopy = settings.shmSingleCopy != "off";
    go.arrivals = ctx.arrivals;
    go.arrivalRanks = members;
    std::string why;
    auto g = backend::shm::Group::connect(go, &why);
    if (!g) {
      GFLOW_LOG(WARN) << "rank " << ctx.rank << ": shared memory between the ranks of this host "
                      << "is unavailable (" << why << "); they use " << transportName;
      return nullptr;
    }
    *singleCopy = g->singleCopy() && go.size > 1
                      ? backend::RoutePolicy::shmSingleCopyRange(settings.shmSingleCopy, go.size,
                                                                 g->oversubscribed())
                      : backend::ByteRange{};
    return backend::createShmBackend(std::move(g));
  }

  std::unique_ptr<backend::Backend> net(const std::vector<int>& members, int me,
                                        const std::string& prefix) const {
    transport::ContextOptions co = ctx;
    co.rank = me;
    co.size = static_cast<int>(members.size());
    co.prefix = prefix;
    co.arrivalRanks = members;
    return backend::createHostBackend(transport::createContext(transportName, co), settings.tuning);
  }
};

void logUnevenHosts(const backend::Hierarchy& h) {
  std::string counts;
  for (int host = 0; host < h.numHosts; ++host) {
    counts += (host ? "," : "") + std::to_string(h.localSizeOf(host));
  }
  GFLOW_LOG(INFO) << "hosts have different rank counts (" << counts
                  << "): hierarchical allreduce carries each host's sum through its local "
                     "rank 0 (leaders)";
}

// `caps`: gets the local group's single-copy range.
std::unique_ptr<backend::Backend> hierarchical(const Builder& b, const backend::Hierarchy& h,
                                               const backend::RoutePolicy& policy,
                                               backend::Capabilities* caps) {
  using backend::Path;
  const std::vector<int> locals = h.ranksOfHost(h.host());
  const std::vector<int> cross = h.ranksWithLocalRank(h.localRank());
  const std::string hostPrefix = b.ctx.prefix + "host" + std::to_string(h.host()) + "/";
  std::unique_ptr<backend::Backend> local;
  if (b.settings.shm) {
    local = b.shm(locals, h.localRank(), hostPrefix + "shm/", false, &caps->shmSingleCopy);
  }
  const Path localPath = local ? Path::kShm : Path::kNetwork;
  if (!local) local = b.net(locals, h.localRank(), hostPrefix + "net/");
  const int crossRank =
      static_cast<int>(std::find(cross.begin(), cross.end(), h.rank) - cross.begin());
  auto crossB =
      b.net(cross, crossRank, b.ctx.prefix + "cross" + std::to_string(h.localRank()) + "/");
  backend::PhaseRoutes routes;
  routes.local = [p = &policy, localPath, single = caps->shmSingleCopy](backend::OpKind kind,
                                                                        uint64_t bytes, int n) {
    return p->phase(kind, bytes, n, localPath, single);
  };
  routes.cross = [p = &policy](backend::OpKind kind, uint64_t bytes, int n) {
    return p->phase(kind, bytes, n, Path::kNetwork, {});
  };
  return backend::createHierarchicalBackend(
      h, std::move(local), std::move(crossB), std::move(routes),
      b.settings.tuning.hierSegmentBytes.value_or(0));  // 0: GFLOW_HIER_SEGMENT
}

}  // namespace

HostBackends connectHostBackends(const backend::Hierarchy& h, const transport::ContextOptions& ctx,
                                 const std::string& transportName,
                                 const backend::RoutePolicy& policy, const Settings& settings) {
  const Builder b{ctx, transportName, settings};
  HostBackends out;
  if (h.numHosts == 1 && h.size > 1 && settings.shm) {
    std::vector<int> all(static_cast<size_t>(h.size));
    for (int r = 0; r < h.size; ++r) all[r] = r;
    out.shm = b.shm(all, h.rank, ctx.prefix + "shm/", true, &out.caps.shmSingleCopy);
    out.caps.shm = out.shm != nullptr;
  } else if (h.numHosts > 1 && h.numHosts < h.size) {
    if (ctx.arrivals) ctx.arrivals->setConcurrent();  // its phases overlap
    out.hierarchical = hierarchical(b, h, policy, &out.caps);
    out.caps.hierarchical = true;
    out.caps.uniform = h.uniform;
    out.caps.hosts = h.numHosts;
    out.caps.perHost = h.localSizeOf(0);
    out.caps.segmentBytes = settings.tuning.hierSegmentBytes.value_or(params::hierSegment());
    if (!h.uniform && h.rank == 0) logUnevenHosts(h);
  }
  return out;
}

}  // namespace gflow
