// Communicator creation: resolving the identity and the store
// (Communicator::create), connecting the backends (CommunicatorImpl::connect),
// the creation-time agreement on hosts and settings, the host grouping's
// backends, and split().
#include <algorithm>
#include <mutex>

#include "bootstrap/environment.h"
#include "bootstrap/rendezvous.h"
#include "common/check.h"
#include "common/fd_limit.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/params.h"
#include "common/tick_clock.h"
#include "core/communicator_impl.h"
#include "core/host_backends.h"
#include "gflow/communicator.h"
#include "topology/data_interface.h"

namespace gflow {

using backend::OpDesc;
using backend::OpKind;

void checkAuthenticated(const bootstrap::Identity& id, bool tokenComing) {
  if (!id.token.empty() || tokenComing) return;
  if (params::requireToken() != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "GFLOW_REQUIRE_TOKEN=1 and this job has no token: set GFLOW_JOB_TOKEN to the "
                "same secret on every rank (or Options::token), or launch with gflowrun",
                ErrorContext::forOp("init").withRank(id.rank));
  }
  static std::once_flag warned;
  if (id.rank != 0) return;
  std::call_once(warned, [] {
    GFLOW_LOG(WARN) << "this job has no token (GFLOW_JOB_TOKEN is unset): any process that can "
                       "reach rank 0's store port or a rank's data port can join or disrupt it. "
                       "Set GFLOW_JOB_TOKEN to the same secret on every rank (gflowrun generates "
                       "one); GFLOW_REQUIRE_TOKEN=1 makes a missing token an error";
  });
}

std::shared_ptr<Communicator> Communicator::create(const Options& options) {
  fdlimit::raiseToHard();  // a job of many peers keeps a socket to each it talks to
  const Settings settings = resolveSettings(options);  // before any connection
  bootstrap::Identity id = bootstrap::resolveIdentity(options);
  checkAuthenticated(id, id.pmix && !options.store);
  const std::chrono::milliseconds timeout = timeoutOf(options);
  std::shared_ptr<Store> store = options.store;
  if (!store) {
    const std::string ifname =
        !options.tcp.socketIfname.empty() ? options.tcp.socketIfname : params::socketIfname();
    store = bootstrap::openStore(&id, ifname, timeout);
  }
  // Each rank counts the communicators it created on this store; ranks that
  // create them in the same order get the same key prefix.
  const int64_t generation = store->add("gflow/created/" + std::to_string(id.rank), 1);
  auto impl = CommunicatorImpl::connect(CommunicatorImpl::planFor(
      options, settings, id, std::move(store), "gflow/w" + std::to_string(generation) + "/"));
  const CommunicatorImpl::HostLayout& l = impl->hostLayout();
  GFLOW_LOG(INFO) << "rank " << id.rank << "/" << id.size << " ready (host " << l.hostIndex << "/"
                  << l.numHosts << ", local " << l.localRank << "/" << l.localSize
                  << ", identity from " << id.source << ")";
  return std::shared_ptr<Communicator>(std::move(impl));
}

std::chrono::milliseconds timeoutOf(const Options& options) {
  return options.timeout.count() > 0 ? options.timeout
                                     : std::chrono::milliseconds(params::timeoutMs());
}

CommunicatorImpl::ConnectPlan CommunicatorImpl::planFor(const Options& options,
                                                        const Settings& settings,
                                                        const bootstrap::Identity& id,
                                                        std::shared_ptr<Store> store,
                                                        std::string prefix) {
  ConnectPlan plan;
  transport::ContextOptions& co = plan.context;
  co.rank = id.rank;
  co.size = id.size;
  co.store = std::move(store);
  co.prefix = std::move(prefix);
  co.token = id.token;
  co.timeout = timeoutOf(options);
  co.connect = settings.connect;
  co.tcp = options.tcp;
  co.verbs = options.verbs;
  co.ranksOnHost = id.localSize;  // the launcher's count until host identities are known
  const std::string host =
      !options.hostId.empty() ? options.hostId : bootstrap::hostId(id.launcherHost);
  co.hostHash = hash::sha256Id(host);
  co.localSingleCopy = settings.shm;
  plan.transportName = !options.transport.empty() ? options.transport : params::transport();
  plan.settings = settings;
  plan.hostHash = co.hostHash;
  plan.launcherLocalRank = id.localRank;
  plan.launcherLocalSize = id.localSize;
  return plan;
}

std::unique_ptr<CommunicatorImpl> CommunicatorImpl::connect(ConnectPlan plan) {
  transport::ContextOptions& ctxOpts = plan.context;
  const Settings& settings = plan.settings;
  const std::string& transportName = plan.transportName;
  const int rank = ctxOpts.rank, size = ctxOpts.size;
  ctxOpts.progress = settings.progress;
  auto impl = std::make_unique<CommunicatorImpl>();
  impl->rank = rank;
  impl->size = size;
  impl->timeout = ctxOpts.timeout;
  impl->transportName = transportName;
  impl->arrivals = std::make_shared<Arrivals>(rank, size, params::straggler() != 0);
  const int64_t reportMs = params::stragglerReport();
  impl->reportEvery = reportMs > 0 ? TickClock::fromNs(reportMs * 1000000) : 0;
  impl->executing.enter();  // no op runs yet: the creating thread is the only one
  impl->lastReport = Arrivals::now();
  impl->summaryAtExit = params::stragglerAtExit() != 0 || impl->reportEvery > 0;
  ctxOpts.arrivals = impl->arrivals;  // not a parent's (split)
  ctxOpts.arrivalRanks.clear();
  impl->contextOptions = ctxOpts;
  impl->settings = settings;
  impl->executor.setPinNear(topology::dataInterfaceName(ctxOpts.tcp.socketIfname),
                            settings.progress.pinThreads);
  impl->executor.setPriority(settings.progress.priority
                                 ? *settings.progress.priority
                                 : static_cast<int>(params::progressPriority()));
  impl->executor.setBackground([self = impl.get()] {
    self->executing.enter();  // the executor's background runs on the executing thread
    return self->progressInFlight();
  });
  backend::RouterParts parts;
  parts.policy = std::make_shared<const backend::RoutePolicy>(
      settings.algo, settings.algoSource,
      backend::RoutePolicy::Thresholds{settings.rdMaxBytes, settings.hdMaxBytes},
      settings.model.empty() ? std::nullopt
                             : std::optional<backend::CostModel>(
                                   backend::CostModel::parse(settings.model, "GFLOW_MODEL")));
  parts.rank = rank;
  parts.size = size;
  parts.flat =
      backend::createHostBackend(transport::createContext(transportName, ctxOpts), settings.tuning);
  parts.verifyNccl = settings.verifyDeviceOps;
  parts.ncclP2P = settings.ncclP2P;
  impl->backend = std::make_unique<backend::Router>(std::move(parts));
  impl->verdict.attach({rank, size, ctxOpts.timeout, impl->backend.get(), &impl->executor});
  impl->agreeOnHostsAndSettings(plan.hostHash);
  impl->buildHierarchy(ctxOpts, plan.launcherLocalRank, plan.launcherLocalSize);
  impl->opCount[opIndex(OpKind::kAllgather)] = 0;  // internal op, not the user's
  impl->arrivals->clearRecord();
  impl->backend->resetPaths();
  return impl;
}

void CommunicatorImpl::agreeOnHostsAndSettings(uint64_t hostHash) {
  // Settings that decide which path an op takes must agree: ranks that
  // disagree would wait in different places until the timeout instead of
  // failing at once. One hash per kAgree parameter of the value in force
  // (however it was set), so the error names the parameter.
  const std::vector<Settings::Agreed> agreed = settings.agreed();
  const size_t words = 1 + agreed.size();
  std::vector<uint64_t> mine{hostHash};
  for (const Settings::Agreed& a : agreed) {
    mine.push_back(hash::sha256Id(std::string(a.param->name) + "=" + a.value));
  }
  std::vector<uint64_t> all(words * static_cast<size_t>(size));
  OpDesc d;
  d.kind = OpKind::kAllgather;
  d.dtype = DataType::kInt64;
  d.count = words;
  auto w = submit(d, true, [this, &mine, &all](const backend::Op& op) {
    backend->allgather(op, mine.data(), all.data());
  });
  w->wait(std::chrono::milliseconds(0));
  hostOf.assign(size, 0);
  for (int r = 0; r < size; ++r) {
    hostOf[r] = all[words * r];
    for (size_t i = 0; i < agreed.size(); ++i) {
      if (all[words * r + 1 + i] == all[1 + i]) continue;
      const Settings::Agreed& a = agreed[i];
      GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("init").withRank(rank).withPeer(r))
          << "rank " << r << " and rank 0 are configured differently: " << a.param->name << " ("
          << a.field << ") differs (this rank: '" << a.value
          << "'); every rank must use the same values of " << params::agreementNames()
          << ", whether set through Options or the environment";
    }
  }
}

void CommunicatorImpl::buildHierarchy(const transport::ContextOptions& ctxOpts,
                                      int launcherLocalRank, int launcherLocalSize) {
  const backend::Hierarchy h = backend::Hierarchy::fromHostHashes(rank, hostOf);
  layout = {h.localRank(), h.localSize(), h.host(), h.numHosts};
  if ((launcherLocalRank >= 0 && launcherLocalRank != layout.localRank) ||
      (launcherLocalSize >= 0 && launcherLocalSize != layout.localSize)) {
    GFLOW_LOG(WARN) << "rank " << rank << ": the launcher says local rank " << launcherLocalRank
                    << " of " << launcherLocalSize << ", but host identities ("
                    << "hostname + boot id, or GFLOW_HOST_ID) give " << layout.localRank << " of "
                    << layout.localSize << "; gflow groups ranks by host identity";
  }
  // Contexts made from now on (the host backends', split()'s) know how many
  // ranks share this host's cpus.
  contextOptions.ranksOnHost = layout.localSize;
  transport::ContextOptions hostOpts = ctxOpts;
  hostOpts.ranksOnHost = layout.localSize;
  HostBackends hb = connectHostBackends(h, hostOpts, transportName, backend->policy(), settings);
  backend->attach({std::move(hb.shm), std::move(hb.hierarchical), hb.caps},
                  backend::DeviceSetup{rank, size, ctxOpts.store, ctxOpts.prefix, ctxOpts.timeout,
                                       hostOf, settings.deviceBackend});
}

std::shared_ptr<Communicator> Communicator::localCommunicator() {
  return split(impl(*this).hostLayout().hostIndex, impl(*this).commRank());
}

std::shared_ptr<Communicator> Communicator::crossHostCommunicator() {
  const CommunicatorImpl::HostLayout& l = impl(*this).hostLayout();
  return split(l.localRank, l.hostIndex);
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  return impl(*this).splitOff(color, key);
}

std::shared_ptr<Communicator> CommunicatorImpl::splitOff(int color, int key) {
  checkUsable("split");
  std::vector<int64_t> mine{color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(size));
  allgather(Tensor(mine.data(), 2, DataType::kInt64),
            Tensor(all.data(), all.size(), DataType::kInt64));
  const uint64_t splitId = splitCount++;
  if (color < 0) {
    splitBackend(-1, key, nullptr);  // collective over the parent's ranks
    return nullptr;
  }
  std::vector<std::pair<int64_t, int>> members;  // (key, parent rank)
  for (int r = 0; r < size; ++r) {
    if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  int newRank = 0;
  std::vector<uint64_t> hosts;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == rank) newRank = static_cast<int>(i);
    hosts.push_back(hostOf[members[i].second]);
  }
  transport::ContextOptions co = contextOptions;
  co.rank = newRank;
  co.size = static_cast<int>(members.size());
  co.prefix = contextOptions.prefix + "split" + std::to_string(splitId) + "/c" +
              std::to_string(color) + "/";
  // The sub-communicator inherits the parent's settings.
  auto impl = CommunicatorImpl::connect({co, transportName, settings, hostOf[rank]});
  // Where NCCL runs this communicator, the new one gets its part of it
  // (ncclCommSplit) instead of creating its own.
  splitBackend(color, key, impl.get());
  return std::shared_ptr<Communicator>(std::move(impl));
}

void CommunicatorImpl::splitBackend(int color, int key, CommunicatorImpl* child) {
  // On the executing thread, after every earlier op: whether NCCL runs this
  // communicator is known there, and the same on every rank.
  auto task = [this, color, key, child] {
    executing.enter();  // a task of the executor
    if (auto e = error()) throw *e;
    const backend::Op op{seq, OpDesc{}, Deadline::after(timeout), nullptr};
    try {
      backend->splitInto(op, color, key, child ? child->backend.get() : nullptr);
    } catch (const Error& e) {
      Error full = relabel(
          e, ErrorContext::forOp("split").withSeq(seq).withRank(rank).withPeer(blamed(e, size)));
      verdict.fail(full);
      throw full;
    }
  };
  executor.submit(std::move(task), true)->wait(std::chrono::milliseconds(0));
}

}  // namespace gflow
