#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <tuple>

#include "backend/device_buffers.h"
#include "backend/hierarchical/hierarchical.h"
#include "bootstrap/environment.h"
#include "bootstrap/rendezvous.h"
#include "common/check.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/params.h"
#include "common/socket.h"
#include "common/tick_clock.h"
#include "core/communicator_impl.h"
#include "core/frontend.h"
#include "core/host_backends.h"
#include "core/internal.h"
#include "core/op_checks.h"
#include "gflow/communicator.h"
#include "topology/data_interface.h"

namespace gflow {

using backend::Algorithm;
using backend::OpDesc;
using backend::OpKind;

// ---- CommunicatorImpl ------------------------------------------------------

namespace {

// `e` re-labelled with the op that was waiting on it; fields `ctx` leaves
// unset keep e's.
Error relabel(const Error& e, ErrorContext ctx) {
  const ErrorContext& had = e.context();
  if (ctx.op.empty()) ctx.op = had.op;
  if (ctx.seq == 0) ctx.seq = had.seq;
  if (ctx.rank < 0) ctx.rank = had.rank;
  if (ctx.peer < 0) ctx.peer = had.peer;
  if (ctx.culprit < 0) ctx = ctx.withCulprit(had.culprit, had.reportedSeq);
  return Error(e.code(), e.detail(), std::move(ctx));
}

// The rank `e` blames: the culprit a peer's report named (when it is a rank
// of this communicator), else the peer that failed this rank's wait.
int blamed(const Error& e, int size) {
  const int culprit = e.context().culprit;
  return culprit >= 0 && culprit < size ? culprit : e.peer();
}

// The op `e` concerns: an earlier op a peer's report said it failed in (a
// rank that completed op n fails in n+1 when a peer still in n reports),
// else this rank's op `mine`.
uint64_t reportedOp(const Error& e, uint64_t mine) {
  const uint64_t theirs = e.context().reportedSeq;
  return theirs >= 1 && theirs < mine ? theirs : mine;
}

// Only failures that blame another rank are settled into one verdict.
bool settles(const Error& e, int rank) {
  return (e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kPeerLost) && e.peer() >= 0 &&
         e.peer() != rank;
}

// The verdict's order over candidates: the earliest op, then the code, then
// the lowest culprit. Every rank orders the same set of candidates.
bool before(uint64_t seq, ErrorCode code, int culprit, const Error& than) {
  return std::make_tuple(seq, static_cast<int>(code), culprit) <
         std::make_tuple(than.seq(), static_cast<int>(than.code()), than.peer());
}

}  // namespace

std::shared_ptr<const Error> CommunicatorImpl::error() {
  return sticky.get();
}

std::shared_ptr<const Error> CommunicatorImpl::setFailed(const Error& e) {
  bool first = false;
  std::shared_ptr<const Error> held = sticky.set(e, &first);
  if (first) {
    GFLOW_LOG(INFO) << "communicator failed: " << held->what();
  }
  return held;
}

void CommunicatorImpl::notifyOnce(const std::shared_ptr<const Error>& e) {
  if (!backend || notified.exchange(true)) return;
  backend->abort(*e);
  backend->notifyPeers(*e);
}

void CommunicatorImpl::fail(const Error& e) {
  notifyOnce(setFailed(e));
}

Error CommunicatorImpl::settle(const Error& candidate) {
  if (!backend || !settles(candidate, rank) || error() || notified.exchange(true)) {
    fail(candidate);  // failed before (abort(), another thread): as it was
    return candidate;
  }
  // Every peer hears this rank's candidate now, and this rank waits (for at
  // most a probe grace) for every peer's but the culprit's.
  backend->abort(candidate);
  backend->notifyPeers(candidate);
  const auto grace =
      std::clamp(timeout / 4, std::chrono::milliseconds(50), std::chrono::milliseconds(2000));
  Error verdict = candidate;
  for (const Error& r : backend->awaitReports(Deadline::after(grace), candidate.peer())) {
    const ErrorContext& c = r.context();
    if (c.culprit < 0 || c.culprit >= size || c.reportedSeq == 0) continue;
    if (!before(c.reportedSeq, r.code(), c.culprit, verdict)) continue;
    // The peer's account, then what this rank saw itself (the evidence
    // it had, e.g. the transport status, is kept).
    verdict = Error(r.code(), r.detail() + " [this rank saw: " + candidate.detail() + "]",
                    ErrorContext::forOp(candidate.op())
                        .withSeq(c.reportedSeq)
                        .withRank(rank)
                        .withPeer(c.culprit)
                        .withCulprit(c.culprit, c.reportedSeq));
  }
  return *setFailed(verdict);  // an abort() meanwhile stays the error of record
}

void CommunicatorImpl::checkUsable(const char* op) {
  if (auto e = error()) {
    // The original error, so every later call names the root cause.
    (void)op;
    throw *e;
  }
}

namespace {
thread_local int tlsFatalArgumentErrors = 0;  // FatalArgumentErrors alive on this thread
}  // namespace

CommunicatorImpl::FatalArgumentErrors::FatalArgumentErrors() {
  ++tlsFatalArgumentErrors;
}
CommunicatorImpl::FatalArgumentErrors::~FatalArgumentErrors() {
  --tlsFatalArgumentErrors;
}

void CommunicatorImpl::invalid(const char* op, const std::string& what) {
  if (tlsFatalArgumentErrors > 0 || opcheck::isPointToPointCall(op)) failInvalid(op, what);
  Error e(ErrorCode::kInvalidArgument, what, ErrorContext::forOp(op).withRank(rank));
  reject(e);
  throw e;
}

void CommunicatorImpl::failInvalid(const char* op, const std::string& what) {
  Error e(ErrorCode::kInvalidArgument, what, ErrorContext::forOp(op).withRank(rank));
  // A peer may be waiting on this rank: failing the communicator and
  // telling it turns its wait into an immediate error.
  auto first = setFailed(e);
  if (backend) {
    backend->abort(*first);
    executor.tryRunExclusive([&] { notifyOnce(first); });
  }
  throw e;
}

void CommunicatorImpl::reject(const Error& e) {
  if (!backend || error()) return;
  auto task = [this, e] {
    const uint64_t mySeq = ++seq;  // the number this call would have run as
    if (error()) return;
    const Error numbered = relabel(e, ErrorContext::forOp(e.op()).withSeq(mySeq).withRank(rank));
    if (!backend->reject(mySeq, numbered.what())) fail(numbered);
  };
  // Runs here when no op is queued or running, so the peers have heard
  // before the call raises (even if the communicator is destroyed next);
  // else after the earlier ops, without waiting for them.
  executor.runOrQueue(std::move(task));
}

void CommunicatorImpl::validateTensor(const char* op, const char* name, const Tensor& t) {
  if (static_cast<int>(t.dtype) >= kNumDataTypes) {
    invalid(op, std::string(name) + " has an invalid dtype (" +
                    std::to_string(static_cast<int>(t.dtype)) + ")");
  }
  const std::string where = backend::checkPlacement(t);
  if (!where.empty()) invalid(op, name + where);
  if (t.count > 0 && t.data == nullptr) {
    invalid(op, std::string(name) + ".data is null but count is " + std::to_string(t.count));
  }
  if (t.count > (uint64_t(1) << 46) / dataTypeSize(t.dtype)) {
    invalid(op, std::string(name) + ".count " + std::to_string(t.count) + " is too large");
  }
}

void CommunicatorImpl::validateOp(const char* op, ReduceOp rop, DataType dtype) {
  if (static_cast<int>(rop) >= kNumReduceOps) {
    invalid(op, "invalid reduce op (" + std::to_string(static_cast<int>(rop)) + ")");
  }
  if (static_cast<int>(dtype) >= kNumDataTypes || supportsReduceOp(dtype, rop)) return;
  const char* which = dtype == DataType::kBool ? "bool takes every op but avg"
                      : dtype == DataType::kComplex64 || dtype == DataType::kComplex128
                          ? "complex types take sum and avg"
                      : isQuantized(dtype) ? "quantized types take sum, avg, min and max"
                                           : "bitwise ops take integer types and bool";
  invalid(op, std::string("reduce op ") + toString(rop) + " does not apply to " + toString(dtype) +
                  " data (" + which + ")");
}

std::shared_ptr<WorkState> CommunicatorImpl::submit(OpDesc desc, bool blocking,
                                                    std::function<void(const backend::Op&)> body,
                                                    std::shared_ptr<backend::DeviceBuffers> buffers,
                                                    const char* opName) {
  const char* name = opName ? opName : backend::toString(desc.kind);
  checkUsable(name);
  opCount[opIndex(desc.kind)].fetch_add(1, std::memory_order_relaxed);
  auto task = [this, desc, name, body = std::move(body), buffers = std::move(buffers)] {
    // Point-to-point stands outside the collectives' order (only two ranks
    // take part): it carries the last collective's number, for errors.
    const uint64_t mySeq = desc.kind == OpKind::kPointToPoint ? seq : ++seq;
    // Failed by abort() or bad input on another thread: tell the peers now
    // (this is the executing thread) and raise the original error.
    if (auto e = error()) {
      notifyOnce(e);
      throw *e;
    }
    const backend::Op op{mySeq, desc, Deadline::after(timeout), buffers};
    // Point-to-point ops are not the collectives' arrivals.
    struct Arrival {
      Arrivals* a;
      ~Arrival() {
        if (a) a->abandon();  // the op failed (a no-op once ended)
      }
    } arrival{desc.kind == OpKind::kPointToPoint ? nullptr : arrivals.get()};
    if (arrival.a) arrival.a->begin();
    try {
      body(op);
    } catch (const Error& e) {
      Error full = relabel(e, ErrorContext::forOp(name)
                                  .withSeq(reportedOp(e, mySeq))
                                  .withRank(rank)
                                  .withPeer(blamed(e, size)));
      if (desc.kind == OpKind::kPointToPoint) {
        fail(full);
        throw full;
      }
      throw settle(full);
    } catch (const std::exception& e) {
      // E.g. bad_alloc: receives may already be posted into user memory, so
      // the communicator must not be used again.
      Error full(ErrorCode::kInternal, std::string("unexpected exception: ") + e.what(),
                 ErrorContext::forOp(name).withSeq(mySeq).withRank(rank));
      fail(full);
      throw full;
    }
    if (arrival.a) {
      arrival.a->end();
      reportStragglers();
    }
    // abort() may have arrived after the op's last transport call.
    if (auto e = error()) notifyOnce(e);
  };
  return executor.submit(std::move(task), blocking);
}

void CommunicatorImpl::defer(std::unique_ptr<backend::P2PInFlight> op, std::function<void()> done,
                             const char* name) {
  inFlight.push_back(InFlight{std::move(op), std::move(done), executor.deferCurrent(), name});
}

bool CommunicatorImpl::progressInFlight() noexcept {
  for (size_t i = 0; i < inFlight.size();) {
    InFlight& f = inFlight[i];
    std::shared_ptr<const Error> failed;
    try {
      if (!f.op->test()) {
        ++i;
        continue;
      }
      f.done();
    } catch (const Error& e) {
      failed = std::make_shared<const Error>(relabel(
          e, ErrorContext::forOp(f.name).withSeq(seq).withRank(rank).withPeer(blamed(e, size))));
    } catch (const std::exception& e) {
      failed = std::make_shared<const Error>(
          ErrorCode::kInternal, std::string("unexpected exception: ") + e.what(),
          ErrorContext::forOp(f.name).withSeq(seq).withRank(rank));
    }
    if (failed) fail(*failed);
    f.work->finish(failed);
    inFlight.erase(inFlight.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return !inFlight.empty();
}

void CommunicatorImpl::dropInFlight(const Error& e) {
  for (InFlight& f : inFlight) f.work->finish(std::make_shared<const Error>(e));
  inFlight.clear();
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
  impl->executor.setBackground([self = impl.get()] { return self->progressInFlight(); });
  backend::RouterParts parts;
  parts.policy = std::make_shared<const backend::RoutePolicy>(
      settings.algo, settings.algoSource,
      backend::RoutePolicy::Thresholds{settings.rdMaxBytes, settings.hdMaxBytes});
  parts.rank = rank;
  parts.size = size;
  parts.flat =
      backend::createHostBackend(transport::createContext(transportName, ctxOpts), settings.tuning);
  parts.verifyNccl = settings.verifyDeviceOps;
  parts.ncclP2P = settings.ncclP2P;
  impl->backend = std::make_unique<backend::Router>(std::move(parts));
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
  hostIndex = h.host();
  numHosts = h.numHosts;
  localRank = h.localRank();
  localSize = h.localSize();
  if ((launcherLocalRank >= 0 && launcherLocalRank != localRank) ||
      (launcherLocalSize >= 0 && launcherLocalSize != localSize)) {
    GFLOW_LOG(WARN) << "rank " << rank << ": the launcher says local rank " << launcherLocalRank
                    << " of " << launcherLocalSize << ", but host identities ("
                    << "hostname + boot id, or GFLOW_HOST_ID) give " << localRank << " of "
                    << localSize << "; gflow groups ranks by host identity";
  }
  // Contexts made from now on (the host backends', split()'s) know how many
  // ranks share this host's cpus.
  contextOptions.ranksOnHost = localSize;
  transport::ContextOptions hostOpts = ctxOpts;
  hostOpts.ranksOnHost = localSize;
  HostBackends hb = connectHostBackends(h, hostOpts, transportName, backend->policy(), settings);
  backend->attach({std::move(hb.shm), std::move(hb.hierarchical), hb.caps},
                  backend::DeviceSetup{rank, size, ctxOpts.store, ctxOpts.prefix, ctxOpts.timeout,
                                       hostOf, settings.deviceBackend});
}

// ---- Communicator ----------------------------------------------------------

Communicator::~Communicator() = default;

void CommunicatorImpl::reportStragglers() {
  if (rank != 0 || reportEvery <= 0) return;
  const int64_t now = Arrivals::now();
  if (now - lastReport < reportEvery) return;
  const std::string s = arrivals->summary(true);
  if (!s.empty()) {
    std::fprintf(stderr, "gflow straggler report (%d ranks, last %.1f s): %s\n", size,
                 static_cast<double>(TickClock::toNs(now - lastReport)) / 1e9, s.c_str());
  }
  lastReport = now;
}

CommunicatorImpl::~CommunicatorImpl() {
  if (summaryAtExit && rank == 0 && arrivals) {
    try {
      const std::string s = arrivals->summary(false);
      if (!s.empty()) {
        std::fprintf(stderr, "gflow straggler summary (%d ranks): %s\n", size, s.c_str());
      }
    } catch (const std::exception&) {
      // Out of memory at teardown: no summary.
    }
  }
  if (!backend) return;
  Error e(ErrorCode::kAborted, "the communicator was destroyed", ErrorContext().withRank(rank));
  // Wake a running op (if any) and drop queued ones before joining the
  // worker; the transport is going away anyway.
  backend->abort(e);
  executor.shutdown(e);
  dropInFlight(e);
}

namespace {

// Without a job token anyone who reaches the store or a data port can join or
// disrupt the job: an error under GFLOW_REQUIRE_TOKEN=1, else one warning
// (rank 0, once per process).
// `tokenComing`: the PMIx rendezvous will share one (bootstrap::openStore).
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

}  // namespace

std::shared_ptr<Communicator> Communicator::create(const Options& options) {
  const Settings settings = resolveSettings(options);  // before any connection
  bootstrap::Identity id = bootstrap::resolveIdentity(options);
  checkAuthenticated(id, id.pmix && !options.store);
  std::chrono::milliseconds timeout = options.timeout.count() > 0
                                          ? options.timeout
                                          : std::chrono::milliseconds(params::timeoutMs());
  std::shared_ptr<Store> store = options.store;
  if (!store) {
    const std::string ifname =
        !options.tcp.socketIfname.empty() ? options.tcp.socketIfname : params::socketIfname();
    store = bootstrap::openStore(&id, ifname, timeout);
  }
  // Each rank counts the communicators it created on this store; ranks that
  // create them in the same order get the same key prefix.
  const int64_t generation = store->add("gflow/created/" + std::to_string(id.rank), 1);
  transport::ContextOptions co;
  co.rank = id.rank;
  co.size = id.size;
  co.store = store;
  co.prefix = "gflow/w" + std::to_string(generation) + "/";
  co.token = id.token;
  co.timeout = timeout;
  co.tcp = options.tcp;
  co.verbs = options.verbs;
  co.ranksOnHost = id.localSize;  // the launcher's count until host identities are known
  const std::string transportName =
      !options.transport.empty() ? options.transport : params::transport();
  const std::string host =
      !options.hostId.empty() ? options.hostId : bootstrap::hostId(id.launcherHost);
  const uint64_t hostHash = hash::sha256Id(host);
  co.hostHash = hostHash;
  co.localSingleCopy = settings.shm;
  auto impl = CommunicatorImpl::connect(
      {co, transportName, settings, hostHash, id.localRank, id.localSize});
  GFLOW_LOG(INFO) << "rank " << id.rank << "/" << id.size << " ready (host " << impl->hostIndex
                  << "/" << impl->numHosts << ", local " << impl->localRank << "/"
                  << impl->localSize << ", identity from " << id.source << ")";
  return std::shared_ptr<Communicator>(std::move(impl));
}

int Communicator::rank() const {
  return impl(*this).rank;
}
int Communicator::size() const {
  return impl(*this).size;
}
int Communicator::localRank() const {
  return impl(*this).localRank;
}
int Communicator::localSize() const {
  return impl(*this).localSize;
}
int Communicator::hostIndex() const {
  return impl(*this).hostIndex;
}
int Communicator::numHosts() const {
  return impl(*this).numHosts;
}

std::shared_ptr<Communicator> Communicator::localCommunicator() {
  return split(impl(*this).hostIndex, impl(*this).rank);
}

std::shared_ptr<Communicator> Communicator::crossHostCommunicator() {
  return split(impl(*this).localRank, impl(*this).hostIndex);
}

void internal::CommunicatorAccess::failInvalid(Communicator& comm, const char* op,
                                               const std::string& what) {
  impl(comm).failInvalid(op, what);
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  CommunicatorImpl& I = impl(*this);
  I.checkUsable("split");
  std::vector<int64_t> mine{color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(I.size));
  allgather(Tensor(mine.data(), 2, DataType::kInt64),
            Tensor(all.data(), all.size(), DataType::kInt64));
  const uint64_t splitId = I.splitCount++;
  if (color < 0) {
    I.splitBackend(-1, key, nullptr);  // collective over the parent's ranks
    return nullptr;
  }
  std::vector<std::pair<int64_t, int>> members;  // (key, parent rank)
  for (int r = 0; r < I.size; ++r) {
    if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  int newRank = 0;
  std::vector<uint64_t> hosts;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == I.rank) newRank = static_cast<int>(i);
    hosts.push_back(I.hostOf[members[i].second]);
  }
  transport::ContextOptions co = I.contextOptions;
  co.rank = newRank;
  co.size = static_cast<int>(members.size());
  co.prefix = I.contextOptions.prefix + "split" + std::to_string(splitId) + "/c" +
              std::to_string(color) + "/";
  // The sub-communicator inherits the parent's settings.
  auto impl = CommunicatorImpl::connect({co, I.transportName, I.settings, I.hostOf[I.rank]});
  // Where NCCL runs this communicator, the new one gets its part of it
  // (ncclCommSplit) instead of creating its own.
  I.splitBackend(color, key, impl.get());
  return std::shared_ptr<Communicator>(std::move(impl));
}

void CommunicatorImpl::splitBackend(int color, int key, CommunicatorImpl* child) {
  // On the executing thread, after every earlier op: whether NCCL runs this
  // communicator is known there, and the same on every rank.
  auto task = [this, color, key, child] {
    if (auto e = error()) throw *e;
    const backend::Op op{seq, OpDesc{}, Deadline::after(timeout), nullptr};
    try {
      backend->splitInto(op, color, key, child ? child->backend.get() : nullptr);
    } catch (const Error& e) {
      Error full = relabel(
          e, ErrorContext::forOp("split").withSeq(seq).withRank(rank).withPeer(blamed(e, size)));
      fail(full);
      throw full;
    }
  };
  executor.submit(std::move(task), true)->wait(std::chrono::milliseconds(0));
}

void frontend::rejectInvalidArgument(Communicator& comm, const std::string& op,
                                     const std::string& what) {
  // The op name outlives the throw: Error copies it.
  impl(comm).invalid(op.c_str(), what);
}

void Communicator::abort() {
  CommunicatorImpl& I = impl(*this);
  internal::CommunicatorAccess::abortWith(
      *this, Error(ErrorCode::kAborted, "abort() was called on rank " + std::to_string(I.rank),
                   ErrorContext::forOp("abort").withRank(I.rank)));
}

void internal::CommunicatorAccess::abortWith(Communicator& comm, const Error& e) {
  CommunicatorImpl& I = impl(comm);
  auto first = I.setFailed(e);
  if (I.backend) {
    I.backend->abort(*first);
    // Tell the peers now if no op is running; a running op tells them when
    // it unwinds with the abort error.
    I.executor.tryRunExclusive([&] { I.notifyOnce(first); });
  }
}

MemoryRegistration::~MemoryRegistration() = default;

namespace {
class Registration final : public MemoryRegistration {
 public:
  Registration(void* d, size_t n) : MemoryRegistration(d, n) {}
  std::vector<std::unique_ptr<transport::MemoryRegion>> regions;
};
}  // namespace

std::unique_ptr<MemoryRegistration> Communicator::registerMemory(void* data, size_t bytes) {
  if (!data && bytes > 0) {
    GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("register_memory").withRank(impl(*this).rank))
        << "registerMemory of " << bytes << " bytes at a null pointer";
  }
  auto r = std::make_unique<Registration>(data, bytes);
  if (bytes > 0) impl(*this).backend->registerMemory(data, bytes, &r->regions);
  return r;
}

Stats Communicator::stats() const {
  Stats s;
  s.peers.resize(impl(*this).size);
  for (int p = 0; p < impl(*this).size; ++p) {
    if (p != impl(*this).rank) s.peers[p] = impl(*this).backend->peerStats(p);
    const std::vector<uint64_t>& host = impl(*this).hostOf;
    s.peers[p].sameHost =
        host.size() > static_cast<size_t>(p) &&
        host[static_cast<size_t>(p)] == host[static_cast<size_t>(impl(*this).rank)];
  }
  s.allreduce = impl(*this).opCount[opIndex(OpKind::kAllreduce)];
  s.reduceScatter = impl(*this).opCount[opIndex(OpKind::kReduceScatter)];
  s.broadcast = impl(*this).opCount[opIndex(OpKind::kBroadcast)];
  s.barrier = impl(*this).opCount[opIndex(OpKind::kBarrier)];
  s.reduce = impl(*this).opCount[opIndex(OpKind::kReduce)];
  auto count = [&](OpKind a, OpKind b) {
    return impl(*this).opCount[opIndex(a)] + impl(*this).opCount[opIndex(b)];
  };
  s.allgather = count(OpKind::kAllgather, OpKind::kAllgatherv);
  s.gather = count(OpKind::kGather, OpKind::kGatherv);
  s.scatter = count(OpKind::kScatter, OpKind::kScatterv);
  s.alltoall = count(OpKind::kAlltoall, OpKind::kAlltoallv);
  s.pointToPoint = impl(*this).opCount[opIndex(OpKind::kPointToPoint)];
  const backend::PathCounts paths = impl(*this).backend->paths();
  s.sharedMemoryOps = paths.of(backend::Path::kShm);
  s.hierarchicalOps = paths.of(backend::Path::kHierarchical);
  s.networkOps = paths.of(backend::Path::kNetwork);
  s.ncclOps = paths.of(backend::Path::kNccl) + paths.of(backend::Path::kNcclHierarchical);
  s.stagedOps = paths.staged;
  for (const backend::RouteCount& r : impl(*this).backend->routes()) {
    s.routes.push_back({backend::toString(r.kind), backend::toString(r.route.path),
                        backend::toString(r.route.algo), r.ops});
  }
  const Arrivals::Totals t = impl(*this).arrivals->totals();
  for (size_t p = 0; p < t.timesLast.size(); ++p) {
    s.peers[p].timesLast = t.timesLast[p];
    s.peers[p].lateNs = t.lateNs[p];
  }
  s.arrivalOps = t.ops;
  return s;
}

std::string Communicator::stragglerSummary() const {
  return impl(*this).arrivals->summary(false);
}

std::shared_ptr<const Error> Communicator::error() const {
  return impl(*this).error();
}

uint64_t Stats::bytesSent() const {
  uint64_t t = 0;
  for (const auto& p : peers) t += p.bytesSent;
  return t;
}

uint64_t Stats::networkBytesSent() const {
  uint64_t t = 0;
  for (const auto& p : peers) t += p.sameHost ? 0 : p.bytesSent;
  return t;
}

uint64_t Stats::bytesReceived() const {
  uint64_t t = 0;
  for (const auto& p : peers) t += p.bytesReceived;
  return t;
}

}  // namespace gflow
